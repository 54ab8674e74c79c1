//! Our own quantized matrix × rows products, for every row count: one decode token, the few
//! new tokens of a cached prompt, a recompute set, a prefill chunk. The matrix stays in GGML's
//! blocks (no dense copy); the activations are quantized once per call (8-bit blocks of 32 for
//! Q8_0 / Q5_0, of 256 for the K-quants); candle's persistent worker pool splits the output
//! rows into items; each item walks the activation rows in tiles of [`TILE`], and each weight
//! row is unpacked once per tile and multiplied with all its rows (llamafile's tinyBLAS and
//! GGML's x86 kernels do the same), so many rows cost less per row than one.
//!
//! - `blocks`: Q8_0 / Q5_0 / Q4_1 layouts (Q4_0 becomes Q5_0 without loss), their
//!   activations, scalar reference dots.
//! - `kquants`: Q4_K / Q6_K layouts, Q8_K activations, scalar reference dots.
//! - `interleaved`, `interleaved_q4_1`, `interleaved_q8`, `interleaved_kquants`,
//!   `interleaved_q6k`: Q5_0 (and Q4_0 as Q5_0), Q4_1, Q8_0, Q4_K and Q6_K interleaved by eight
//!   output rows; `interleaved_product` their products.
//! - `avx2`, `avx2_kquants`, `avx2_interleaved` (Q5_0, Q4_1 and Q8_0 panels),
//!   `avx2_interleaved_kquants` (Q4_K and Q6_K panels): the SIMD tiles, `unsafe` behind run-time
//!   CPU-feature detection.
//! - `kernel`: one trait over the four row-by-row block types, dispatching to SIMD or scalar.
//! - `panels`: products of many rows as f32 gemm on dequantized panels of the matrix.

mod avx2;
mod avx2_interleaved;
mod avx2_interleaved_kquants;
mod avx2_kquants;
mod blocks;
mod interleaved;
mod interleaved_kquants;
mod interleaved_product;
mod interleaved_q4_1;
mod interleaved_q6k;
mod interleaved_q8;
mod kernel;
mod kquants;
mod mac;
mod panels;

use std::sync::Mutex;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use self::blocks::{
    GROUP, GroupQ4_1, GroupQ5_0, GroupQ8_0, Q4_0_BYTES, Q4_1_BYTES, Q5_0_BYTES, Q8_0_BYTES,
    q4_0_as_q5_0,
};
use self::interleaved::{PANEL, PanelQ5_0, interleave};
use self::interleaved_kquants::{PanelQ4K, interleave_q4k};
use self::interleaved_product::{PanelKernel, multiply_interleaved};
use self::interleaved_q4_1::{PanelQ4_1, interleave_q4_1};
use self::interleaved_q6k::{PanelQ6K, interleave_q6k};
use self::interleaved_q8::{PanelQ8_0, interleave_q8_0};
use self::kernel::{BlockKernel, TILE};
use self::kquants::{BlockQ4K, BlockQ6K, Q4K_BYTES, Q6K_BYTES};
use self::panels::multiply_by_panels;
use super::KernelError;
use crate::memory::huge_pages::collect_on_huge_pages;
use crate::memory::mapped::{MappedSlice, Slab};

/// Output rows one work item computes: large enough that handing out items costs little,
/// small enough that the two workers finish together and an item's weights stay in L2.
const ROWS_PER_ITEM: usize = 32;

/// Row count from which a product dequantizes panels of the matrix and runs the f32 gemm on
/// them ([`multiply_by_panels`]) instead of the quantized tiles: where the f32 kernels, with
/// the dequantization amortized over the rows, overtake ours (`examples/kernel_probe`).
pub const PANEL_MIN_ROWS: usize = 64;

/// The same threshold for interleaved Q5_0, whose tiles run at about 1.4–1.8× the row-by-row
/// ones and stay ahead of the f32 gemm up to a few hundred rows.
pub const INTERLEAVED_PANEL_MIN_ROWS: usize = 256;

