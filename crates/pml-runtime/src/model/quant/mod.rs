//! Our own quantized matrix × few-rows product for decoding, for Q5_0 (candle's kernel for it
//! is scalar, so it used to be requantized to Q8_0: 34 bytes per 32 weights instead of 22)
//! and Q8_0 (the LM head; candle's kernel converts each block's f16 scale out of line). The
//! activations are quantized once per call (8-bit blocks of 32), candle's persistent worker
//! pool splits the output rows into items, and each worker runs AVX2 dot products over its
//! rows (scalar where the CPU lacks AVX2).
//!
//! - `blocks`: block layouts, activation quantization, scalar reference dots.
//! - `avx2`: the SIMD dots (the only `unsafe` code of the engine).

mod avx2;
mod blocks;

use std::sync::Mutex;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};

use self::blocks::{ActGroup, GROUP, GROUP_WEIGHTS, GroupQ5_0, GroupQ8_0, Q5_0_BYTES, Q8_0_BYTES};
use super::EngineError;

/// Output rows one work item computes: large enough that handing out items costs little,
/// small enough that the two workers finish together.
const ROWS_PER_ITEM: usize = 32;

/// A weight matrix `(out_features, in_features)` of blocks our kernels multiply.
#[derive(Debug)]
pub struct QuantMatrix {
    blocks: Blocks,
    out_features: usize,
    in_features: usize,
}

#[derive(Debug)]
enum Blocks {
    Q8_0(Vec<GroupQ8_0>),
    Q5_0(Vec<GroupQ5_0>),
}

impl QuantMatrix {
    /// Whether [`Self::from_qtensor`] takes `qtensor`: a matrix of a covered block type whose
    /// rows are whole groups.
    pub fn supports(qtensor: &QTensor) -> bool {
        let whole_groups = qtensor
            .shape()
            .dims2()
            .is_ok_and(|(_, in_features)| in_features.is_multiple_of(GROUP_WEIGHTS));
        matches!(qtensor.dtype(), GgmlDType::Q8_0 | GgmlDType::Q5_0) && whole_groups
    }

    /// Copies the blocks of a 2-D `qtensor` of a supported type.
    pub fn from_qtensor(qtensor: &QTensor) -> Result<Self, EngineError> {
        let (out_features, in_features) = qtensor.shape().dims2()?;
        if !in_features.is_multiple_of(GROUP_WEIGHTS) {
            return Err(EngineError::InvalidWeights(format!(
                "rows of {in_features} weights are not whole groups of {GROUP_WEIGHTS}"
            )));
        }
        let n_groups = out_features * in_features / GROUP_WEIGHTS;
        let bytes = qtensor.data()?;
        let groups = |block_bytes: usize| -> Result<_, EngineError> {
            let group_bytes = GROUP * block_bytes;
            if bytes.len() != n_groups * group_bytes {
                return Err(EngineError::InvalidWeights(format!(
                    "{} bytes for {n_groups} groups of {group_bytes}",
                    bytes.len()
                )));
            }
            Ok(bytes.chunks_exact(group_bytes))
        };
        let blocks = match qtensor.dtype() {
            GgmlDType::Q8_0 => Blocks::Q8_0(groups(Q8_0_BYTES)?.map(GroupQ8_0::parse).collect()),
            GgmlDType::Q5_0 => Blocks::Q5_0(groups(Q5_0_BYTES)?.map(GroupQ5_0::parse).collect()),
            other => {
                return Err(EngineError::InvalidWeights(format!(
                    "no decode kernel for {other:?} blocks"
                )));
            }
        };
        Ok(Self {
            blocks,
            out_features,
            in_features,
        })
    }

    pub fn size_in_bytes(&self) -> usize {
        match &self.blocks {
            Blocks::Q8_0(groups) => groups.len() * std::mem::size_of::<GroupQ8_0>(),
            Blocks::Q5_0(groups) => groups.len() * std::mem::size_of::<GroupQ5_0>(),
        }
    }

