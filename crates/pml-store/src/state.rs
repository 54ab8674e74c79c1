//! [`ModuleState`], what the store keeps for one unit (its KV block and tokens, or one layer's KV
//! or input hidden states: see [`StateKind`]), the [`StateSpec`] a store is opened for (model
//! fingerprint, KV layout, stored dtype), and the state's byte form: a safetensors file with
//! tensors `layers.{i}.k`, `layers.{i}.v` (`(n_tokens, kv_heads, head_dim)`) for the layers it
//! holds or `layers.{i}.hidden` (`(n_tokens, d_model)`), all of the stored dtype, `tokens` and
//! `positions` (u32), and metadata naming the format version, kind, layer, key, model
//! fingerprint, stored dtype (`dtype`), the engine's KV dtype (`kv_dtype`), layout and a sealed
//! checksum (see [`super::checksum`]).
//!
//! States are stored in f16 by default ([`DEFAULT_STATE_DTYPE`]) while the engine computes and
//! caches KV in f32: half the bytes to read, verify and move, for a rounding of about 2^-11
//! relative per value (see docs/architecture.md, "Stored states"). A store opened for f32 keeps
//! states exact. The stored dtype is part of the key, so the two never meet under one key; a file
//! of the other dtype read under a key anyway (copied by hand) is [`StoreError::Mismatch`], never
//! converted behind the caller's back.
//!
//! Decoding trusts nothing: every metadata entry, tensor name, dtype and shape is checked, so a
//! truncated file, a flipped byte or a file for another model is an error, never a panic or a
//! silently wrong state. A state for another model or layout is [`StoreError::Mismatch`] (the file
//! is fine, just not ours); anything else wrong is [`StoreError::Malformed`].

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::ops::Range;

use candle_core::safetensors::Load;
use candle_core::{DType, Device, Tensor};
use safetensors::tensor::{Dtype as SafeDtype, SafeTensors, View};

use super::StoreError;
use super::checksum::{self, CHECKSUM_FIELD};
use super::key::{KeepFraction, STORE_FORMAT_VERSION, StateKind, StoreKey};
use pml_engine::kv_cache::{KvBlock, KvLayout, SharedBytes};

/// The dtype states are stored in unless the store is opened for another
/// ([`super::StoreConfig::state_dtype`]).
pub const DEFAULT_STATE_DTYPE: DType = DType::F16;

/// What a store holds states for: one model's fingerprint and the shape of its KV, and the dtype
/// states are stored (and kept in RAM) in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StateSpec {
    pub model_fingerprint: String,
    /// The engine's KV layout; `layout.dtype` is the dtype KV is computed and cached in.
    pub layout: KvLayout,
    /// The dtype of stored K, V and hidden states (f16 or f32; bf16 is readable too).
    pub state_dtype: DType,
}

impl StateSpec {
    /// A spec storing states in [`DEFAULT_STATE_DTYPE`].
    pub fn new(model_fingerprint: impl Into<String>, layout: KvLayout) -> Self {
        Self {
            model_fingerprint: model_fingerprint.into(),
            layout,
            state_dtype: DEFAULT_STATE_DTYPE,
        }
    }

    pub fn with_state_dtype(self, state_dtype: DType) -> Self {
        Self {
            state_dtype,
            ..self
        }
    }
}

/// One unit's stored state: its KV (every layer, or one) or one layer's input hidden states, and
/// the tokens it was computed for. Positions live in the [`KvBlock`] only (a block of no layers
/// for hidden states), so they cannot disagree with it.
#[derive(Clone, Debug)]
pub struct ModuleState {
    kind: StateKind,
    kv: KvBlock,
    hidden: Option<Tensor>,
    tokens: Vec<u32>,
}

impl ModuleState {
    /// Pairs a block of every layer with its tokens, one token per KV row.
    pub fn new(kv: KvBlock, tokens: Vec<u32>) -> Result<Self, StoreError> {
        Self::build(StateKind::Kv, kv, None, tokens)
    }