/// Row count from which products with interleaved panels dequantize and run the f32 gemm:
/// [`INTERLEAVED_PANEL_MIN_ROWS`] with the AVX2 tiles; never with the AVX-512 VNNI ones, which
/// multiply at about twice the f32 gemm's rate at every row count (`examples/kernel_probe`,
/// docs/results/history.md, "AVX-512 VNNI tiles").
fn interleaved_panel_min_rows() -> usize {
    if crate::cpu_features::avx512_vnni() {
        usize::MAX
    } else {
        INTERLEAVED_PANEL_MIN_ROWS
    }
}

/// Every item of `items`, in a buffer on huge pages.
fn on_huge_pages<T>(items: impl ExactSizeIterator<Item = T>) -> Vec<T> {
    collect_on_huge_pages(items.len(), items)
}

/// A weight matrix `(out_features, in_features)` of blocks our kernels multiply.
#[derive(Debug)]
pub struct QuantMatrix {
    blocks: Blocks,
    out_features: usize,
    in_features: usize,
    /// Weights per stored row: `in_features`, or for rows that are not whole groups of four
    /// blocks (SmolLM2's 576 = 18 blocks) the next whole group, the rest zero blocks (a zero
    /// scale, and min, adds nothing), with the activations zero-padded to match.
    columns: usize,
}

#[derive(Debug)]
enum Blocks {
    Q8_0(Slab<GroupQ8_0>),
    Q5_0(Slab<GroupQ5_0>),
    Q4_1(Slab<GroupQ4_1>),
    Q4K(Slab<BlockQ4K>),
    Q6K(Slab<BlockQ6K>),
    /// Q5_0 matrices of a multiple of eight rows, interleaved by eight rows.
    Q5_0x8(Slab<PanelQ5_0>),
    /// Q4_K matrices of a multiple of eight rows, interleaved by eight rows.
    Q4Kx8(Slab<PanelQ4K>),
    /// Q8_0 matrices of a multiple of eight rows, interleaved by eight rows.
    Q8_0x8(Slab<PanelQ8_0>),
    /// Q4_1 matrices of a multiple of eight rows, interleaved by eight rows.
    Q4_1x8(Slab<PanelQ4_1>),
    /// Q6_K matrices of a multiple of eight rows, interleaved by eight rows.
    Q6Kx8(Slab<PanelQ6K>),
}

/// Which of our layouts a matrix is in: the tag the layout cache stores beside its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LayoutKind {
    Q8_0,
    Q5_0,
    Q4_1,
    Q4K,
    Q6K,
    Q5_0x8,
    Q4Kx8,
    Q8_0x8,
    Q4_1x8,
    Q6Kx8,
}

impl LayoutKind {
    pub const ALL: [LayoutKind; 10] = [
        LayoutKind::Q8_0,
        LayoutKind::Q5_0,
        LayoutKind::Q4_1,
        LayoutKind::Q4K,
        LayoutKind::Q6K,
        LayoutKind::Q5_0x8,
        LayoutKind::Q4Kx8,
        LayoutKind::Q8_0x8,
        LayoutKind::Q4_1x8,
        LayoutKind::Q6Kx8,
    ];

    /// Weights a stored row is padded to a multiple of (`QuantMatrix::columns`), weights of
    /// one row in one stored unit (group, super-block or panel column), and the rows a unit
    /// spans.
    fn unit(self) -> (usize, usize, usize) {
        let group = GroupQ8_0::WEIGHTS;
        match self {
            LayoutKind::Q8_0 | LayoutKind::Q5_0 | LayoutKind::Q4_1 => (group, group, 1),
            LayoutKind::Q4K | LayoutKind::Q6K => (BlockQ4K::WEIGHTS, BlockQ4K::WEIGHTS, 1),
            LayoutKind::Q5_0x8 | LayoutKind::Q8_0x8 | LayoutKind::Q4_1x8 => {
                (group, group / GROUP, PANEL)
            }
            LayoutKind::Q4Kx8 | LayoutKind::Q6Kx8 => (BlockQ4K::WEIGHTS, BlockQ4K::WEIGHTS, PANEL),
        }
    }

