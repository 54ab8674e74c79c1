//! The decoder-only transformer of both families, in dependency order: RoPE → visible slots →
//! MLP → attention → block → model. The whole-model forward pass is built from the per-layer
//! step ([`Model::forward_layer`]) that selective recompute and hidden-state restore call
//! directly; activations are f32 `(n_tokens, d_model)` matrices, one sequence per call.

use std::ops::Range;
use std::path::Path;

use candle_core::{DType, Device, Tensor};

use super::EngineError;
use super::config::{Activation, ModelConfig};
use super::context::{ForwardContext, ForwardOptions, ForwardOutput, LogitRows};
use super::fused_rows::SplitFused;
use super::layout_cache::{LayoutCache, LayoutCached};
use super::observer::{AttentionObserver, AttentionView};
use super::rope::{RotaryEmbedding, RotaryTables, positions_as_offsets};
use super::rope_rows::NeoxRows;
use super::weights::{Linear, MatrixRole, RmsNorm, SharedInput, TensorSource, WeightFormat};
use crate::device::{Backend, Kernels};
use crate::gguf::GgufFile;
use crate::kv_cache::{
    KvBlock, KvCache, KvCacheError, KvLayout, KvSegment, ParallelContexts, QueryHorizon,
};
use pml_kernels::{self as kernels, masked_softmax};

/// Dtype of activations and of the KV cache.
pub const ACTIVATION_DTYPE: DType = DType::F32;

/// Most attention scores one step materialises on the CPU (16 MiB of f32): long prefills attend
/// in chunks of queries, which keeps the scores in cache and avoids huge short-lived allocations.
const MAX_ATTENTION_SCORES: usize = 1 << 22;

/// The same off the CPU (512 MiB of f32): a GPU has no cache to keep them in, and every chunk
/// costs kernel launches, so a 4k-token prefill of a small model attends in one piece (measured
/// on an H200, SmolLM2, 4096 tokens: 36 chunks a layer took 790 ms of TTFT).
const MAX_DEVICE_ATTENTION_SCORES: usize = 1 << 27;

/// Attention scores one chunk of queries may materialise on `device`.
fn max_attention_scores(device: &Device) -> usize {
    if device.is_cpu() {
        MAX_ATTENTION_SCORES
    } else {
        MAX_DEVICE_ATTENTION_SCORES
    }
}

/// The tensor of Llama 3.1+ files that divides each RoPE frequency.
const ROPE_FREQS: &str = "rope_freqs.weight";

/// Tensors of Phi-3's LongRoPE, which the engine refuses.
const LONG_ROPE_FACTORS: [&str; 2] = ["rope_factors_long.weight", "rope_factors_short.weight"];

/// Rows the MLP takes at once on the CPU (see [`Mlp::forward`]).
const MLP_ROWS: usize = 512;

/// The same off the CPU, where a block is a few kernel launches and memory is not the limit.
const DEVICE_MLP_ROWS: usize = 8192;

/// The slots `lo..hi` outside which no key is visible to any query with a position in
/// `min_query..=max_query` (empty when none is): causal prefills and sliding windows then
/// multiply only the keys a chunk of queries can see.
fn visible_slots(
    min_query: u32,
    max_query: u32,
    key_positions: &[u32],
    window: Option<usize>,
) -> std::ops::Range<usize> {
    let maybe_visible = |&key: &u32| {
        key <= max_query
            && window.is_none_or(|window| u64::from(key) + window as u64 > u64::from(min_query))
    };
    match key_positions.iter().position(maybe_visible) {
        Some(lo) => {
            let hi = key_positions.len()
                - key_positions
                    .iter()
                    .rev()
                    .position(maybe_visible)
                    .unwrap_or(0);
            lo..hi
        }
        None => 0..0,
    }
}

/// The rows `slots` (among all of `segments`' rows, one segment after another) as segments:
/// views of the segments they fall in.
fn narrowed(segments: &[KvSegment], slots: Range<usize>) -> Result<Vec<KvSegment>, EngineError> {
    let mut out = Vec::new();
    let mut start = 0;
    for segment in segments {
        let end = start + segment.len();
        let (from, to) = (slots.start.max(start), slots.end.min(end));
        if from < to {
            out.push(KvSegment {
                keys: segment.keys.narrow(0, from - start, to - from)?,
                values: segment.values.narrow(0, from - start, to - from)?,
            });
        }
        start = end;
    }
    Ok(out)
}

/// Gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Clone, Debug)]
pub(crate) struct Mlp {
    ffn_gate: Linear,
    ffn_up: Linear,
    ffn_down: Linear,
    activation: Activation,
    kernels: Kernels,
}

impl Mlp {
    fn new(
        source: &mut dyn TensorSource,
        prefix: &str,
        activation: Activation,
        format: WeightFormat,
        backend: &Backend,
    ) -> Result<Self, EngineError> {
        let mut linear = |name: &str| {
            let name = format!("{prefix}.{name}.weight");
            Linear::load(source, &name, None, MatrixRole::Projection, format, backend)
        };
        Ok(Self {
            ffn_gate: linear("ffn_gate")?,
            ffn_up: linear("ffn_up")?,
            ffn_down: linear("ffn_down")?,
            activation,
            kernels: backend.kernels,
        })
    }