    /// A compressed unit's heavy-hitter rows (every layer) with their tokens: `kv` holds the
    /// kept rows at their positions, `tokens` their tokens.
    pub fn kv_kept(keep: KeepFraction, kv: KvBlock, tokens: Vec<u32>) -> Result<Self, StoreError> {
        Self::build(StateKind::KvKept(keep), kv, None, tokens)
    }

    /// One layer's K and V `(n_tokens, kv_heads, head_dim)` at `positions`.
    pub fn kv_layer(
        layer: u16,
        keys: Tensor,
        values: Tensor,
        positions: Vec<u32>,
        tokens: Vec<u32>,
    ) -> Result<Self, StoreError> {
        let kv = KvBlock::new(vec![(keys, values)], positions)?;
        Self::build(StateKind::KvLayer(layer), kv, None, tokens)
    }

    /// One layer's input hidden states `(n_tokens, d_model)` of tokens at `positions`.
    pub fn hidden_layer(
        layer: u16,
        hidden: Tensor,
        positions: Vec<u32>,
        tokens: Vec<u32>,
    ) -> Result<Self, StoreError> {
        let rows = hidden.dims2()?.0;
        if rows != positions.len() {
            return Err(StoreError::Malformed(format!(
                "hidden states of {rows} rows for {} positions",
                positions.len()
            )));
        }
        let kv = KvBlock::new(Vec::new(), positions)?;
        Self::build(StateKind::HiddenLayer(layer), kv, Some(hidden), tokens)
    }

    fn build(
        kind: StateKind,
        kv: KvBlock,
        hidden: Option<Tensor>,
        tokens: Vec<u32>,
    ) -> Result<Self, StoreError> {
        if tokens.len() != kv.len() {
            return Err(StoreError::Malformed(format!(
                "{} tokens for a state of {} rows",
                tokens.len(),
                kv.len()
            )));
        }
        Ok(Self {
            kind,
            kv,
            hidden,
            tokens,
        })
    }

    pub fn kind(&self) -> StateKind {
        self.kind
    }

    /// The input hidden states of a [`StateKind::HiddenLayer`] state.
    pub fn hidden(&self) -> Option<&Tensor> {
        self.hidden.as_ref()
    }

    pub fn kv(&self) -> &KvBlock {
        &self.kv
    }