    fn unit_bytes(self) -> usize {
        match self {
            LayoutKind::Q8_0 => std::mem::size_of::<GroupQ8_0>(),
            LayoutKind::Q5_0 => std::mem::size_of::<GroupQ5_0>(),
            LayoutKind::Q4_1 => std::mem::size_of::<GroupQ4_1>(),
            LayoutKind::Q4K => std::mem::size_of::<BlockQ4K>(),
            LayoutKind::Q6K => std::mem::size_of::<BlockQ6K>(),
            LayoutKind::Q5_0x8 => std::mem::size_of::<PanelQ5_0>(),
            LayoutKind::Q4Kx8 => std::mem::size_of::<PanelQ4K>(),
            LayoutKind::Q8_0x8 => std::mem::size_of::<PanelQ8_0>(),
            LayoutKind::Q4_1x8 => std::mem::size_of::<PanelQ4_1>(),
            LayoutKind::Q6Kx8 => std::mem::size_of::<PanelQ6K>(),
        }
    }
}

/// A matrix's layout as plain bytes and the shape that reads them back
/// ([`QuantMatrix::layout`], [`QuantMatrix::from_layout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayoutShape {
    pub kind: LayoutKind,
    pub out_features: usize,
    pub in_features: usize,
    pub columns: usize,
}

impl LayoutShape {
    /// Bytes of a layout of this shape, if the shape is one [`QuantMatrix::from_bytes`] makes.
    pub fn expected_bytes(&self) -> Option<usize> {
        let (granule, unit_weights, unit_rows) = self.kind.unit();
        let valid = self.columns == self.in_features.next_multiple_of(granule)
            && self.out_features.is_multiple_of(unit_rows);
        valid.then(|| {
            self.out_features / unit_rows * (self.columns / unit_weights) * self.kind.unit_bytes()
        })
    }
}

/// Applies `$body` to the typed blocks of a row-by-row [`Blocks`], bound as `$blocks`, and
/// `$interleaved` to interleaved panels, bound as `$panels`.
macro_rules! with_blocks {
    ($matrix:expr, $blocks:ident => $body:expr, $panels:ident => $interleaved:expr) => {
        match $matrix {
            Blocks::Q8_0($blocks) => $body,
            Blocks::Q5_0($blocks) => $body,
            Blocks::Q4_1($blocks) => $body,
            Blocks::Q4K($blocks) => $body,
            Blocks::Q6K($blocks) => $body,
            Blocks::Q5_0x8($panels) => $interleaved,
            Blocks::Q4Kx8($panels) => $interleaved,
            Blocks::Q8_0x8($panels) => $interleaved,
            Blocks::Q4_1x8($panels) => $interleaved,
            Blocks::Q6Kx8($panels) => $interleaved,
        }
    };
}

/// The GGML bytes of one stored block and the weights per unit our kernels take (a group of
/// four blocks for Q8_0 / Q5_0, one super-block for the K-quants), for the types we cover.
fn unit_of(dtype: GgmlDType) -> Option<(usize, usize)> {
    match dtype {
        GgmlDType::Q8_0 => Some((GROUP * Q8_0_BYTES, GroupQ8_0::WEIGHTS)),
        GgmlDType::Q5_0 => Some((GROUP * Q5_0_BYTES, GroupQ5_0::WEIGHTS)),
        // Taken as the Q5_0 it converts to without loss ([`blocks::q4_0_as_q5_0`]).
        GgmlDType::Q4_0 => Some((GROUP * Q4_0_BYTES, GroupQ5_0::WEIGHTS)),
        GgmlDType::Q4_1 => Some((GROUP * Q4_1_BYTES, GroupQ4_1::WEIGHTS)),
        GgmlDType::Q4K => Some((Q4K_BYTES, BlockQ4K::WEIGHTS)),
        GgmlDType::Q6K => Some((Q6K_BYTES, BlockQ6K::WEIGHTS)),
        _ => None,
    }
}

