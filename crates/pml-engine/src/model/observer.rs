//! The seam through which a caller watches a layer's attention without the model knowing why:
//! CacheBlend's ranking (in pml-runtime's `inference`) reads how much the new tokens attend each
//! cached slot. The model hands over what it computed anyway (queries, the layer's keys and
//! values) and the masked softmax it would compute, so an observer costs one extra score pass and
//! no second forward.

use candle_core::{DType, Tensor};

use super::EngineError;

/// Runs the attention's chunked masked softmax, handing each chunk to the callback.
pub(crate) type WeightChunks<'a> =
    dyn Fn(&mut dyn FnMut(&Tensor) -> Result<(), EngineError>) -> Result<(), EngineError> + 'a;

/// Watches one layer step ([`super::Model::forward_layer_observed`]).
pub trait AttentionObserver {
    /// Called after the tokens' K/V are written to the cache and before the tokens attend.
    fn observe(&mut self, attention: &AttentionView<'_>) -> Result<(), EngineError>;
}

/// What a layer's attention sees in one step.
pub struct AttentionView<'a> {
    pub(crate) n_slots: usize,
    pub(crate) values: &'a Tensor,
    pub(crate) dtype: DType,
    /// The layer's own weights computation, so this module needs nothing of the transformer's.
    pub(crate) weights: &'a WeightChunks<'a>,
}

impl AttentionView<'_> {
    /// Slots of the layer (keys the queries may attend).
    pub fn n_slots(&self) -> usize {
        self.n_slots
    }

    /// Every slot's values `(n_slots, n_kv_heads, head_dim)`, in the cache's dtype.
    pub fn values(&self) -> &Tensor {
        self.values
    }

    /// The dtype the attention weights are computed in.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Calls `each` with the softmax weights the step's queries give every slot under the
    /// position mask (and sliding window), in chunks of queries bounded as the attention's own:
    /// `(n_kv_heads, rows, n_slots)`, where a KV head's rows are its query heads' rows for the
    /// chunk's queries. Each row sums to 1 over the slots it may see.
    pub fn for_each_weights(
        &self,
        mut each: impl FnMut(&Tensor) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        (self.weights)(&mut each)
    }
}