    pub fn into_kv(self) -> KvBlock {
        self.kv
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn positions(&self) -> &[u32] {
        self.kv.positions()
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Bytes of K, V, hidden states, tokens and positions: what the RAM tier charges against its
    /// budget.
    pub fn size_in_bytes(&self) -> usize {
        let hidden = self.hidden.as_ref().map_or(0, |hidden| {
            hidden.elem_count() * hidden.dtype().size_in_bytes()
        });
        self.kv.size_in_bytes() + hidden + 2 * std::mem::size_of::<u32>() * self.tokens.len()
    }

    /// The same state with K, V and hidden states in `dtype` (itself, cheaply, when it already is):
    /// what a store of that dtype keeps.
    pub fn to_dtype(&self, dtype: DType) -> Result<Self, StoreError> {
        let hidden_dtype = self.hidden.as_ref().map(Tensor::dtype);
        if (self.kv.n_layers() == 0 || self.kv.dtype() == Some(dtype))
            && hidden_dtype.is_none_or(|hidden_dtype| hidden_dtype == dtype)
        {
            // A state read from a file stays on the file's bytes.
            return Ok(self.clone());
        }
        self.map_tensors(|tensor| tensor.to_dtype(dtype))
    }

    /// The same state with its tensors on `device`. On the CPU nothing moves (a state read from
    /// a file stays on the file's bytes).
    pub fn to_device(&self, device: &Device) -> Result<Self, StoreError> {
        if device.is_cpu() {
            return Ok(self.clone());
        }
        self.map_tensors(|tensor| tensor.to_device(device))
    }

    /// The same state with `f` applied to every K, V and hidden tensor.
    fn map_tensors(
        &self,
        f: impl Fn(&Tensor) -> candle_core::Result<Tensor>,
    ) -> Result<Self, StoreError> {
        let layers = self
            .kv
            .layers()?
            .iter()
            .map(|(keys, values)| Ok((f(keys)?, f(values)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        let hidden = self.hidden.as_ref().map(&f).transpose()?;
        Ok(Self {
            kind: self.kind,
            kv: KvBlock::new(layers, self.kv.positions().to_vec())?,
            hidden,
            tokens: self.tokens.clone(),
        })
    }

    /// The layers a state of `kind` holds K/V for, in a store of `layout`.
    fn kv_layers(kind: StateKind, layout: &KvLayout) -> Vec<usize> {
        match kind {
            StateKind::Kv | StateKind::KvKept(_) => (0..layout.n_layers).collect(),
            StateKind::KvLayer(layer) => vec![usize::from(layer)],
            StateKind::HiddenLayer(_) => Vec::new(),
        }
    }

    /// Checks that the state has the spec's layout and stored dtype.
    pub fn check_spec(&self, spec: &StateSpec) -> Result<(), StoreError> {
        let layout = &spec.layout;
        if let Some(layer) = self.kind.layer()
            && layer >= layout.n_layers
        {
            return Err(StoreError::mismatch(
                "layer index below",
                layout.n_layers,
                layer,
            ));
        }
        if let Some(hidden) = &self.hidden {
            let (rows, _) = hidden.dims2()?;
            if rows != self.len() || hidden.dtype() != spec.state_dtype {
                return Err(StoreError::mismatch(
                    "hidden states",
                    format!("{} rows of {}", self.len(), spec.state_dtype.as_str()),
                    format!("{rows} rows of {}", hidden.dtype().as_str()),
                ));
            }
        }
        let expected_layers = Self::kv_layers(self.kind, layout).len();
        if self.kv.n_layers() != expected_layers {
            return Err(StoreError::mismatch(
                "number of layers",
                expected_layers,
                self.kv.n_layers(),
            ));
        }
        // Every layer of a block has the same row shape and dtype, one row per position.
        if let Some(row_shape) = self.kv.row_shape() {
            let expected = (layout.n_kv_heads, layout.head_dim);
            if row_shape != expected {
                return Err(StoreError::mismatch(
                    "KV rows (kv heads, head dim)",
                    format!("{expected:?}"),
                    format!("{row_shape:?}"),
                ));
            }
            if self.kv.dtype() != Some(spec.state_dtype) {
                return Err(StoreError::mismatch(
                    "state dtype",
                    spec.state_dtype.as_str(),
                    self.kv.dtype().map_or("several", |dtype| dtype.as_str()),
                ));
            }
        }
        Ok(())
    }

    /// The state as a sealed safetensors file for `key`.
    pub fn to_safetensors(&self, key: &StoreKey, spec: &StateSpec) -> Result<Vec<u8>, StoreError> {
        self.check_spec(spec)?;
        let layout = &spec.layout;
        let mut tensors = Vec::with_capacity(2 * layout.n_layers + 2);
        let layer_ids = Self::kv_layers(self.kind, layout);
        for (&layer_idx, (keys, values)) in layer_ids.iter().zip(self.kv.layers()?) {
            tensors.push((
                format!("layers.{layer_idx}.k"),
                RawTensor::from_tensor(keys)?,
            ));
            tensors.push((
                format!("layers.{layer_idx}.v"),
                RawTensor::from_tensor(values)?,
            ));
        }
        if let (Some(hidden), Some(layer_idx)) = (&self.hidden, self.kind.layer()) {
            tensors.push((
                format!("layers.{layer_idx}.hidden"),
                RawTensor::from_tensor(hidden)?,
            ));
        }
        tensors.push(("tokens".to_string(), RawTensor::from_u32s(&self.tokens)));
        tensors.push((
            "positions".to_string(),
            RawTensor::from_u32s(self.positions()),
        ));
        let mut metadata = HashMap::from([
            (
                "format_version".to_string(),
                STORE_FORMAT_VERSION.to_string(),
            ),
            ("kind".to_string(), self.kind.name().to_string()),
            ("key".to_string(), key.to_string()),
            (
                "model_fingerprint".to_string(),
                spec.model_fingerprint.clone(),
            ),
            ("dtype".to_string(), spec.state_dtype.as_str().to_string()),
            ("kv_dtype".to_string(), layout.dtype.as_str().to_string()),
            ("n_layers".to_string(), layout.n_layers.to_string()),
            ("n_kv_heads".to_string(), layout.n_kv_heads.to_string()),
            ("head_dim".to_string(), layout.head_dim.to_string()),
            ("n_tokens".to_string(), self.len().to_string()),
            (CHECKSUM_FIELD.to_string(), checksum::placeholder()),
        ]);
        if let Some(layer_idx) = self.kind.layer() {
            metadata.insert("layer".to_string(), layer_idx.to_string());
        }
        if let Some(keep) = self.kind.keep() {
            metadata.insert("keep_per_mille".to_string(), keep.per_mille().to_string());
        }
        if let Some(hidden) = &self.hidden {
            metadata.insert("hidden_dim".to_string(), hidden.dims2()?.1.to_string());
        }
        let mut bytes = safetensors::serialize(tensors, Some(metadata))
            .map_err(|error| StoreError::Malformed(format!("cannot serialise: {error}")))?;
        checksum::seal(&mut bytes)?;
        Ok(bytes)
    }

    /// Decodes and checks a file written by [`Self::to_safetensors`] for `key` and `spec`, after
    /// verifying the whole file's checksum. K and V stay in `bytes` (a memory map of the file,
    /// on disk): the state keeps them alive and a splice converts them straight into the KV
    /// cache; tokens, positions and hidden states are copied out.
    pub fn from_safetensors(
        shared: SharedBytes,
        key: &StoreKey,
        spec: &StateSpec,
    ) -> Result<Self, StoreError> {
        let bytes: &[u8] = (*shared).as_ref();
        let malformed = |what: String| StoreError::Malformed(what);
        let (_, header) = SafeTensors::read_metadata(bytes)
            .map_err(|error| malformed(format!("bad safetensors header: {error}")))?;
        let empty = HashMap::new();
        let metadata = Metadata(header.metadata().as_ref().unwrap_or(&empty));
        // The version first: a file of an older format lacks this format's checksum field, and
        // "re-encode" says more than "no checksum_xxh3".
        let version = metadata.get("format_version")?;
        if version != STORE_FORMAT_VERSION.to_string() {
            return Err(malformed(format!(
                "written in store format {version}, this build reads format \
                 {STORE_FORMAT_VERSION} (f16 states, XXH3 checksums): re-encode it with \
                 `pml compile`"
            )));
        }
        checksum::verify(bytes)?;
        let tensors = SafeTensors::deserialize(bytes)
            .map_err(|error| malformed(format!("bad safetensors file: {error}")))?;
        let kind = metadata.kind()?;
        metadata.check_written_for(key, spec)?;
        let n_tokens = metadata.get_usize("n_tokens")?;

        let layout = &spec.layout;
        if let Some(layer_idx) = kind.layer()
            && layer_idx >= layout.n_layers
        {
            return Err(malformed(format!(
                "layer {layer_idx} of {}",
                layout.n_layers
            )));
        }
        let layer_ids = Self::kv_layers(kind, layout);
        let hidden_name = match kind {
            StateKind::HiddenLayer(layer_idx) => Some(format!("layers.{layer_idx}.hidden")),
            _ => None,
        };
        check_names(&tensors, &layer_ids, hidden_name.as_deref())?;
        let tokens = read_u32s(&tensors, "tokens", n_tokens)?;
        let positions = read_u32s(&tensors, "positions", n_tokens)?;
        let row_shape = [n_tokens, layout.n_kv_heads, layout.head_dim];
        let ranges = layer_ids
            .iter()
            .map(|layer_idx| {
                let range =
                    |name: String| kv_range(&tensors, bytes, &name, row_shape, spec.state_dtype);
                Ok((
                    range(format!("layers.{layer_idx}.k"))?,
                    range(format!("layers.{layer_idx}.v"))?,
                ))
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let hidden = match &hidden_name {
            Some(name) => {
                let width = metadata.get_usize("hidden_dim")?;
                Some(read_tensor(
                    &tensors,
                    name,
                    &[n_tokens, width],
                    spec.state_dtype,
                )?)
            }
            None => None,
        };
        let kv = KvBlock::from_bytes(
            shared.clone(),
            spec.state_dtype,
            (layout.n_kv_heads, layout.head_dim),
            ranges,
            positions,
        )
        .map_err(|error| malformed(format!("inconsistent KV: {error}")))?;
        Self::build(kind, kv, hidden, tokens)
    }
}

/// Whether the file holds exactly the tensors of its kind: K and V of `layer_ids`, the hidden
/// states where it has them, tokens and positions.
fn check_names(
    tensors: &SafeTensors<'_>,
    layer_ids: &[usize],
    hidden_name: Option<&str>,
) -> Result<(), StoreError> {
    let expected: HashSet<String> = layer_ids
        .iter()
        .flat_map(|layer_idx| {
            [
                format!("layers.{layer_idx}.k"),
                format!("layers.{layer_idx}.v"),
            ]
        })
        .chain(hidden_name.map(str::to_string))
        .chain(["tokens".to_string(), "positions".to_string()])
        .collect();
    let names: HashSet<String> = tensors.names().into_iter().map(str::to_string).collect();
    if names != expected {
        let mut unexpected: Vec<_> = names.symmetric_difference(&expected).collect();
        unexpected.sort();
        return Err(StoreError::Malformed(format!(
            "tensor names differ from the format: {unexpected:?}"
        )));
    }
    Ok(())
}

/// The `__metadata__` map, with typed lookups that fail as [`StoreError::Malformed`].
struct Metadata<'a>(&'a HashMap<String, String>);

impl Metadata<'_> {
    /// The state's kind: `kind`, with the layer and kept fraction where it has them.
    fn kind(&self) -> Result<StateKind, StoreError> {
        let malformed = |what: &str| StoreError::Malformed(what.to_string());
        let kind_name = self.get("kind")?;
        let layer = match self.0.get("layer") {
            Some(_) => Some(
                u16::try_from(self.get_usize("layer")?)
                    .map_err(|_| malformed("layer index out of range"))?,
            ),
            None => None,
        };
        let keep = match self.0.get("keep_per_mille") {
            Some(_) => Some(
                u16::try_from(self.get_usize("keep_per_mille")?)
                    .map_err(|_| malformed("keep fraction out of range"))?,
            ),
            None => None,
        };
        StateKind::parse(kind_name, layer, keep)
            .ok_or_else(|| StoreError::Malformed(format!("holds unknown `{kind_name}` state")))
    }

    /// Whether the file was written for `key` with `spec`'s model, dtypes and KV layout.
    fn check_written_for(&self, key: &StoreKey, spec: &StateSpec) -> Result<(), StoreError> {
        let layout = &spec.layout;
        let fingerprint = self.get("model_fingerprint")?;
        if fingerprint != spec.model_fingerprint {
            return Err(StoreError::mismatch(
                "model",
                &spec.model_fingerprint,
                fingerprint,
            ));
        }
        let kv_dtype = self.get("kv_dtype")?;
        if kv_dtype != layout.dtype.as_str() {
            return Err(StoreError::mismatch(
                "KV dtype",
                layout.dtype.as_str(),
                kv_dtype,
            ));
        }
        let dtype = self.get("dtype")?;
        if dtype != spec.state_dtype.as_str() {
            return Err(StoreError::mismatch(
                "state dtype",
                spec.state_dtype.as_str(),
                dtype,
            ));
        }
        let found_layout = [
            self.get_usize("n_layers")?,
            self.get_usize("n_kv_heads")?,
            self.get_usize("head_dim")?,
        ];
        let expected_layout = [layout.n_layers, layout.n_kv_heads, layout.head_dim];
        if found_layout != expected_layout {
            return Err(StoreError::mismatch(
                "KV layout (layers, kv heads, head dim)",
                format!("{expected_layout:?}"),
                format!("{found_layout:?}"),
            ));
        }
        let stored_key = self.get("key")?;
        if stored_key != key.as_str() {
            return Err(StoreError::Malformed(format!(
                "holds key {stored_key}, expected {key}"
            )));
        }
        Ok(())
    }

    fn get(&self, name: &str) -> Result<&str, StoreError> {
        self.0
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| StoreError::Malformed(format!("metadata lacks `{name}`")))
    }

    fn get_usize(&self, name: &str) -> Result<usize, StoreError> {
        let text = self.get(name)?;
        text.parse().map_err(|_| {
            StoreError::Malformed(format!("metadata `{name}` is `{text}`, not a count"))
        })
    }
}

fn read_u32s(tensors: &SafeTensors<'_>, name: &str, len: usize) -> Result<Vec<u32>, StoreError> {
    let view = tensor_view(tensors, name)?;
    if view.dtype() != SafeDtype::U32 || view.shape() != [len] {
        return Err(StoreError::Malformed(format!(
            "`{name}` is {:?} {:?}, expected U32 [{len}]",
            view.dtype(),
            view.shape()
        )));
    }
    Ok(view
        .data()
        .chunks_exact(4)
        .map(|chunk| u32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
        .collect())
}

/// Where tensor `name`, checked to be of `dtype` and `shape`, lies in `bytes` (the file).
fn kv_range(
    tensors: &SafeTensors<'_>,
    bytes: &[u8],
    name: &str,
    shape: [usize; 3],
    dtype: DType,
) -> Result<Range<usize>, StoreError> {
    let view = checked_view(tensors, name, &shape, dtype)?;
    let data = view.data();
    // The view borrows `bytes`: its offset is where its slice starts within them.
    let start = (data.as_ptr() as usize)
        .checked_sub(bytes.as_ptr() as usize)
        .filter(|start| start + data.len() <= bytes.len())
        .ok_or_else(|| StoreError::Malformed(format!("`{name}` lies outside the file")))?;
    Ok(start..start + data.len())
}

/// Tensor `name`, checked to be of `dtype` and `shape`, copied onto the CPU.
fn read_tensor(
    tensors: &SafeTensors<'_>,
    name: &str,
    shape: &[usize],
    dtype: DType,
) -> Result<Tensor, StoreError> {
    Ok(checked_view(tensors, name, shape, dtype)?.load(&Device::Cpu)?)
}

fn checked_view<'data>(
    tensors: &SafeTensors<'data>,
    name: &str,
    shape: &[usize],
    dtype: DType,
) -> Result<safetensors::tensor::TensorView<'data>, StoreError> {
    let view = tensor_view(tensors, name)?;
    if view.dtype() != SafeDtype::from(dtype) || view.shape() != shape {
        return Err(StoreError::Malformed(format!(
            "`{name}` is {:?} {:?}, expected {dtype:?} {shape:?}",
            view.dtype(),
            view.shape()
        )));
    }
    Ok(view)
}

fn tensor_view<'data>(
    tensors: &SafeTensors<'data>,
    name: &str,
) -> Result<safetensors::tensor::TensorView<'data>, StoreError> {
    tensors
        .tensor(name)
        .map_err(|error| StoreError::Malformed(format!("tensor `{name}`: {error}")))
}

/// A tensor's little-endian bytes, ready for `safetensors::serialize`. Our own type rather than
/// candle's `View for Tensor`, whose byte conversion panics on failure.
struct RawTensor {
    dtype: SafeDtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

impl RawTensor {
    fn from_tensor(tensor: &Tensor) -> Result<Self, StoreError> {
        let flat = tensor.flatten_all()?;
        let data: Vec<u8> = match tensor.dtype() {
            DType::F32 => flat
                .to_vec1::<f32>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            DType::F16 => flat
                .to_vec1::<half::f16>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            DType::BF16 => flat
                .to_vec1::<half::bf16>()?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect(),
            other => {
                return Err(StoreError::Unsupported(format!(
                    "KV of dtype {} cannot be stored (f32, f16 and bf16 can)",
                    other.as_str()
                )));
            }
        };
        Ok(Self {
            dtype: tensor.dtype().into(),
            shape: tensor.dims().to_vec(),
            data,
        })
    }

    fn from_u32s(values: &[u32]) -> Self {
        Self {
            dtype: SafeDtype::U32,
            shape: vec![values.len()],
            data: values
                .iter()
                .flat_map(|value| value.to_le_bytes())
                .collect(),
        }
    }
}

impl View for RawTensor {
    fn dtype(&self) -> SafeDtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.data)
    }

    fn data_len(&self) -> usize {
        self.data.len()
    }
}