impl QuantMatrix {
    /// Whether [`Self::from_qtensor`] takes `qtensor`: a matrix of a covered block type whose
    /// rows are whole units of it (whole blocks, for the types grouped by four blocks).
    pub fn supports(qtensor: &QTensor) -> bool {
        qtensor
            .shape()
            .dims2()
            .is_ok_and(|(_, in_features)| Self::supports_layout(qtensor.dtype(), in_features))
    }

    /// Whether our kernels multiply rows of `in_features` weights in `dtype` blocks.
    pub fn supports_layout(dtype: GgmlDType, in_features: usize) -> bool {
        unit_of(dtype)
            .is_some_and(|(_, weights)| in_features.is_multiple_of(row_granule(dtype, weights)))
    }

    /// Copies the blocks of a 2-D `qtensor` of a supported type.
    pub fn from_qtensor(qtensor: &QTensor) -> Result<Self, KernelError> {
        let (out_features, in_features) = qtensor.shape().dims2()?;
        Self::from_bytes(&qtensor.data()?, qtensor.dtype(), out_features, in_features)
    }

    /// Copies `bytes`, the blocks of an `(out_features, in_features)` matrix of `dtype` as GGML
    /// stores them, into our layout.
    pub fn from_bytes(
        bytes: &[u8],
        dtype: GgmlDType,
        out_features: usize,
        in_features: usize,
    ) -> Result<Self, KernelError> {
        let (unit_bytes, unit_weights) = unit_of(dtype).ok_or_else(|| {
            KernelError::InvalidWeights(format!("no quantized kernel for {dtype:?} blocks"))
        })?;
        let granule = row_granule(dtype, unit_weights);
        if !in_features.is_multiple_of(granule) {
            return Err(KernelError::InvalidWeights(format!(
                "rows of {in_features} weights are not whole units of {granule} ({dtype:?})"
            )));
        }
        let granule_bytes = unit_bytes * granule / unit_weights;
        let row_bytes = in_features / granule * granule_bytes;
        let bytes = std::borrow::Cow::Borrowed(bytes);
        if bytes.len() != out_features * row_bytes {
            return Err(KernelError::InvalidWeights(format!(
                "{} bytes for {out_features} rows of {row_bytes} ({dtype:?})",
                bytes.len()
            )));
        }
        let columns = in_features.next_multiple_of(unit_weights);
        let bytes = if columns == in_features {
            bytes
        } else {
            let padded_row = columns / unit_weights * unit_bytes;
            let mut padded = vec![0u8; out_features * padded_row];
            for (row, stored) in padded
                .chunks_exact_mut(padded_row)
                .zip(bytes.chunks_exact(row_bytes))
            {
                row[..row_bytes].copy_from_slice(stored);
            }
            std::borrow::Cow::Owned(padded)
        };
        // Q4_0's values `q - 8` are Q5_0's `(q + 8) - 16` with the same scale: the Q5_0 kernels
        // (interleaved ones included) multiply them exactly, at 22 bytes a block instead of 18.
        let (bytes, dtype, unit_bytes) = match dtype {
            GgmlDType::Q4_0 => (
                std::borrow::Cow::Owned(q4_0_as_q5_0(&bytes)),
                GgmlDType::Q5_0,
                GROUP * Q5_0_BYTES,
            ),
            _ => (bytes, dtype, unit_bytes),
        };
        let units = bytes.chunks_exact(unit_bytes);
        let blocks = match dtype {
            GgmlDType::Q5_0 if out_features.is_multiple_of(PANEL) => {
                Blocks::Q5_0x8(interleave(&bytes, out_features, columns).into())
            }
            GgmlDType::Q4K if out_features.is_multiple_of(PANEL) => {
                Blocks::Q4Kx8(interleave_q4k(&bytes, out_features, columns).into())
            }
            GgmlDType::Q8_0 if out_features.is_multiple_of(PANEL) => {
                Blocks::Q8_0x8(interleave_q8_0(&bytes, out_features, columns).into())
            }
            GgmlDType::Q4_1 if out_features.is_multiple_of(PANEL) => {
                Blocks::Q4_1x8(interleave_q4_1(&bytes, out_features, columns).into())
            }
            GgmlDType::Q6K if out_features.is_multiple_of(PANEL) => {
                Blocks::Q6Kx8(interleave_q6k(&bytes, out_features, columns).into())
            }
            GgmlDType::Q8_0 => Blocks::Q8_0(on_huge_pages(units.map(GroupQ8_0::parse)).into()),
            GgmlDType::Q5_0 => Blocks::Q5_0(on_huge_pages(units.map(GroupQ5_0::parse)).into()),
            GgmlDType::Q4_1 => Blocks::Q4_1(on_huge_pages(units.map(GroupQ4_1::parse)).into()),
            GgmlDType::Q4K => Blocks::Q4K(on_huge_pages(units.map(BlockQ4K::parse)).into()),
            _ => Blocks::Q6K(on_huge_pages(units.map(BlockQ6K::parse)).into()),
        };
        Ok(Self {
            blocks,
            out_features,
            in_features,
            columns,
        })
    }

