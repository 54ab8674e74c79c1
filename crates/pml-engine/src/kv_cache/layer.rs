//! [`LayerKv`]: one layer's K and V: rows shared with other caches first ([`KvSegment`]s, never
//! written), then buffers of its own with spare rows, appended in place and copied on write; a
//! sliding-window layer of a spliced cache may leave out the slots before the first one its
//! queries can see.

use std::ops::Range;
use std::sync::Arc;

use candle_core::{Device, Tensor};

use super::{KvCacheError, KvLayout};
pub use pml_kernels::KvSegment;

/// A shared segment and the buffer it keeps alive.
#[derive(Clone, Debug)]
pub(super) struct SharedRows {
    pub(super) segment: KvSegment,
    pub(super) buffer: SharedBuffer,
}

/// A buffer a cache reads, to count its memory once however many caches (or views) read it:
/// `anchor` is a tensor on it (keeping it alive, naming it by its storage), `bytes` what the
/// buffer holds of K and V (views of it may show fewer rows).
#[derive(Clone, Debug)]
pub(crate) struct SharedBuffer {
    pub(super) anchor: Tensor,
    pub(super) bytes: usize,
}

impl SharedBuffer {
    /// K and V `(keys, values)` of one buffer.
    pub(super) fn of(keys: &Tensor, values: &Tensor) -> Self {
        Self {
            anchor: keys.clone(),
            bytes: (keys.elem_count() + values.elem_count()) * keys.dtype().size_in_bytes(),
        }
    }

    /// Who this buffer is among those of every cache alive: the address of its storage (which
    /// cannot be reused while `anchor` holds it) and where in the storage it starts (the layers
    /// of one state may lie in one storage).
    pub(crate) fn id(&self) -> (usize, usize) {
        let (storage, layout) = self.anchor.storage_and_layout();
        (
            std::ptr::from_ref(&*storage) as usize,
            layout.start_offset(),
        )
    }
}

/// One layer of the cache.
#[derive(Clone, Debug)]
pub struct LayerKv {
    layer_idx: usize,
    /// Rows shared with other caches (a prefix cache's blocks, the prompt of forked choices),
    /// holding the first held slots; never written here: a write into one of them copies
    /// every row into buffers of this layer's own first.
    shared: Vec<SharedRows>,
    /// `(rows, kv_heads, head_dim)`: row `r` holds slot `first_held + shared_rows + r`; rows up
    /// to the last slot are live, the others spare.
    pub(super) key_buffer: Tensor,
    pub(super) value_buffer: Tensor,
    /// The position of every slot, held or not.
    pub(super) positions: Vec<u32>,
    /// Slots below this are not held (0 unless a splice left them out, see
    /// [`super::KvCache::from_blocks_for`]); no query at [`Self::horizon`] or later sees them.
    pub(super) first_held: usize,
    /// Rows written here must be at this position or later (0: any).
    pub(super) horizon: u32,
    /// Buffer rows below this may be visible through views taken before a truncation, so they
    /// are never written in place. Views of live rows need no such guard: appends write past
    /// them.
    exposed_rows: usize,
    /// Shared by clones of this layer; a clone must not append into a buffer another owns.
    owner: Arc<()>,
    /// Most slots an append grows the layer to ahead of need (a server's per-sequence
    /// reservation, [`super::KvCache::limit_rows`]); an append needing more still gets what it
    /// needs.
    slot_limit: usize,
}

impl LayerKv {
    pub(super) fn empty(
        layout: &KvLayout,
        device: &Device,
        layer_idx: usize,
    ) -> Result<Self, KvCacheError> {
        let buffer = Tensor::zeros(
            (
                allocated_rows(0, device),
                layout.n_kv_heads,
                layout.head_dim,
            ),
            layout.dtype,
            device,
        )?;
        Ok(Self {
            layer_idx,
            shared: Vec::new(),
            key_buffer: buffer.clone(),
            value_buffer: buffer,
            positions: Vec::new(),
            first_held: 0,
            horizon: 0,
            exposed_rows: 0,
            owner: Arc::new(()),
            slot_limit: usize::MAX,
        })
    }

    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    /// Position of every live slot, held or not.
    pub fn positions(&self) -> &[u32] {
        &self.positions
    }