    /// Long inputs go through in blocks of [`MLP_ROWS`] rows: rows are independent, and the
    /// `(rows, ffn_dim)` intermediates of a 4096-token prompt would otherwise take hundreds of MB.
    pub(crate) fn forward(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        let n_rows = x.dim(0)?;
        let block_rows = if x.device().is_cpu() {
            MLP_ROWS
        } else {
            DEVICE_MLP_ROWS
        };
        if n_rows <= block_rows {
            return self.forward_rows(x);
        }
        let blocks = (0..n_rows)
            .step_by(block_rows)
            .map(|start| self.forward_rows(&x.narrow(0, start, block_rows.min(n_rows - start))?))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Tensor::cat(&blocks, 0)?)
    }

    fn forward_rows(&self, x: &Tensor) -> Result<Tensor, EngineError> {
        let input = SharedInput::new(x);
        let gate = self.ffn_gate.forward_shared(&input)?; // (n_tokens, ffn_dim)
        let up = self.ffn_up.forward_shared(&input)?;
        let gated = kernels::gated_activation(&gate, &up, self.activation, self.kernels)?;
        self.ffn_down.forward(&gated)
    }
}

/// Grouped-query self-attention over the whole KV cache of a layer.
#[derive(Clone, Debug)]
pub(crate) struct Attention {
    attn_q: Linear,
    attn_k: Linear,
    attn_v: Linear,
    pub(crate) attn_output: Linear,
    attn_q_norm: Option<RmsNorm>,
    attn_k_norm: Option<RmsNorm>,
    pub(crate) rope: RotaryEmbedding,
    sliding_window: Option<usize>,
    n_heads: usize,
    n_kv_heads: usize,
    head_dim: usize,
    scale: f64,
    kernels: Kernels,
}

impl Attention {
    fn new(
        source: &mut dyn TensorSource,
        prefix: &str,
        layer_idx: usize,
        config: &ModelConfig,
        format: WeightFormat,
        backend: &Backend,
    ) -> Result<Self, EngineError> {
        let device = &backend.device;
        let mut projection = |name: &str, bias: bool| {
            let bias_name = format!("{prefix}.{name}.bias");
            Linear::load(
                source,
                &format!("{prefix}.{name}.weight"),
                bias.then_some(bias_name.as_str()),
                MatrixRole::Projection,
                format,
                backend,
            )
        };
        let attn_q = projection("attn_q", config.qkv_bias)?;
        let attn_k = projection("attn_k", config.qkv_bias)?;
        let attn_v = projection("attn_v", config.qkv_bias)?;
        let attn_output = projection("attn_output", false)?;
        let (attn_q_norm, attn_k_norm) = if config.qk_norm {
            let mut norm = |name: &str| {
                let name = format!("{prefix}.{name}.weight");
                RmsNorm::load(source, &name, config.head_dim, config.rms_norm_eps, device)
            };
            (Some(norm("attn_q_norm")?), Some(norm("attn_k_norm")?))
        } else {
            (None, None)
        };
        let expected = [
            (&attn_q, config.n_heads * config.head_dim, "attn_q"),
            (&attn_k, config.n_kv_heads * config.head_dim, "attn_k"),
            (&attn_v, config.n_kv_heads * config.head_dim, "attn_v"),
            (&attn_output, config.d_model, "attn_output"),
        ];
        for (linear, out_features, name) in expected {
            if linear.out_features() != out_features {
                return Err(EngineError::InvalidWeights(format!(
                    "{prefix}.{name} has {} outputs, the config implies {out_features}",
                    linear.out_features()
                )));
            }
        }
        let layer = &config.layers[layer_idx];
        Ok(Self {
            attn_q,
            attn_k,
            attn_v,
            attn_output,
            attn_q_norm,
            attn_k_norm,
            rope: RotaryEmbedding::new(
                config.head_dim,
                layer,
                config.rope_frequency_factors.as_deref(),
            ),
            sliding_window: layer.sliding_window,
            n_heads: config.n_heads,
            n_kv_heads: config.n_kv_heads,
            head_dim: config.head_dim,
            scale: config.attention_scale,
            kernels: backend.kernels,
        })
    }

    /// Rotated, scaled queries `(n_tokens, n_heads, head_dim)` of the normed input `x`.
    pub(crate) fn queries(
        &self,
        x: &SharedInput<'_>,
        tables: &RotaryTables,
    ) -> Result<Tensor, EngineError> {
        let n_tokens = x.rows().dim(0)?;
        let queries =
            self.attn_q
                .forward_shared(x)?
                .reshape((n_tokens, self.n_heads, self.head_dim))?;
        let queries = match &self.attn_q_norm {
            Some(norm) => norm.forward(&queries)?,
            None => queries,
        };
        Ok((RotaryEmbedding::apply(&queries, tables)? * self.scale)?)
    }