    pub fn size_in_bytes(&self) -> usize {
        self.layout().1.len()
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// Whether the blocks are read in place from a mapped file (the layout cache).
    pub fn is_mapped(&self) -> bool {
        with_blocks!(&self.blocks, blocks => blocks.is_mapped(), panels => panels.is_mapped())
    }

    /// The layout's shape and its bytes, as [`Self::from_layout`] reads them back.
    pub fn layout(&self) -> (LayoutShape, &[u8]) {
        let kind = match self.blocks {
            Blocks::Q8_0(_) => LayoutKind::Q8_0,
            Blocks::Q5_0(_) => LayoutKind::Q5_0,
            Blocks::Q4_1(_) => LayoutKind::Q4_1,
            Blocks::Q4K(_) => LayoutKind::Q4K,
            Blocks::Q6K(_) => LayoutKind::Q6K,
            Blocks::Q5_0x8(_) => LayoutKind::Q5_0x8,
            Blocks::Q4Kx8(_) => LayoutKind::Q4Kx8,
            Blocks::Q8_0x8(_) => LayoutKind::Q8_0x8,
            Blocks::Q4_1x8(_) => LayoutKind::Q4_1x8,
            Blocks::Q6Kx8(_) => LayoutKind::Q6Kx8,
        };
        let shape = LayoutShape {
            kind,
            out_features: self.out_features,
            in_features: self.in_features,
            columns: self.columns,
        };
        let bytes = with_blocks!(&self.blocks,
            blocks => blocks.as_bytes(),
            panels => panels.as_bytes());
        (shape, bytes)
    }

    /// A matrix read in place from `bytes`, a layout of `shape` that [`Self::layout`] gave.
    /// Refused unless the bytes are exactly what the shape takes, aligned for its blocks: the
    /// kernels index rows by the shape alone.
    pub fn from_layout(shape: LayoutShape, bytes: MappedSlice) -> Result<Self, KernelError> {
        let invalid = || {
            KernelError::InvalidWeights(format!(
                "a cached layout of {} bytes does not hold a {shape:?} matrix",
                bytes.bytes().len()
            ))
        };
        if shape.expected_bytes() != Some(bytes.bytes().len()) {
            return Err(invalid());
        }
        fn slab<T: bytemuck::Pod>(
            bytes: &MappedSlice,
            invalid: impl Fn() -> KernelError,
        ) -> Result<Slab<T>, KernelError> {
            Slab::mapped(bytes.clone()).ok_or_else(invalid)
        }
        let blocks = match shape.kind {
            LayoutKind::Q8_0 => Blocks::Q8_0(slab(&bytes, invalid)?),
            LayoutKind::Q5_0 => Blocks::Q5_0(slab(&bytes, invalid)?),
            LayoutKind::Q4_1 => Blocks::Q4_1(slab(&bytes, invalid)?),
            LayoutKind::Q4K => Blocks::Q4K(slab(&bytes, invalid)?),
            LayoutKind::Q6K => Blocks::Q6K(slab(&bytes, invalid)?),
            LayoutKind::Q5_0x8 => Blocks::Q5_0x8(slab(&bytes, invalid)?),
            LayoutKind::Q4Kx8 => Blocks::Q4Kx8(slab(&bytes, invalid)?),
            LayoutKind::Q8_0x8 => Blocks::Q8_0x8(slab(&bytes, invalid)?),
            LayoutKind::Q4_1x8 => Blocks::Q4_1x8(slab(&bytes, invalid)?),
            LayoutKind::Q6Kx8 => Blocks::Q6Kx8(slab(&bytes, invalid)?),
        };
        Ok(Self {
            blocks,
            out_features: shape.out_features,
            in_features: shape.in_features,
            columns: shape.columns,
        })
    }

    /// `x W^T` for `x` `(n_rows, in_features)` f32 → `(n_rows, out_features)` f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, KernelError> {
        let (n_rows, in_features) = x.dims2()?;
        if in_features != self.in_features {
            return Err(KernelError::InvalidInput(format!(
                "{in_features} inputs for a matrix of {}",
                self.in_features
            )));
        }
        let mut input = x.flatten_all()?.to_vec1::<f32>()?;
        if self.columns != self.in_features {
            input = pad_rows(&input, self.in_features, self.columns);
        }
        let shape = (self.out_features, self.columns);
        let panel_min_rows = match self.blocks {
            Blocks::Q5_0x8(_)
            | Blocks::Q4Kx8(_)
            | Blocks::Q8_0x8(_)
            | Blocks::Q4_1x8(_)
            | Blocks::Q6Kx8(_) => interleaved_panel_min_rows(),
            _ => PANEL_MIN_ROWS,
        };
        let output = if n_rows >= panel_min_rows {
            let dequantize = |first: usize, out: &mut [f32]| self.dequantize_into(first, out);
            multiply_by_panels(dequantize, shape, &input, n_rows)
        } else {
            with_blocks!(&self.blocks,
                blocks => self.multiply(blocks, &input, n_rows),
                panels => multiply_interleaved(panels, shape, &input, n_rows))
        };
        Ok(Tensor::from_vec(
            output,
            (n_rows, self.out_features),
            x.device(),
        )?)
    }