    /// The first slot this layer holds: 0 unless a splice left out slots no query at
    /// [`Self::horizon`] or later can see.
    pub fn first_held(&self) -> usize {
        self.first_held
    }

    /// The earliest position a row written to this layer may have (0 when every slot is held).
    pub fn horizon(&self) -> u32 {
        self.horizon
    }

    /// Positions of the held slots, `first_held()..len()`: what [`Self::keys`] holds.
    pub fn held_positions(&self) -> &[u32] {
        &self.positions[self.first_held.min(self.len())..]
    }

    fn held_len(&self) -> usize {
        self.len().saturating_sub(self.first_held)
    }

    /// Held slots in rows shared with other caches (they come first).
    pub fn shared_rows(&self) -> usize {
        self.shared.iter().map(|shared| shared.segment.len()).sum()
    }

    /// Held slots in this layer's own buffers.
    fn owned_len(&self) -> usize {
        self.held_len().saturating_sub(self.shared_rows())
    }

    /// The held slots' rows as they are stored: the shared segments, then this layer's own
    /// rows (left out when there are none, unless nothing is shared). What attention reads in
    /// place.
    pub fn segments(&self) -> Result<Vec<KvSegment>, KvCacheError> {
        let owned = self.owned_len();
        let mut segments: Vec<KvSegment> = self
            .shared
            .iter()
            .map(|shared| shared.segment.clone())
            .collect();
        if owned > 0 || segments.is_empty() {
            segments.push(KvSegment {
                keys: self.key_buffer.narrow(0, 0, owned)?,
                values: self.value_buffer.narrow(0, 0, owned)?,
            });
        }
        Ok(segments)
    }

    /// K of every held slot (`first_held()..len()`, all of them unless a splice left some
    /// out), `(n_held, kv_heads, head_dim)`, after RoPE: a view, or a copy where some rows are
    /// shared ([`Self::segments`] reads them in place). It keeps its contents whatever is
    /// written later, so K before and after a recompute can be compared.
    pub fn keys(&self) -> Result<Tensor, KvCacheError> {
        Ok(self.joined()?.0)
    }

    /// V of every held slot, `(n_held, kv_heads, head_dim)` (as [`Self::keys`]).
    pub fn values(&self) -> Result<Tensor, KvCacheError> {
        Ok(self.joined()?.1)
    }

    fn joined(&self) -> Result<(Tensor, Tensor), KvCacheError> {
        let segments = self.segments()?;
        KvSegment::joined(&segments)?.ok_or_else(|| {
            KvCacheError::Shape(format!("layer {} has no rows at all", self.layer_idx))
        })
    }

    /// K and V of held slots `rows` (indices among the held ones), as views where they lie in
    /// one segment.
    pub(super) fn held_rows(&self, rows: Range<usize>) -> Result<(Tensor, Tensor), KvCacheError> {
        let mut start = 0;
        for segment in self.segments()? {
            let end = start + segment.len();
            if start <= rows.start && rows.end <= end {
                let offset = rows.start - start;
                return Ok((
                    segment.keys.narrow(0, offset, rows.len())?,
                    segment.values.narrow(0, offset, rows.len())?,
                ));
            }
            start = end;
        }
        let (keys, values) = self.joined()?;
        Ok((
            keys.narrow(0, rows.start, rows.len())?,
            values.narrow(0, rows.start, rows.len())?,
        ))
    }

    pub(super) fn capacity(&self) -> usize {
        self.first_held + self.shared_rows() + self.key_buffer.dims()[0]
    }

    /// Bytes of this layer's own K and V buffers, spare rows included.
    pub(super) fn allocated_bytes(&self) -> usize {
        SharedBuffer::of(&self.key_buffer, &self.value_buffer).bytes
    }