    /// Keys (after RoPE) and values `(n_tokens, n_kv_heads, head_dim)` of the normed input `x`.
    pub(crate) fn keys_values(
        &self,
        x: &SharedInput<'_>,
        tables: &RotaryTables,
    ) -> Result<(Tensor, Tensor), EngineError> {
        let n_tokens = x.rows().dim(0)?;
        let kv_shape = (n_tokens, self.n_kv_heads, self.head_dim);
        let keys = self.attn_k.forward_shared(x)?.reshape(kv_shape)?;
        let keys = match &self.attn_k_norm {
            Some(norm) => norm.forward(&keys)?,
            None => keys,
        };
        let keys = RotaryEmbedding::apply(&keys, tables)?;
        let values = self.attn_v.forward_shared(x)?.reshape(kv_shape)?;
        Ok((keys, values))
    }

    /// softmax(q k^T under the position mask) v for queries `(n, n_heads, head_dim)` at
    /// `query_positions` over cached keys and values, the rows of `segments` one after another
    /// (`(rows, n_kv_heads, head_dim)` each, [`crate::kv_cache::LayerKv::segments`]) at
    /// `key_positions`; returns `(n, n_heads * head_dim)`. Long calls go in chunks of queries so
    /// the scores of one chunk stay within [`max_attention_scores`] (in one piece where attention
    /// materialises no scores: CUDA's flash kernel); each chunk multiplies only the slots that can
    /// be visible to it. With `parallel`, the rows it names are re-weighted as parallel contexts
    /// ([`kernels::attend_parallel`]).
    pub(crate) fn attend(
        &self,
        queries: &Tensor,
        query_positions: &[u32],
        segments: &[KvSegment],
        key_positions: &[u32],
        parallel: Option<&ParallelContexts>,
    ) -> Result<Tensor, EngineError> {
        let n_queries = queries.dim(0)?;
        let scores_per_query = self.n_heads * key_positions.len();
        let chunk = if kernels::attends_without_scores(queries, segments, self.kernels) {
            n_queries.max(1)
        } else {
            (max_attention_scores(queries.device()) / scores_per_query.max(1)).max(1)
        };
        let mut outputs = Vec::with_capacity(n_queries.div_ceil(chunk));
        for start in (0..n_queries).step_by(chunk) {
            let len = chunk.min(n_queries - start);
            let chunk_positions = &query_positions[start..start + len];
            let (Some(&min_query), Some(&max_query)) =
                (chunk_positions.iter().min(), chunk_positions.iter().max())
            else {
                continue;
            };
            let slots = visible_slots(min_query, max_query, key_positions, self.sliding_window);
            let chunk_queries = queries.narrow(0, start, len)?;
            if slots.is_empty() {
                // Nothing visible (not reachable from `forward_layer`, which writes each query's
                // own key first): zeros, as `masked_softmax` gives a row that sees nothing.
                outputs.push(Tensor::zeros(
                    (len, self.n_heads * self.head_dim),
                    queries.dtype(),
                    queries.device(),
                )?);
                continue;
            }
            let chunk_segments = narrowed(segments, slots.clone())?;
            let chunk_keys = &key_positions[slots];
            outputs.push(match parallel {
                Some(contexts) => kernels::attend_parallel(
                    &chunk_queries,
                    chunk_positions,
                    &chunk_segments,
                    chunk_keys,
                    self.sliding_window,
                    &contexts.flags(chunk_keys),
                    contexts.scaling(),
                )?,
                None => kernels::attend(
                    &chunk_queries,
                    chunk_positions,
                    &chunk_segments,
                    chunk_keys,
                    self.sliding_window,
                    self.kernels,
                )?,
            });
        }
        if outputs.len() == 1 {
            return Ok(outputs.remove(0));
        }
        Ok(Tensor::cat(&outputs, 0)?)
    }
}

impl Attention {
    /// Calls `each` with the softmax weights of `queries` `(n, n_heads, head_dim)` at
    /// `query_positions` over every key under the position mask, in chunks of queries sized as
    /// [`Self::attend`]'s, each `(n_kv_heads, group * len, n_keys)`: per KV head, the rows of
    /// its query heads for the chunk's queries.
    pub(crate) fn for_each_weights(
        &self,
        queries: &Tensor,
        query_positions: &[u32],
        keys: &Tensor,
        key_positions: &[u32],
        each: &mut dyn FnMut(&Tensor) -> Result<(), EngineError>,
    ) -> Result<(), EngineError> {
        let n_queries = queries.dim(0)?;
        let n_keys = keys.dim(0)?;
        let most = max_attention_scores(queries.device());
        let chunk = (most / (self.n_heads * n_keys).max(1)).max(1);
        // (n_kv_heads, n_keys, head_dim)
        let keys = pml_kernels::heads_major(keys)?.contiguous()?;
        for start in (0..n_queries).step_by(chunk) {
            let len = chunk.min(n_queries - start);
            let grouped =
                kernels::queries_by_kv_head(&queries.narrow(0, start, len)?, self.n_kv_heads)?;
            let scores = grouped.matmul(&keys.t()?)?;
            each(&masked_softmax(
                &scores,
                &query_positions[start..start + len],
                key_positions,
                self.sliding_window,
                self.kernels,
            )?)?;
        }
        Ok(())
    }
}