    /// Rows `rows` of the matrix in f32 (embedding lookups of a tied vocabulary matrix).
    pub fn dequantize_rows(&self, rows: &[u32], device: &Device) -> Result<Tensor, KernelError> {
        let mut out = vec![0f32; rows.len() * self.in_features];
        let mut padded = vec![0f32; self.columns];
        for (row_out, &row) in out.chunks_exact_mut(self.in_features).zip(rows) {
            let row = row as usize;
            if row >= self.out_features {
                return Err(KernelError::InvalidInput(format!(
                    "row {row} of a matrix of {}",
                    self.out_features
                )));
            }
            self.dequantize_into(row, &mut padded);
            row_out.copy_from_slice(&padded[..self.in_features]);
        }
        Ok(Tensor::from_vec(
            out,
            (rows.len(), self.in_features),
            device,
        )?)
    }

    /// Writes the rows from `first` on into `out` (a whole number of stored rows of
    /// `columns` weights, row-major, all inside the matrix).
    fn dequantize_into(&self, first: usize, out: &mut [f32]) {
        with_blocks!(&self.blocks,
        blocks => {
            let per_row = blocks.len() / self.out_features;
            for (row, values) in out.chunks_exact_mut(self.columns).enumerate() {
                let units = &blocks[(first + row) * per_row..][..per_row];
                let chunks = values.chunks_exact_mut(self.columns / per_row);
                for (unit, chunk) in units.iter().zip(chunks) {
                    unit.dequantize(chunk);
                }
            }
        },
        panels => self.dequantize_panels(panels, first, out))
    }