    /// Every buffer this layer reads: its own (which clones share until one writes) and
    /// those of its shared rows.
    pub(super) fn buffers(&self) -> impl Iterator<Item = SharedBuffer> + '_ {
        let own = SharedBuffer::of(&self.key_buffer, &self.value_buffer);
        std::iter::once(own).chain(self.shared.iter().map(|shared| shared.buffer.clone()))
    }

    pub(super) fn limit_rows(&mut self, slots: usize) {
        self.slot_limit = slots;
    }

    /// Most rows an append grows the own buffers to ahead of need.
    fn row_limit(&self) -> usize {
        self.slot_limit
            .saturating_sub(self.first_held + self.shared_rows())
            .max(1)
    }

    /// Puts `shared` rows (at `positions`) before every slot this layer holds; it must hold
    /// every slot (no splice left any out) and share none yet.
    pub(super) fn prepend_shared(
        &mut self,
        shared: Vec<SharedRows>,
        positions: &[u32],
    ) -> Result<(), KvCacheError> {
        let rows: usize = shared.iter().map(|shared| shared.segment.len()).sum();
        if self.first_held != 0 || !self.shared.is_empty() || rows != positions.len() {
            return Err(KvCacheError::Shape(format!(
                "{rows} shared rows at {} positions before a layer sharing {} and leaving out {}",
                positions.len(),
                self.shared_rows(),
                self.first_held
            )));
        }
        self.shared = shared;
        self.positions.splice(0..0, positions.iter().copied());
        Ok(())
    }

    /// Makes this layer's own rows shared ones, so clones made afterwards read them without a
    /// copy each: the buffer itself where it has no spare rows, else one copy of the live rows
    /// (a view would keep the spare rows alive as long as any clone).
    pub(super) fn share_own_rows(&mut self) -> Result<(), KvCacheError> {
        let owned = self.owned_len();
        if owned == 0 {
            return Ok(());
        }
        let spare = self.key_buffer.dims()[0] > owned;
        let rows = |buffer: &Tensor| -> Result<Tensor, KvCacheError> {
            let live = buffer.narrow(0, 0, owned)?;
            Ok(if spare {
                live.force_contiguous()?
            } else {
                live
            })
        };
        let segment = KvSegment {
            keys: rows(&self.key_buffer)?,
            values: rows(&self.value_buffer)?,
        };
        let buffer = SharedBuffer::of(&segment.keys, &segment.values);
        self.shared.push(SharedRows { segment, buffer });
        let device = self.key_buffer.device().clone();
        let (_, kv_heads, head_dim) = self.key_buffer.dims3()?;
        let empty = Tensor::zeros(
            (allocated_rows(0, &device), kv_heads, head_dim),
            self.key_buffer.dtype(),
            &device,
        )?;
        self.key_buffer = empty.clone();
        self.value_buffer = empty;
        self.owner = Arc::new(());
        self.exposed_rows = 0;
        Ok(())
    }

    /// Copies the shared rows and this layer's own into new buffers of its own (as many rows
    /// as it can hold now), so a shared slot can be written.
    fn own_every_row(&mut self) -> Result<(), KvCacheError> {
        if self.shared.is_empty() {
            return Ok(());
        }
        let (keys, values) = self.joined()?;
        let capacity = self.shared_rows() + self.key_buffer.dims()[0];
        self.key_buffer = reallocate(&keys, keys.dims()[0], capacity)?;
        self.value_buffer = reallocate(&values, values.dims()[0], capacity)?;
        self.shared.clear();
        self.owner = Arc::new(());
        self.exposed_rows = 0;
        Ok(())
    }

    /// The index of `slot` among the held ones (the row of [`Self::keys`]), or why it has none.
    pub(super) fn held_row(&self, slot: usize) -> Result<usize, KvCacheError> {
        slot.checked_sub(self.first_held)
            .ok_or(KvCacheError::NotHeld {
                slot,
                layer_idx: self.layer_idx,
                first_held: self.first_held,
                horizon: self.horizon,
            })
    }

    /// Writes `keys`/`values` rows (`(n, kv_heads, head_dim)`) at `slots`: a slot below `len()`
    /// is overwritten, the others must be `len()`, `len() + 1`, ... in order and are appended.
    pub fn write(
        &mut self,
        slots: &[usize],
        keys: &Tensor,
        values: &Tensor,
        positions: &[u32],
    ) -> Result<(), KvCacheError> {
        let (n_rows, kv_heads, head_dim) = keys.dims3()?;
        let (_, buffer_heads, buffer_dim) = self.key_buffer.dims3()?;
        if keys.dims() != values.dims()
            || n_rows != slots.len()
            || n_rows != positions.len()
            || (kv_heads, head_dim) != (buffer_heads, buffer_dim)
        {
            return Err(KvCacheError::Shape(format!(
                "write of keys {:?}, values {:?} at {} slots with {} positions into rows of \
                 {buffer_heads}x{buffer_dim}",
                keys.dims(),
                values.dims(),
                slots.len(),
                positions.len()
            )));
        }
        if let Some(&position) = positions.iter().find(|&&position| position < self.horizon) {
            return Err(KvCacheError::BeforeHorizon {
                position,
                layer_idx: self.layer_idx,
                horizon: self.horizon,
            });
        }
        let old_len = self.len();
        let mut overwrite_rows = Vec::new();
        let mut append_rows = Vec::new();
        let mut seen = vec![false; old_len + n_rows];
        for (row, &slot) in slots.iter().enumerate() {
            if slot < old_len {
                self.held_row(slot)?;
                overwrite_rows.push(row);
            } else if slot == old_len + append_rows.len() {
                append_rows.push(row);
            } else {
                return Err(KvCacheError::SlotNotContiguous {
                    slot,
                    next_free: old_len + append_rows.len(),
                });
            }
            if std::mem::replace(&mut seen[slot], true) {
                return Err(KvCacheError::DuplicateSlot { slot });
            }
        }
        // Rows read from a store are on the host; the cache may be on a GPU.
        let keys = keys
            .to_device(self.key_buffer.device())?
            .to_dtype(self.key_buffer.dtype())?;
        let values = values
            .to_device(self.value_buffer.device())?
            .to_dtype(self.value_buffer.dtype())?;
        if !append_rows.is_empty() {
            let (new_keys, new_values) = if overwrite_rows.is_empty() {
                (keys.clone(), values.clone())
            } else {
                let rows = row_index(&append_rows, keys.device())?;
                (keys.index_select(&rows, 0)?, values.index_select(&rows, 0)?)
            };
            let new_positions: Vec<u32> = append_rows.iter().map(|&row| positions[row]).collect();
            self.append(&new_keys, &new_values, &new_positions)?;
        }
        if !overwrite_rows.is_empty() {
            let target_slots: Vec<usize> = overwrite_rows.iter().map(|&row| slots[row]).collect();
            let first_owned = self.first_held + self.shared_rows();
            if target_slots.iter().any(|&slot| slot < first_owned) {
                self.own_every_row()?;
            }
            let rows = row_index(&overwrite_rows, keys.device())?;
            let new_keys = keys.index_select(&rows, 0)?;
            let new_values = values.index_select(&rows, 0)?;
            self.overwrite(&target_slots, &new_keys, &new_values)?;
            for (&row, &slot) in overwrite_rows.iter().zip(&target_slots) {
                self.positions[slot] = positions[row];
            }
        }
        Ok(())
    }

    fn append(
        &mut self,
        keys: &Tensor,
        values: &Tensor,
        positions: &[u32],
    ) -> Result<(), KvCacheError> {
        // In buffer rows: the owned ones, then the new.
        let old_len = self.owned_len();
        let needed = old_len + positions.len();
        let rows = self.key_buffer.dims()[0];
        let shared = Arc::strong_count(&self.owner) > 1;
        if needed > rows || shared || self.exposed_rows > old_len {
            // Grow geometrically so decoding costs amortised O(1) copies per token, never past
            // the limit ahead of need; a copy on write keeps the capacity it had.
            let rows = if needed > rows {
                needed.max((2 * rows).max(64).min(self.row_limit()))
            } else {
                rows
            };
            self.key_buffer = reallocate(&self.key_buffer, old_len, rows)?;
            self.value_buffer = reallocate(&self.value_buffer, old_len, rows)?;
            self.owner = Arc::new(());
            self.exposed_rows = 0;
        }
        self.key_buffer.slice_set(&keys.contiguous()?, 0, old_len)?;
        self.value_buffer
            .slice_set(&values.contiguous()?, 0, old_len)?;
        self.positions.extend_from_slice(positions);
        Ok(())
    }

    /// Copy-on-write: earlier views of these slots keep their old contents.
    fn overwrite(
        &mut self,
        slots: &[usize],
        keys: &Tensor,
        values: &Tensor,
    ) -> Result<(), KvCacheError> {
        let (n_rows, kv_heads, head_dim) = keys.dims3()?;
        // The caller made every row its own first.
        let shared_rows = self.shared_rows();
        let slot_ids = slots
            .iter()
            .map(|&slot| Ok((self.held_row(slot)? - shared_rows) as u32))
            .collect::<Result<Vec<u32>, KvCacheError>>()?;
        let index = Tensor::from_vec(slot_ids, (n_rows, 1, 1), keys.device())?
            .broadcast_as((n_rows, kv_heads, head_dim))?
            .contiguous()?;
        self.key_buffer = self.key_buffer.scatter(&index, keys, 0)?;
        self.value_buffer = self.value_buffer.scatter(&index, values, 0)?;
        self.owner = Arc::new(());
        self.exposed_rows = 0;
        Ok(())
    }

    /// [`Self::truncate`] of slots this layer's own buffer holds past every shared row, when no
    /// view of their rows outlives the call: later appends write over them in place.
    pub(super) fn rollback(&mut self, len: usize) {
        let first_owned = self.first_held + self.shared_rows();
        if len >= first_owned && len < self.len() && self.exposed_rows <= len - first_owned {
            self.positions.truncate(len);
        } else {
            self.truncate(len);
        }
    }

    pub(super) fn truncate(&mut self, len: usize) {
        if len < self.len() {
            // Views of the dropped rows may still be alive; never append over them in place.
            self.exposed_rows = self.exposed_rows.max(self.owned_len());
            // Shared rows past the end are dropped from the segments, which stay views.
            let mut kept = len.saturating_sub(self.first_held);
            self.shared.retain_mut(|SharedRows { segment, .. }| {
                let rows = segment.len().min(kept);
                kept -= rows;
                if rows < segment.len() {
                    // A narrowing within bounds cannot fail.
                    if let (Ok(keys), Ok(values)) = (
                        segment.keys.narrow(0, 0, rows),
                        segment.values.narrow(0, 0, rows),
                    ) {
                        *segment = KvSegment { keys, values };
                    }
                }
                rows > 0
            });
            self.positions.truncate(len);
            // No held slot is left: the buffer's first row is the next slot.
            self.first_held = self.first_held.min(len);
        }
    }
}