/// One transformer layer: pre-norm attention and MLP with residuals, plus Gemma's norms of the
/// two outputs (`post_attention_norm`, `post_ffw_norm`).
#[derive(Clone, Debug)]
pub(crate) struct Block {
    pub(crate) attn_norm: RmsNorm,
    pub(crate) attention: Attention,
    pub(crate) post_attention_norm: Option<RmsNorm>,
    pub(crate) ffn_norm: RmsNorm,
    pub(crate) mlp: Mlp,
    pub(crate) post_ffw_norm: Option<RmsNorm>,
}

impl Block {
    fn new(
        source: &mut dyn TensorSource,
        layer_idx: usize,
        config: &ModelConfig,
        format: WeightFormat,
        backend: &Backend,
    ) -> Result<Self, EngineError> {
        let device = &backend.device;
        let prefix = format!("blk.{layer_idx}");
        let mut norm = |name: &str| {
            let name = format!("{prefix}.{name}.weight");
            RmsNorm::load(source, &name, config.d_model, config.rms_norm_eps, device)
        };
        let attn_norm = norm("attn_norm")?;
        let ffn_norm = norm("ffn_norm")?;
        let (post_attention_norm, post_ffw_norm) = if config.sandwich_norms {
            (
                Some(norm("post_attention_norm")?),
                Some(norm("post_ffw_norm")?),
            )
        } else {
            (None, None)
        };
        Ok(Self {
            attn_norm,
            attention: Attention::new(source, &prefix, layer_idx, config, format, backend)?,
            post_attention_norm,
            ffn_norm,
            mlp: Mlp::new(source, &prefix, config.activation, format, backend)?,
            post_ffw_norm,
        })
    }

    /// Computes the tokens' fresh K/V, writes them at their slots, lets their queries attend
    /// over every slot of the layer, then runs the MLP. An `observer` sees the queries and the
    /// layer's keys and values in between.
    fn forward(
        &self,
        hidden: &Tensor,
        context: &ForwardContext,
        layer_idx: usize,
        kv: &mut KvCache,
        observer: Option<&mut dyn AttentionObserver>,
    ) -> Result<Tensor, EngineError> {
        let positions = context.positions();
        let x = self.attn_norm.forward(hidden)?;
        // One table per RoPE of the model and call, not per layer: on a GPU the host's sines
        // and cosines of a 4k-token prefill were most of its time (~3 ms a layer).
        let tables = context.rope_tables(&self.attention.rope, hidden.device())?;
        let input = SharedInput::new(&x);
        let (keys, values) = self.attention.keys_values(&input, &tables)?;
        kv.write(layer_idx, context.slots(), &keys, &values, positions)?;
        let queries = self.attention.queries(&input, &tables)?;

        let layer_kv = kv.layer(layer_idx)?;
        if let Some(observer) = observer {
            // The observer's products take one tensor: a layer with shared rows is joined.
            let layer_keys = layer_kv.keys()?;
            let layer_values = layer_kv.values()?;
            // An observer ranks every slot; a splice that left some out has no weights for them.
            if layer_kv.first_held() > 0 {
                return Err(KvCacheError::NotHeld {
                    slot: 0,
                    layer_idx,
                    first_held: layer_kv.first_held(),
                    horizon: layer_kv.horizon(),
                }
                .into());
            }
            let weights = |each: &mut dyn FnMut(&Tensor) -> Result<(), EngineError>| {
                self.attention.for_each_weights(
                    &queries,
                    positions,
                    &layer_keys,
                    layer_kv.positions(),
                    each,
                )
            };
            observer.observe(&AttentionView {
                n_slots: layer_kv.positions().len(),
                values: &layer_values,
                dtype: queries.dtype(),
                weights: &weights,
            })?;
        }
        let attended = self.attention.attend(
            &queries,
            positions,
            &layer_kv.segments()?,
            layer_kv.held_positions(),
            kv.parallel_contexts(),
        )?;
        self.finish(hidden, &attended)
    }

    /// The row-wise rest of the layer after attention: output projection, residual, MLP,
    /// residual. Shared with batched decode, which stacks one row per sequence.
    pub(crate) fn finish(&self, hidden: &Tensor, attended: &Tensor) -> Result<Tensor, EngineError> {
        let attention_out = self.attention.attn_output.forward(attended)?;
        let attention_out = match &self.post_attention_norm {
            Some(norm) => norm.forward(&attention_out)?,
            None => attention_out,
        };
        let hidden = (hidden + attention_out)?;

        let mlp_out = self.mlp.forward(&self.ffn_norm.forward(&hidden)?)?;
        let mlp_out = match &self.post_ffw_norm {
            Some(norm) => norm.forward(&mlp_out)?,
            None => mlp_out,
        };
        Ok((hidden + mlp_out)?)
    }