    /// `x W^T` for `x` `(n_rows, in_features)` f32 → `(n_rows, out_features)` f32.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        let (n_rows, in_features) = x.dims2()?;
        if in_features != self.in_features {
            return Err(EngineError::InvalidInput(format!(
                "{in_features} inputs for a matrix of {}",
                self.in_features
            )));
        }
        let input = x.flatten_all()?.to_vec1::<f32>()?;
        let output = self.multiply(&input, n_rows);
        Ok(Tensor::from_vec(
            output,
            (n_rows, self.out_features),
            x.device(),
        )?)
    }

    /// Rows `rows` of the matrix in f32 (embedding lookups of a tied vocabulary matrix).
    pub fn dequantize_rows(&self, rows: &[u32], device: &Device) -> Result<Tensor, EngineError> {
        let groups_per_row = self.in_features / GROUP_WEIGHTS;
        let mut out = vec![0f32; rows.len() * self.in_features];
        for (row_out, &row) in out.chunks_exact_mut(self.in_features).zip(rows) {
            let row = row as usize;
            if row >= self.out_features {
                return Err(EngineError::InvalidInput(format!(
                    "row {row} of a matrix of {}",
                    self.out_features
                )));
            }
            let range = row * groups_per_row..(row + 1) * groups_per_row;
            let chunks = row_out.chunks_exact_mut(GROUP_WEIGHTS);
            match &self.blocks {
                Blocks::Q8_0(blocks) => blocks[range]
                    .iter()
                    .zip(chunks)
                    .for_each(|(block, out)| block.dequantize(out)),
                Blocks::Q5_0(blocks) => blocks[range]
                    .iter()
                    .zip(chunks)
                    .for_each(|(block, out)| block.dequantize(out)),
            }
        }
        Ok(Tensor::from_vec(
            out,
            (rows.len(), self.in_features),
            device,
        )?)
    }

    /// `input` `(n_rows, in_features)` row-major → `(n_rows, out_features)` row-major.
    fn multiply(&self, input: &[f32], n_rows: usize) -> Vec<f32> {
        let mut acts = Vec::new();
        blocks::quantize_activations(input, &mut acts);
        match &self.blocks {
            Blocks::Q8_0(blocks) => self.multiply_blocks(blocks, &acts, n_rows, dot_q8_0),
            Blocks::Q5_0(blocks) => self.multiply_blocks(blocks, &acts, n_rows, dot_q5_0),
        }
    }

    /// Output rows are split into items of [`ROWS_PER_ITEM`] that the pool's workers take in
    /// turn; each item computes its rows for every input row while they are in cache, into
    /// its own slice of a transposed `(out_features, n_rows)` result.
    fn multiply_blocks<W: Sync>(
        &self,
        blocks: &[W],
        acts: &[ActGroup],
        n_rows: usize,
        dot: fn(&[W], &[ActGroup]) -> f32,
    ) -> Vec<f32> {
        let groups_per_row = self.in_features / GROUP_WEIGHTS;
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
            for (offset, outputs) in out.chunks_exact_mut(n_rows).enumerate() {
                let row = first_row + offset;
                let weights = &blocks[row * groups_per_row..(row + 1) * groups_per_row];
                for (input_row, output) in outputs.iter_mut().enumerate() {
                    let acts = &acts[input_row * groups_per_row..(input_row + 1) * groups_per_row];
                    *output = dot(weights, acts);
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

fn dot_q8_0(weights: &[GroupQ8_0], acts: &[ActGroup]) -> f32 {
    avx2::dot_q8_0(weights, acts).unwrap_or_else(|| blocks::dot_q8_0(weights, acts))
}

fn dot_q5_0(weights: &[GroupQ5_0], acts: &[ActGroup]) -> f32 {
    avx2::dot_q5_0(weights, acts).unwrap_or_else(|| blocks::dot_q5_0(weights, acts))
}

#[cfg(test)]
mod tests;