/// Rows to allocate for a buffer of `rows`: CUDA's allocator refuses zero bytes
/// (`cuMemAlloc`'s `CUDA_ERROR_INVALID_VALUE`), so an empty buffer off the CPU holds one spare row.
pub(super) fn allocated_rows(rows: usize, device: &Device) -> usize {
    if device.is_cpu() { rows } else { rows.max(1) }
}

pub(super) fn row_index(rows: &[usize], device: &Device) -> Result<Tensor, KvCacheError> {
    let rows: Vec<u32> = rows.iter().map(|&row| row as u32).collect();
    let n_rows = rows.len();
    Ok(Tensor::from_vec(rows, n_rows, device)?)
}
/// A new buffer of `capacity` rows holding the first `live_rows` rows of `buffer`.
fn reallocate(buffer: &Tensor, live_rows: usize, capacity: usize) -> Result<Tensor, KvCacheError> {
    let (_, kv_heads, head_dim) = buffer.dims3()?;
    let fresh = Tensor::zeros(
        (capacity, kv_heads, head_dim),
        buffer.dtype(),
        buffer.device(),
    )?;
    if live_rows > 0 {
        fresh.slice_set(&buffer.narrow(0, 0, live_rows)?.contiguous()?, 0, 0)?;
    }
    Ok(fresh)
}