    fn project_kv(
        &self,
        hidden: &Tensor,
        context: &ForwardContext,
    ) -> Result<(Tensor, Tensor), EngineError> {
        let x = self.attn_norm.forward(hidden)?;
        let tables = context.rope_tables(&self.attention.rope, hidden.device())?;
        self.attention.keys_values(&SharedInput::new(&x), &tables)
    }

    /// The attention's input: `hidden` normed `(n_tokens, d_model)`, and RoPE tables for
    /// `positions`.
    pub(crate) fn normed(
        &self,
        hidden: &Tensor,
        positions: &[u32],
    ) -> Result<(Tensor, RotaryTables), EngineError> {
        let x = self.attn_norm.forward(hidden)?;
        let tables = self
            .attention
            .rope
            .tables(&positions_as_offsets(positions), hidden.device())?;
        Ok((x, tables))
    }
}

/// A loaded model of either family: configuration and read-only weights. Run state lives in
/// the [`KvCache`] the caller passes in.
#[derive(Clone, Debug)]
pub struct Model {
    config: ModelConfig,
    format: WeightFormat,
    device: Device,
    kernels: Kernels,
    kv_dtype: DType,
    token_embd: Linear,
    pub(crate) blocks: Vec<Block>,
    output_norm: RmsNorm,
    /// `None`: tied to `token_embd` (no `output.weight` in the file).
    output: Option<Linear>,
}

impl Model {
    /// Loads a GGUF file of a supported architecture onto `device`, for its default kernels.
    pub fn load(path: &Path, format: WeightFormat, device: &Device) -> Result<Self, EngineError> {
        let gguf = GgufFile::open(path)?;
        let config = ModelConfig::from_gguf(&gguf)?;
        Self::from_source(config, &mut &gguf, format, device)
    }

    /// [`Self::from_source_on`] `device` with its default kernels.
    pub fn from_source(
        config: ModelConfig,
        source: &mut dyn TensorSource,
        format: WeightFormat,
        device: &Device,
    ) -> Result<Self, EngineError> {
        Self::from_source_on(config, source, format, &Backend::on(device))
    }

    /// Builds a model from tensors named as llama.cpp names them in GGUF files, on the
    /// backend's device, for its kernels.
    pub fn from_source_on(
        config: ModelConfig,
        source: &mut dyn TensorSource,
        format: WeightFormat,
        backend: &Backend,
    ) -> Result<Self, EngineError> {
        Self::from_source_cached(config, source, format, backend, None)
    }

    /// Loads `gguf` on the backend, its matrices' layouts read in place from the layout cache
    /// in `layout_cache_dir` where an earlier load wrote them (and written there where not):
    /// see `layout_cache`. The cache serves only our kernels' layouts (the quantized format,
    /// native kernels on an AVX2 CPU); otherwise, or with no directory, this is
    /// [`Self::from_source_on`].
    pub fn from_gguf_on(
        gguf: &GgufFile,
        format: WeightFormat,
        backend: &Backend,
        layout_cache_dir: Option<&Path>,
    ) -> Result<Self, EngineError> {
        let config = ModelConfig::from_gguf(gguf)?;
        let cache = layout_cache_dir
            .filter(|_| LayoutCache::serves(format, backend))
            .map(|dir| LayoutCache::open(dir, gguf));
        Self::from_source_cached(config, &mut &*gguf, format, backend, cache)
    }

    fn from_source_cached(
        config: ModelConfig,
        source: &mut dyn TensorSource,
        format: WeightFormat,
        backend: &Backend,
        cache: Option<LayoutCache>,
    ) -> Result<Self, EngineError> {
        let device = &backend.device;
        let mut config = config;
        if config.rope_frequency_factors.is_none() && source.contains(ROPE_FREQS) {
            let factors = source.stored(ROPE_FREQS)?.dequantize(device)?;
            let factors = factors
                .flatten_all()?
                .to_dtype(DType::F64)?
                .to_vec1::<f64>()?;
            config.rope_frequency_factors = Some(factors);
        }
        config.validate()?;
        if !matches!(backend.kv_dtype, DType::F16 | DType::BF16 | DType::F32) {
            return Err(EngineError::InvalidConfig(format!(
                "a KV cache of {:?}: the cache holds f16, bf16 or f32",
                backend.kv_dtype
            )));
        }
        if let Some(name) = LONG_ROPE_FACTORS.iter().find(|name| source.contains(name)) {
            // Phi-3.5's LongRoPE picks one of two factor sets by context length and rescales
            // the rotation's magnitude: not implemented, so refused rather than run wrong.
            return Err(EngineError::InvalidConfig(format!(
                "LongRoPE (`{name}`, Phi-3.5 / Phi-3-128k) is not supported; Phi-3 files \
                 without it (Phi-3-mini-4k) are"
            )));
        }
        let mut split = SplitFused::new(
            source,
            config.n_heads * config.head_dim,
            config.n_kv_heads * config.head_dim,
            config.ffn_dim,
        );
        let source: &mut dyn TensorSource = &mut split;
        let mut reordered;
        let source: &mut dyn TensorSource = if config.rope_pairs_adjacent {
            reordered = NeoxRows {
                inner: source,
                n_heads: config.n_heads,
                n_kv_heads: config.n_kv_heads,
            };
            &mut reordered
        } else {
            source
        };
        match cache {
            Some(cache) => {
                let mut cached = LayoutCached {
                    inner: source,
                    cache,
                };
                let model = Self::from_layers_of(config, &mut cached, format, backend)?;
                cached.cache.finish();
                Ok(model)
            }
            None => Self::from_layers_of(config, source, format, backend),
        }
    }

