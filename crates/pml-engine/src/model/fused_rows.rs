//! Phi-3 files (and some converters' output for other families) store fused projections: one
//! `attn_qkv` matrix whose rows are Q's, then K's, then V's, and one `ffn_up` matrix of twice the
//! feed-forward width whose first half is the gate and second half the up projection. The
//! loader splits them row-wise on the stored blocks ([`gather_rows`]), so every family has the
//! same separate Q, K, V, gate and up projections: one forward pass, one layer-wise API, and K/V
//! computed alone where a recompute needs only them.

use std::collections::{HashMap, HashSet};

use super::EngineError;
use super::row_gather::gather_rows;
use super::weights::TensorSource;
use crate::stored_tensor::StoredTensor;
use pml_kernels::memory::mapped::MappedSlice;

/// Hands out `inner`'s tensors, serving the separate projections of a layer from its fused
/// tensor where the file has only that.
pub struct SplitFused<'a> {
    pub inner: &'a mut dyn TensorSource,
    /// Rows of Q (`n_heads * head_dim`) and of K and of V (`n_kv_heads * head_dim`).
    pub q_rows: usize,
    pub kv_rows: usize,
    /// Rows of the gate and of the up projection.
    pub ffn_dim: usize,
    /// Parts split off a fused tensor, waiting to be asked for.
    pending: HashMap<String, StoredTensor<'static>>,
    /// Names already handed out from `inner` (a source may forget a tensor once taken).
    taken: HashSet<String>,
}

impl<'a> SplitFused<'a> {
    pub fn new(
        inner: &'a mut dyn TensorSource,
        q_rows: usize,
        kv_rows: usize,
        ffn_dim: usize,
    ) -> Self {
        Self {
            inner,
            q_rows,
            kv_rows,
            ffn_dim,
            pending: HashMap::new(),
            taken: HashSet::new(),
        }
    }

    /// Whether the file has `name` itself, handed out or not.
    fn has(&self, name: &str) -> bool {
        self.taken.contains(name) || self.inner.contains(name)
    }

    /// The fused tensor `name` comes from and the named parts (with their row counts) that
    /// tensor splits into, when the file holds it fused.
    fn fused_origin(&self, name: &str) -> Option<(String, Vec<(String, usize)>)> {
        let (layer, tensor) = name.strip_prefix("blk.")?.split_once('.')?;
        let (projection, suffix) = tensor.split_once('.')?;
        let part = |projection: &str| format!("blk.{layer}.{projection}.{suffix}");
        let (fused, parts) = match projection {
            "attn_q" | "attn_k" | "attn_v" => (
                part("attn_qkv"),
                vec![
                    (part("attn_q"), self.q_rows),
                    (part("attn_k"), self.kv_rows),
                    (part("attn_v"), self.kv_rows),
                ],
            ),
            // A file with its own gate keeps `ffn_up` unfused.
            "ffn_gate" | "ffn_up" if !self.has(&part("ffn_gate")) => (
                part("ffn_up"),
                vec![
                    (part("ffn_gate"), self.ffn_dim),
                    (part("ffn_up"), self.ffn_dim),
                ],
            ),
            _ => return None,
        };
        let unfused = parts.iter().all(|(part, _)| self.has(part));
        (!unfused && self.inner.contains(&fused)).then_some((fused, parts))
    }