    /// [`Self::dequantize_into`] for interleaved panels: whole panels (the f32 panels of a
    /// product start at multiples of 64 rows) eight rows at a time (SIMD code where the type
    /// has it), others row by row.
    fn dequantize_panels<P: PanelKernel>(&self, panels: &[P], first: usize, out: &mut [f32]) {
        let columns = panels.len() / (self.out_features / PANEL);
        let panel_values = PANEL * self.columns;
        if first.is_multiple_of(PANEL) && out.len().is_multiple_of(panel_values) {
            for (offset, values) in out.chunks_exact_mut(panel_values).enumerate() {
                let row_panels = &panels[(first / PANEL + offset) * columns..][..columns];
                for (column, panel) in row_panels.iter().enumerate() {
                    let at = column * P::COLUMN_WEIGHTS;
                    if !panel.dequantize_panel(&mut values[at..], self.columns) {
                        for r in 0..PANEL {
                            let row = &mut values[r * self.columns + at..][..P::COLUMN_WEIGHTS];
                            panel.dequantize_row(r, row);
                        }
                    }
                }
            }
            return;
        }
        for (offset, values) in out.chunks_exact_mut(self.columns).enumerate() {
            let row = first + offset;
            let row_panels = &panels[row / PANEL * columns..][..columns];
            for (panel, chunk) in row_panels
                .iter()
                .zip(values.chunks_exact_mut(P::COLUMN_WEIGHTS))
            {
                panel.dequantize_row(row % PANEL, chunk);
            }
        }
    }

    /// `input` `(n_rows, in_features)` row-major → `(n_rows, out_features)` row-major.
    ///
    /// Output rows are split into items of [`ROWS_PER_ITEM`] that the pool's workers take in
    /// turn; an item walks the input rows in tiles of [`TILE`] and multiplies each of its weight
    /// rows with a whole tile at once, writing its own slice of a transposed
    /// `(out_features, n_rows)` result.
    fn multiply<W: BlockKernel>(&self, blocks: &[W], input: &[f32], n_rows: usize) -> Vec<f32> {
        let mut acts = Vec::new();
        W::quantize(input, &mut acts);
        let per_row = self.columns / W::WEIGHTS;
        let act_rows: Vec<&[W::Act]> = acts.chunks_exact(per_row).collect();
        let mut transposed = vec![0f32; self.out_features * n_rows];
        let items: Vec<Mutex<&mut [f32]>> = transposed
            .chunks_mut(ROWS_PER_ITEM * n_rows)
            .map(Mutex::new)
            .collect();
        let compute = |item: usize| {
            let first_row = item * ROWS_PER_ITEM;
            // Each item is locked once, by the one worker that takes it.
            let mut out = match items[item].lock() {
                Ok(out) => out,
                Err(poisoned) => poisoned.into_inner(),
            };
            for (tile_idx, tile) in act_rows.chunks(TILE).enumerate() {
                for (offset, outputs) in out.chunks_exact_mut(n_rows).enumerate() {
                    let row = first_row + offset;
                    let weights = &blocks[row * per_row..(row + 1) * per_row];
                    let start = tile_idx * TILE;
                    W::tile_rows(weights, tile, &mut outputs[start..start + tile.len()]);
                }
            }
        };
        candle_core::utils::barrier_pool()
            .execute_chunked(items.len(), |range| range.for_each(compute));
        drop(items);
        if n_rows == 1 {
            return transposed;
        }
        let mut output = vec![0f32; transposed.len()];
        for (row, values) in transposed.chunks_exact(n_rows).enumerate() {
            for (input_row, &value) in values.iter().enumerate() {
                output[input_row * self.out_features + row] = value;
            }
        }
        output
    }
}

/// Weights a row must be a whole number of: a block for the types grouped by four blocks
/// (a row's last group is padded), a unit for the others.
fn row_granule(dtype: GgmlDType, unit_weights: usize) -> usize {
    match dtype {
        GgmlDType::Q8_0 | GgmlDType::Q5_0 | GgmlDType::Q4_0 | GgmlDType::Q4_1 => {
            self::blocks::BLOCK
        }
        _ => unit_weights,
    }
}

/// Rows of `width` values widened to `columns` with zeros.
fn pad_rows(values: &[f32], width: usize, columns: usize) -> Vec<f32> {
    let mut padded = vec![0f32; values.len() / width * columns];
    for (row, values) in padded
        .chunks_exact_mut(columns)
        .zip(values.chunks_exact(width))
    {
        row[..width].copy_from_slice(values);
    }
    padded
}

#[cfg(test)]
mod tests;