    /// The embedding, layers, norm and head from `source`, whose tensors are as every family's
    /// (fused matrices split, Q/K rows in the RoPE pairing).
    fn from_layers_of(
        config: ModelConfig,
        source: &mut dyn TensorSource,
        format: WeightFormat,
        backend: &Backend,
    ) -> Result<Self, EngineError> {
        let device = &backend.device;
        let tied = !source.contains("output.weight");
        let embedding_role = if tied {
            MatrixRole::OutputHead
        } else {
            MatrixRole::Lookup
        };
        let token_embd = Linear::load(
            source,
            "token_embd.weight",
            None,
            embedding_role,
            format,
            backend,
        )?;
        if token_embd.out_features() != config.vocab_size {
            return Err(EngineError::InvalidWeights(format!(
                "token_embd.weight has {} rows for a vocabulary of {}",
                token_embd.out_features(),
                config.vocab_size
            )));
        }
        let blocks = (0..config.n_layers)
            .map(|layer_idx| Block::new(source, layer_idx, &config, format, backend))
            .collect::<Result<_, _>>()?;
        let output_norm = RmsNorm::load(
            source,
            "output_norm.weight",
            config.d_model,
            config.rms_norm_eps,
            device,
        )?;
        let output = if tied {
            None
        } else {
            let role = MatrixRole::OutputHead;
            Some(Linear::load(
                source,
                "output.weight",
                None,
                role,
                format,
                backend,
            )?)
        };
        Ok(Self {
            config,
            format,
            device: device.clone(),
            kernels: backend.kernels,
            kv_dtype: backend.kv_dtype,
            token_embd,
            blocks,
            output_norm,
            output,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn weight_format(&self) -> WeightFormat {
        self.format
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The kernels this model was loaded for.
    pub fn kernels(&self) -> Kernels {
        self.kernels
    }

    /// Shape of this model's KV cache.
    pub fn kv_layout(&self) -> KvLayout {
        KvLayout {
            n_layers: self.config.n_layers,
            n_kv_heads: self.config.n_kv_heads,
            head_dim: self.config.head_dim,
            dtype: self.kv_dtype,
        }
    }

    pub fn new_kv_cache(&self) -> Result<KvCache, EngineError> {
        Ok(KvCache::new(self.kv_layout(), &self.device)?)
    }

    /// `blocks` spliced into a cache for queries at `first_query` or later, with room for
    /// `reserve` more slots: the sliding-window layers hold only the slots such a query can
    /// see (see [`KvCache::from_blocks_for`]).
    pub fn splice_for_queries(
        &self,
        blocks: &[&KvBlock],
        reserve: usize,
        first_query: u32,
    ) -> Result<KvCache, EngineError> {
        let windows: Vec<Option<usize>> = self
            .config
            .layers
            .iter()
            .map(|layer| layer.sliding_window)
            .collect();
        Ok(KvCache::from_blocks_for(
            self.kv_layout(),
            &self.device,
            blocks,
            reserve,
            Some(QueryHorizon {
                first_query,
                windows: &windows,
            }),
        )?)
    }

    /// Bytes held by the weights (every copy the format keeps).
    pub fn weights_size_in_bytes(&self) -> usize {
        self.linears().map(Linear::size_in_bytes).sum()
    }

    /// Bytes of the weights read in place from a mapped file (the layout cache's, see
    /// [`Self::from_gguf_on`], or the GGUF's lookup table) rather than built in memory.
    pub fn weights_in_place_bytes(&self) -> usize {
        self.linears().map(Linear::in_place_bytes).sum()
    }

    fn linears(&self) -> impl Iterator<Item = &Linear> {
        let linears = self.blocks.iter().flat_map(|block| {
            let attention = &block.attention;
            let mlp = &block.mlp;
            [
                &attention.attn_q,
                &attention.attn_k,
                &attention.attn_v,
                &attention.attn_output,
                &mlp.ffn_gate,
                &mlp.ffn_up,
                &mlp.ffn_down,
            ]
        });
        std::iter::once(&self.token_embd)
            .chain(self.output.as_ref())
            .chain(linears)
    }

    /// Token embeddings `(n_tokens, d_model)`, scaled as the family requires.
    pub fn embed(&self, tokens: &[u32]) -> Result<Tensor, EngineError> {
        if let Some(&token) = tokens
            .iter()
            .find(|&&token| token as usize >= self.config.vocab_size)
        {
            return Err(EngineError::InvalidInput(format!(
                "token id {token} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let ids = Tensor::new(tokens, &self.device)?;
        let hidden = self.token_embd.rows(&ids)?;
        Ok(match self.config.embedding_scale {
            Some(scale) => (hidden * scale)?,
            None => hidden,
        })
    }

    /// One layer for the tokens of `context` (any subset of a sequence): their fresh K/V
    /// overwrite or extend the cache at `context.slots()`, their queries attend over every slot
    /// of the layer under the position mask, and the MLP follows. `hidden` is the layer's input
    /// for those tokens, `(context.len(), d_model)`; returns the layer's output.
    pub fn forward_layer(
        &self,
        layer_idx: usize,
        hidden: &Tensor,
        context: &ForwardContext,
        kv: &mut KvCache,
    ) -> Result<Tensor, EngineError> {
        let block = self.block(layer_idx)?;
        let hidden = &self.checked_hidden(hidden, context.len())?;
        self.check_cache(kv)?;
        block.forward(hidden, context, layer_idx, kv, None)
    }

    /// K (after RoPE at the context's positions; its slots are not used) and V `(n_tokens,
    /// n_kv_heads, head_dim)` that layer `layer_idx` computes from its input hidden states:
    /// attention norm, projections (+bias), q/k norm where the family has one, RoPE. Nothing is
    /// written to any cache. Hidden states of another dtype (stored ones are f16) are widened to
    /// the activation dtype first. Layers projected with one context share its RoPE tables.
    pub fn project_kv(
        &self,
        layer_idx: usize,
        hidden: &Tensor,
        context: &ForwardContext,
    ) -> Result<(Tensor, Tensor), EngineError> {
        let block = self.block(layer_idx)?;
        let hidden = self.checked_hidden(hidden, context.len())?;
        block.project_kv(&hidden, context)
    }

    /// [`Self::forward_layer`], showing `observer` the layer's attention (the tokens' queries and
    /// every slot's keys and values) before the tokens attend.
    pub fn forward_layer_observed(
        &self,
        layer_idx: usize,
        hidden: &Tensor,
        context: &ForwardContext,
        kv: &mut KvCache,
        observer: &mut dyn AttentionObserver,
    ) -> Result<Tensor, EngineError> {
        let block = self.block(layer_idx)?;
        let hidden = &self.checked_hidden(hidden, context.len())?;
        self.check_cache(kv)?;
        block.forward(hidden, context, layer_idx, kv, Some(observer))
    }

    /// Final norm and LM head for rows `rows` of the last layer's output: `(rows.len(), vocab)`.
    pub fn logits(&self, hidden: &Tensor, rows: &[usize]) -> Result<Tensor, EngineError> {
        let n_tokens = hidden.dim(0)?;
        if let Some(&row) = rows.iter().find(|&&row| row >= n_tokens) {
            return Err(EngineError::InvalidInput(format!(
                "logits of row {row} of {n_tokens}"
            )));
        }
        let row_ids: Vec<u32> = rows.iter().map(|&row| row as u32).collect();
        let selected = hidden.index_select(&Tensor::new(row_ids.as_slice(), &self.device)?, 0)?;
        let normed = self.output_norm.forward(&selected)?;
        let logits = self
            .output
            .as_ref()
            .unwrap_or(&self.token_embd)
            .forward(&normed)?;
        Ok(match self.config.final_logit_softcap {
            Some(cap) => ((logits / cap)?.tanh()? * cap)?,
            None => logits,
        })
    }

    /// Appends `tokens` at `positions` after everything in `kv` and returns the logits of the
    /// last token, `(vocab_size,)`.
    pub fn forward(
        &self,
        tokens: &[u32],
        positions: &[u32],
        kv: &mut KvCache,
    ) -> Result<Tensor, EngineError> {
        let context = ForwardContext::appending(positions.to_vec(), kv);
        let output = self.forward_with(tokens, &context, kv, &ForwardOptions::default())?;
        let logits = output
            .logits
            .ok_or_else(|| EngineError::InvalidInput("no tokens to run".to_string()))?;
        Ok(logits.squeeze(0)?)
    }

    /// Every layer in turn for `tokens` placed by `context`, built from [`Self::embed`],
    /// [`Self::forward_layer`] and [`Self::logits`].
    pub fn forward_with(
        &self,
        tokens: &[u32],
        context: &ForwardContext,
        kv: &mut KvCache,
        options: &ForwardOptions,
    ) -> Result<ForwardOutput, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::InvalidInput("no tokens to run".to_string()));
        }
        if tokens.len() != context.len() {
            return Err(EngineError::InvalidInput(format!(
                "{} tokens for a context of {}",
                tokens.len(),
                context.len()
            )));
        }
        self.check_cache(kv)?;
        kv.check_consistent()?;
        let mut hidden = self.embed(tokens)?;
        let mut layer_inputs = Vec::new();
        for layer_idx in 0..self.config.n_layers {
            if options.keep_layer_inputs {
                layer_inputs.push(hidden.clone());
            }
            hidden = self.forward_layer(layer_idx, &hidden, context, kv)?;
        }
        let rows: Vec<usize> = match &options.logits {
            LogitRows::None => Vec::new(),
            LogitRows::Last => tokens.len().checked_sub(1).into_iter().collect(),
            LogitRows::All => (0..tokens.len()).collect(),
            LogitRows::Rows(rows) => rows.clone(),
        };
        let logits = match options.logits {
            LogitRows::None => None,
            _ if rows.is_empty() => None,
            _ => Some(self.logits(&hidden, &rows)?),
        };
        Ok(ForwardOutput {
            logits,
            layer_inputs,
            hidden,
        })
    }

    /// The same K/V moved to `new_positions`: each layer's K is rotated by the position delta
    /// with that layer's RoPE (rotations compose) into the cache's dtype, V is unchanged (and
    /// keeps its dtype: the splice converts it).
    pub fn reposition(
        &self,
        block: &KvBlock,
        new_positions: &[u32],
    ) -> Result<KvBlock, EngineError> {
        if new_positions.len() != block.len() || block.n_layers() != self.config.n_layers {
            return Err(EngineError::InvalidInput(format!(
                "{} new positions for a block of {} slots and {} layers",
                new_positions.len(),
                block.len(),
                block.n_layers()
            )));
        }
        let layers = block
            .layers()?
            .iter()
            .enumerate()
            .map(|(layer_idx, (keys, values))| {
                let rotated =
                    self.reposition_keys(layer_idx, keys, block.positions(), new_positions)?;
                Ok((rotated, values.clone()))
            })
            .collect::<Result<_, EngineError>>()?;
        Ok(KvBlock::new(layers, new_positions.to_vec())?)
    }

    /// Layer `layer_idx`'s K rows `(n, kv_heads, head_dim)`, rotated at `old_positions`, moved
    /// to `new_positions` with that layer's RoPE: what [`Self::reposition`] does per layer, for
    /// a caller that holds one layer at a time (a pipelined splice). The result is in the KV
    /// cache's dtype whatever `keys` holds: rotated f16 rows from the store are not rounded to
    /// f16 a second time.
    pub fn reposition_keys(
        &self,
        layer_idx: usize,
        keys: &Tensor,
        old_positions: &[u32],
        new_positions: &[u32],
    ) -> Result<Tensor, EngineError> {
        let rows = keys.dim(0)?;
        if old_positions.len() != rows || new_positions.len() != rows {
            return Err(EngineError::InvalidInput(format!(
                "{rows} key rows moved from {} to {} positions",
                old_positions.len(),
                new_positions.len()
            )));
        }
        let deltas: Vec<f64> = new_positions
            .iter()
            .zip(old_positions)
            .map(|(&new, &old)| f64::from(new) - f64::from(old))
            .collect();
        let tables = self
            .block(layer_idx)?
            .attention
            .rope
            .tables(&deltas, &self.device)?;
        let rotated = RotaryEmbedding::apply(&keys.to_dtype(ACTIVATION_DTYPE)?, &tables)?;
        Ok(rotated.to_dtype(self.kv_layout().dtype)?)
    }

    fn block(&self, layer_idx: usize) -> Result<&Block, EngineError> {
        self.blocks.get(layer_idx).ok_or_else(|| {
            EngineError::InvalidInput(format!(
                "layer {layer_idx} of a model with {} layers",
                self.config.n_layers
            ))
        })
    }

    /// `hidden` checked for `n_tokens` rows of the model's width, on the model's device in the
    /// activation dtype (hidden states read from a store are f16 on the host).
    fn checked_hidden(&self, hidden: &Tensor, n_tokens: usize) -> Result<Tensor, EngineError> {
        if hidden.dims() != [n_tokens, self.config.d_model] {
            return Err(EngineError::InvalidInput(format!(
                "hidden states {:?} for {n_tokens} tokens of width {}",
                hidden.dims(),
                self.config.d_model
            )));
        }
        Ok(hidden.to_device(&self.device)?.to_dtype(ACTIVATION_DTYPE)?)
    }

    pub(crate) fn check_cache(&self, kv: &KvCache) -> Result<(), EngineError> {
        if *kv.layout() != self.kv_layout() {
            return Err(EngineError::InvalidInput(format!(
                "a KV cache of layout {:?} for a model of layout {:?}",
                kv.layout(),
                self.kv_layout()
            )));
        }
        Ok(())
    }
}