    fn split(&mut self, fused: &str, parts: Vec<(String, usize)>) -> Result<(), EngineError> {
        let tensor = self.inner.stored(fused)?;
        let rows = tensor.dims().first().copied().unwrap_or(0);
        let expected: usize = parts.iter().map(|(_, rows)| rows).sum();
        if rows != expected {
            return Err(EngineError::InvalidWeights(format!(
                "{fused} has {rows} rows; its parts {} need {expected}",
                parts
                    .iter()
                    .map(|(name, rows)| format!("{name} ({rows})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let mut start = 0;
        let mut split = Vec::with_capacity(parts.len());
        for (name, rows) in parts {
            split.push((name, gather_rows(&tensor, start..start + rows)?));
            start += rows;
        }
        drop(tensor);
        // The parts are copies: the fused tensor's mapped pages are no longer read.
        self.inner.release(fused);
        self.pending.extend(split);
        Ok(())
    }
}

impl TensorSource for SplitFused<'_> {
    fn contains(&self, name: &str) -> bool {
        self.pending.contains_key(name)
            || self.fused_origin(name).is_some()
            || self.inner.contains(name)
    }

    fn stored(&mut self, name: &str) -> Result<StoredTensor<'_>, EngineError> {
        if let Some(tensor) = self.pending.remove(name) {
            return Ok(tensor);
        }
        match self.fused_origin(name) {
            Some((fused, parts)) => {
                self.split(&fused, parts)?;
                self.pending
                    .remove(name)
                    .ok_or_else(|| EngineError::MissingTensor(name.to_string()))
            }
            None => {
                self.taken.insert(name.to_string());
                self.inner.stored(name)
            }
        }
    }

    fn release(&mut self, name: &str) {
        if self.taken.contains(name) {
            self.inner.release(name);
        }
    }

    /// Only the tensors this source passes on whole (never a part of a fused one).
    fn mapped(&mut self, name: &str) -> Option<MappedSlice> {
        if self.pending.contains_key(name) || self.fused_origin(name).is_some() {
            None
        } else {
            self.inner.mapped(name)
        }
    }
}

#[cfg(test)]
mod tests {
    use candle_core::quantized::{GgmlDType, QTensor};
    use candle_core::{Device, Tensor};

    use super::*;
    use crate::model::weights::TensorMap;

    /// A matrix whose row `r` holds `r + offset` everywhere.
    fn rows(n: usize, columns: usize, offset: usize) -> Result<QTensor, EngineError> {
        let values: Vec<f32> = (0..n)
            .flat_map(|row| std::iter::repeat_n((row + offset) as f32, columns))
            .collect();
        let tensor = Tensor::from_vec(values, (n, columns), &Device::Cpu)?;
        Ok(QTensor::quantize(&tensor, GgmlDType::F32)?)
    }

    fn first_column(tensor: StoredTensor<'_>) -> Result<Vec<f32>, EngineError> {
        let dense = tensor.dequantize(&Device::Cpu)?;
        Ok(dense.narrow(1, 0, 1)?.flatten_all()?.to_vec1::<f32>()?)
    }

    #[test]
    fn fused_qkv_and_gate_up_split_into_their_parts_in_any_order() -> Result<(), EngineError> {
        let mut map = TensorMap::default();
        map.0
            .insert("blk.0.attn_qkv.weight".into(), rows(8, 32, 0)?);
        map.0.insert("blk.0.ffn_up.weight".into(), rows(6, 32, 10)?);
        let mut split = SplitFused::new(&mut map, 4, 2, 3);
        for name in ["attn_q", "attn_k", "attn_v", "ffn_gate", "ffn_up"] {
            assert!(split.contains(&format!("blk.0.{name}.weight")), "{name}");
        }
        assert_eq!(
            first_column(split.stored("blk.0.attn_v.weight")?)?,
            [6.0, 7.0]
        );
        assert_eq!(
            first_column(split.stored("blk.0.attn_q.weight")?)?,
            [0.0, 1.0, 2.0, 3.0]
        );
        assert_eq!(
            first_column(split.stored("blk.0.attn_k.weight")?)?,
            [4.0, 5.0]
        );
        assert_eq!(
            first_column(split.stored("blk.0.ffn_up.weight")?)?,
            [13.0, 14.0, 15.0]
        );
        assert_eq!(
            first_column(split.stored("blk.0.ffn_gate.weight")?)?,
            [10.0, 11.0, 12.0]
        );
        Ok(())
    }

    #[test]
    fn separate_projections_pass_through_and_a_wrong_fused_size_is_named() -> Result<(), EngineError>
    {
        let mut map = TensorMap::default();
        map.0
            .insert("blk.0.ffn_gate.weight".into(), rows(3, 32, 0)?);
        map.0.insert("blk.0.ffn_up.weight".into(), rows(3, 32, 5)?);
        map.0
            .insert("blk.1.attn_qkv.weight".into(), rows(7, 32, 0)?);
        let mut split = SplitFused::new(&mut map, 4, 2, 3);
        assert_eq!(
            first_column(split.stored("blk.0.ffn_up.weight")?)?,
            [5.0, 6.0, 7.0]
        );
        let error = split
            .stored("blk.1.attn_k.weight")
            .expect_err("7 rows ≠ 4 + 2 + 2");
        assert!(
            error
                .to_string()
                .contains("blk.1.attn_qkv.weight has 7 rows"),
            "{error}"
        );
        Ok(())
    }
}
