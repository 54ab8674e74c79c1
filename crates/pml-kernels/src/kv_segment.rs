//! [`KvSegment`]: consecutive rows of a layer's K and V in one buffer, what attention reads. A
//! KV cache's layer is one segment, or several when its first rows are shared with other caches
//! (`crate::kv_cache`); the kernels read each in place.

use candle_core::Tensor;

use crate::KernelError;

/// Consecutive held slots of a layer in one buffer: their K (after RoPE) and V, `(rows,
/// kv_heads, head_dim)` each, views whose contents never change.
#[derive(Clone, Debug)]
pub struct KvSegment {
    pub keys: Tensor,
    pub values: Tensor,
}

impl KvSegment {
    pub fn len(&self) -> usize {
        self.keys.dims().first().copied().unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every segment's rows in one `(keys, values)` pair: the first segment's own views when it
    /// is the only one, else a copy; `None` for no segment.
    pub fn joined(segments: &[KvSegment]) -> Result<Option<(Tensor, Tensor)>, KernelError> {
        Ok(match segments {
            [] => None,
            [only] => Some((only.keys.clone(), only.values.clone())),
            several => {
                let keys: Vec<&Tensor> = several.iter().map(|segment| &segment.keys).collect();
                let values: Vec<&Tensor> = several.iter().map(|segment| &segment.values).collect();
                Some((Tensor::cat(&keys, 0)?, Tensor::cat(&values, 0)?))
            }
        })
    }
}
