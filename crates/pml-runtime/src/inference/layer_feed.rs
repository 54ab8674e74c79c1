//! Pipelined splice for mode `blend` (CacheBlend §5, design §3): the cached spans' K/V arrive one
//! layer at a time from a loader thread, so reading, verifying and re-rotating layer `i + 1` of
//! every cached unit overlaps the compute of layer `i`.
//!
//! A unit is streamed when each of its layers is stored as its own entry
//! ([`crate::store::StateKind::KvLayer`] under [`UnitEncoder::layer_keys`]: the same unit, tokens,
//! positions and context as its whole-state entry, so the same content). The tier verifies an
//! entry's checksum, and the loader checks its kind, tokens and positions before handing it over.
//! A unit without per-layer entries is spliced from its whole state before the compute starts, as
//! mode `reuse` does (read, or encoded on the fly), and the loader writes its per-layer entries
//! once it has read everything else, so the next prompt streams it (each such unit is then held
//! twice in the store). A layer entry found missing or damaged mid-way (evicted; corrupt, which
//! the tier removes) switches its unit to its whole state for the layers still to come, with a
//! warning, and the unit is stored per layer again once the prefill is computed: slower, never
//! wrong. Before streaming, only the first layer to stream and the last are looked up (entries
//! are written in layer order; on Redis each lookup is a round trip).
//!
//! The blend algorithm calls [`LayerSource::place`] right before it reads or runs a layer;
//! [`with_cached_layers`] hands it either everything spliced up front or the streaming feed.

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use candle_core::Tensor;

use crate::encode::context::{select_rows, unit};
use crate::encode::unit_encoder::describe;
use crate::encode::{StateOrigin, UnitEncoder};
use crate::layer_stream::{LayerError, LayerReceiver, layer_id, read_layer, stream_layers};
use crate::store::{ModuleState, ModuleStore, StateKind, StoreKey};
use pml_engine::kv_cache::{KvBlock, KvCache};
use pml_engine::model::Model;

use super::blend_options::Pipelining;
use super::plan::{PlannedSpan, SplicePlan};
use super::reuse::{span_block, span_rows, span_state, splice};
use super::stats::{PipelineStats, PrefillStats};
use super::{InferenceError, InferenceMode};

/// How to build the cache of cached rows.
pub(super) struct CachedLayers {
    /// Slots to leave after the cached rows (new tokens, decoding).
    pub extra: usize,
    /// The first layer the caller will place: the layers before it are never loaded when
    /// streamed (the probe overwrites all their rows).
    pub first_layer: usize,
    pub pipelining: Pipelining,
}

/// Where the spliced rows of each layer come from.
pub(super) trait LayerSource {
    /// Makes layer `layer` (and every layer from the first one on before it) of the cached rows
    /// present in `kv`; a layer below the first one is an error.
    fn place(&mut self, layer: usize, kv: &mut KvCache) -> Result<(), InferenceError>;

    /// Time to load one layer's K/V of every cached row, as measured so far in this prefill
    /// (what the loading controller weighs against the recompute).
    fn load_per_layer(&self) -> Duration;
}

/// Everything spliced before the compute started.
pub(super) struct Spliced {
    /// What loading a layer took (zero where nothing was loaded from a store).
    pub(super) load_per_layer: Duration,
}

impl LayerSource for Spliced {
    fn place(&mut self, _layer: usize, _kv: &mut KvCache) -> Result<(), InferenceError> {
        Ok(())
    }

    fn load_per_layer(&self) -> Duration {
        self.load_per_layer
    }
}

/// Builds the cache of `plan`'s cached rows and runs `body` on it with the source of its layers:
/// streamed from the store as `layers.pipelining` says, else spliced up front (exactly
/// [`splice`]). Fills in the load, splice and pipeline parts of `stats`; when
/// streamed, `stats.compute` as set by `body` loses the time it waited for the loader (counted
/// in `stats.load`).
pub(super) fn with_cached_layers<T>(
    model: &Model,
    encoder: &mut UnitEncoder<'_>,
    plan: &SplicePlan,
    layers: CachedLayers,
    stats: &mut PrefillStats,
    body: impl FnOnce(
        &mut KvCache,
        &mut dyn LayerSource,
        &mut PrefillStats,
    ) -> Result<T, InferenceError>,
) -> Result<(KvCache, T), InferenceError> {
    let n_layers = model.config().n_layers;
    let CachedLayers {
        extra, first_layer, ..
    } = layers;
    if !should_stream(encoder, plan, layers.pipelining)? {
        // Blend recomputes cached rows at their own positions: every row stays.
        let mut kv = splice(model, encoder, plan, extra, None, stats)?;
        let mut source = Spliced {
            load_per_layer: stats.store_reads / n_layers.max(1) as u32,
        };
        let result = body(&mut kv, &mut source, stats)?;
        return Ok((kv, result));
    }

    let store = encoder.store();
    let warnings_before = encoder.warnings().len();
    let load_start = Instant::now();
    let Prepared {
        sources,
        streams,
        layering,
        blocks,
    } = prepare(model, encoder, plan, first_layer, stats)?;
    let mut slots = Vec::with_capacity(blocks.len());
    let mut offset = 0;
    for block in &blocks {
        slots.push(offset..offset + block.len());
        offset += block.len();
    }
    let eager_reads = stats.store_reads;
    let prepared = load_start.elapsed();

    let splice_start = Instant::now();
    let block_refs: Vec<&KvBlock> = blocks.iter().collect();
    let mut kv = KvCache::from_blocks(model.kv_layout(), model.device(), &block_refs, extra)?;
    drop(blocks);
    stats.splice = splice_start.elapsed();

    let abandoned: Vec<AtomicBool> = streams.iter().map(|_| AtomicBool::new(false)).collect();
    let fetch = |layer: usize| -> StreamedLayer {
        streams
            .iter()
            .zip(&abandoned)
            .map(|(stream, abandoned)| {
                (!abandoned.load(Ordering::Relaxed)).then(|| stream.fetch(model, store, layer))
            })
            .collect()
    };
    let consume = |receiver| {
        let mut feed = LayerFeed {
            model,
            encoder: &mut *encoder,
            spans: &plan.spans,
            sources,
            slots,
            abandoned: &abandoned,
            streams: &streams,
            relayer: Vec::new(),
            receiver,
            first_layer,
            next_layer: first_layer,
            eager_load_per_layer: eager_reads / n_layers.max(1) as u32,
            recovery: PrefillStats::new(InferenceMode::Reuse),
        };
        let result = body(&mut kv, &mut feed, stats);
        let account = PipelineStats {
            units_streamed: streams.len(),
            layers_streamed: feed.receiver.received(),
            fetch: feed.receiver.fetched(),
            waited: feed.receiver.waited(),
            ..PipelineStats::default()
        };
        // The receiver is dropped with the feed here, which stops a loader blocked on a full
        // channel (the body failed) before the loader's `after` work starts.
        (result, feed.recovery, account, feed.relayer)
    };
    let ((result, recovery, mut account, relayer), loader) = stream_layers(
        first_layer..n_layers,
        fetch,
        || store_per_layer(store, &layering),
        consume,
    )?;
    let result = result?;
    // Units that fell back mid-stream are stored per layer again now (once, after the answer's
    // prefill is computed), so the next prompt streams them.
    let relayered = store_per_layer(store, &relayer);
    account.units_layered = loader.units_layered + relayered.units_layered;
    stats.load = prepared + account.waited;
    stats.compute = stats.compute.saturating_sub(account.waited);
    stats.units_loaded += streams.len();
    stats.store_reads += recovery.store_reads;
    stats
        .units_encoded_on_the_fly
        .extend(recovery.units_encoded_on_the_fly);
    stats.warnings = encoder.warnings()[warnings_before..].to_vec();
    stats.warnings.extend(recovery.warnings);
    stats.warnings.extend(loader.failures);
    stats.warnings.extend(relayered.failures);
    stats.pipeline = Some(account);
    Ok((kv, result))
}

/// Each span's source and the work of the loader thread.
struct Prepared {
    sources: Vec<SpanSource>,
    streams: Vec<StreamedSpan>,
    /// Units spliced whole that lack per-layer entries.
    layering: Vec<LayeringJob>,
    /// Every span's rows: spliced whole, or zeros where they will be streamed.
    blocks: Vec<KvBlock>,
}

/// Sorts the spans into streamed ones (their per-layer entries are stored) and ones spliced from
/// their whole state now (recording those to store per layer).
fn prepare(
    model: &Model,
    encoder: &mut UnitEncoder<'_>,
    plan: &SplicePlan,
    first_layer: usize,
    stats: &mut PrefillStats,
) -> Result<Prepared, InferenceError> {
    let store = encoder.store();
    let mut prepared = Prepared {
        sources: Vec::with_capacity(plan.spans.len()),
        streams: Vec::new(),
        layering: Vec::new(),
        blocks: Vec::with_capacity(plan.spans.len()),
    };
    for span in &plan.spans {
        let keys = encoder.layer_keys(span.unit)?;
        if ends_stored(store, &keys, first_layer) {
            let layout_unit = unit(encoder.layout(), span.unit)?;
            prepared.streams.push(StreamedSpan {
                keys,
                unit_tokens: layout_unit.tokens.clone(),
                unit_positions: layout_unit.positions.clone(),
                rows: span.rows.clone(),
                encoded_positions: span.encoded_positions.clone(),
                positions: span.positions.clone(),
            });
            let stream = prepared.streams.len() - 1;
            prepared.sources.push(SpanSource::Streamed(stream));
            prepared.blocks.push(placeholder(model, span)?);
            continue;
        }
        let (state, origin) = span_state(encoder, span, stats)?;
        prepared.blocks.push(span_block(model, &state, span)?);
        prepared.sources.push(SpanSource::Whole);
        let queued = prepared
            .layering
            .iter()
            .any(|job| job.keys.first() == keys.first());
        if !matches!(origin, StateOrigin::Empty) && !state.is_empty() && !queued {
            let tokens = unit(encoder.layout(), span.unit)?.tokens.clone();
            prepared.layering.push(LayeringJob {
                keys,
                state,
                tokens,
            });
        }
    }
    Ok(prepared)
}

/// Whether to stream: as asked, or (auto) when some cached unit's state is not held in RAM.
fn should_stream(
    encoder: &UnitEncoder<'_>,
    plan: &SplicePlan,
    pipelining: Pipelining,
) -> Result<bool, InferenceError> {
    if encoder.keep().is_some() {
        // Per-layer entries hold every row of a unit; compressed states are read whole.
        return match pipelining {
            Pipelining::Always => Err(InferenceError::InvalidOptions(
                "compressed module states (compiled with --keep) are read whole: they cannot \
                 be streamed per layer (--pipeline on)"
                    .into(),
            )),
            Pipelining::Auto | Pipelining::Never => Ok(false),
        };
    }
    match pipelining {
        Pipelining::Never => Ok(false),
        Pipelining::Always => Ok(!plan.spans.is_empty()),
        Pipelining::Auto => {
            // The memory tiers come first (device, then RAM): a unit one of them holds is
            // handed out as it is, with nothing to stream.
            let memory: Vec<_> = encoder
                .store()
                .tiers()
                .iter()
                .take_while(|tier| tier.is_memory())
                .collect();
            for span in &plan.spans {
                let key = encoder.key(span.unit)?;
                let in_memory = memory
                    .iter()
                    .any(|tier| tier.contains(&key).unwrap_or(false));
                if !in_memory {
                    return Ok(true);
                }
            }
            Ok(false)
        }
    }
}

/// Whether the first layer to stream and the last one are in some tier (a tier that cannot answer
/// counts as not holding them). Per-layer entries are written in layer order, so an interrupted
/// write lacks the last; one lost in between (evicted, corrupt) is found when it is read and its
/// unit falls back then. Two lookups rather than one per layer: on Redis each is a round trip.
fn ends_stored(store: &ModuleStore, keys: &[StoreKey], first_layer: usize) -> bool {
    let ends = [keys.get(first_layer), keys.last()];
    ends.iter()
        .all(|key| key.is_some_and(|key| store.contains(key).unwrap_or(false)))
}

/// Zero rows at `span`'s positions, every layer (one shared tensor): the slots a streamed span's
/// layers are written into.
fn placeholder(model: &Model, span: &PlannedSpan) -> Result<KvBlock, InferenceError> {
    let layout = model.kv_layout();
    let zeros = Tensor::zeros(
        (span.rows.len(), layout.n_kv_heads, layout.head_dim),
        layout.dtype,
        model.device(),
    )?;
    let layers = vec![(zeros.clone(), zeros); layout.n_layers];
    Ok(KvBlock::new(layers, span.positions.clone())?)
}

/// What the loader needs to fetch one streamed span.
struct StreamedSpan {
    /// The unit's per-layer keys, layer 0 first.
    keys: Vec<StoreKey>,
    /// The unit's tokens and encoded positions, which every stored layer must hold.
    unit_tokens: Vec<u32>,
    unit_positions: Vec<u32>,
    rows: Vec<usize>,
    encoded_positions: Vec<u32>,
    positions: Vec<u32>,
}

impl StreamedSpan {
    /// Layer `layer` of the span's rows, read from `store`, checked, selected and re-rotated.
    fn fetch(
        &self,
        model: &Model,
        store: &ModuleStore,
        layer: usize,
    ) -> Result<(Tensor, Tensor), LayerError> {
        let key = self.keys.get(layer).ok_or(LayerError::NoKey { layer })?;
        let load = |key: &StoreKey| store.get(key).map(|hit| hit.map(|hit| hit.state));
        let kind = StateKind::KvLayer(layer_id(layer)?);
        let state = read_layer(
            load,
            key,
            layer,
            kind,
            &self.unit_tokens,
            &self.unit_positions,
        )?;
        let rows = select_rows(state.kv(), &self.rows).map_err(LayerError::engine(layer))?;
        let (keys, values) = rows.layer(0).map_err(LayerError::engine(layer))?;
        let keys = if self.positions != self.encoded_positions {
            model
                .reposition_keys(layer, keys, &self.encoded_positions, &self.positions)
                .map_err(LayerError::engine(layer))?
        } else {
            keys.clone()
        };
        Ok((keys, values.clone()))
    }
}

/// One layer of every streamed span (`None` for a span the compute side abandoned).
type StreamedLayer = Vec<Option<Result<(Tensor, Tensor), LayerError>>>;

/// A unit spliced whole whose per-layer entries the loader writes at the end.
struct LayeringJob {
    keys: Vec<StoreKey>,
    state: Arc<KvBlock>,
    tokens: Vec<u32>,
}

/// What the loader did besides streaming.
struct LoaderReport {
    units_layered: usize,
    failures: Vec<String>,
}

/// Stores each job's unit per layer; failures only cost the next prompt's speed, so they are
/// reported, not raised.
fn store_per_layer(store: &ModuleStore, jobs: &[LayeringJob]) -> LoaderReport {
    let mut report = LoaderReport {
        units_layered: 0,
        failures: Vec::new(),
    };
    for job in jobs {
        match write_layers(store, job) {
            Ok(()) => report.units_layered += 1,
            Err(error) => report
                .failures
                .push(format!("could not store a unit per layer: {error}")),
        }
    }
    report
}

/// Puts every layer of `job`'s unit under its per-layer key.
fn write_layers(store: &ModuleStore, job: &LayeringJob) -> Result<(), InferenceError> {
    for (layer, key) in job.keys.iter().enumerate() {
        let (keys, values) = job.state.layer(layer)?;
        let state = ModuleState::kv_layer(
            layer_id(layer)?,
            keys.clone(),
            values.clone(),
            job.state.positions().to_vec(),
            job.tokens.clone(),
        )
        .map_err(crate::encode::EncodeError::from)?;
        store
            .put(key, state)
            .map_err(crate::encode::EncodeError::from)?;
    }
    Ok(())
}

/// Where one span's rows come from.
enum SpanSource {
    /// Spliced from the unit's whole state before the compute: in the cache for every layer.
    Whole,
    /// Streamed by the loader (index into its spans).
    Streamed(usize),
    /// Streamed until a layer failed; the later layers come from these rows of the whole state.
    Recovered(KvBlock),
}

/// The compute side of the pipeline.
struct LayerFeed<'f, 'e, 'a> {
    model: &'f Model,
    encoder: &'e mut UnitEncoder<'a>,
    spans: &'f [PlannedSpan],
    sources: Vec<SpanSource>,
    /// Each span's slots in the cache.
    slots: Vec<Range<usize>>,
    abandoned: &'f [AtomicBool],
    streams: &'f [StreamedSpan],
    /// Units that fell back to their whole state, to store per layer again afterwards.
    relayer: Vec<LayeringJob>,
    receiver: LayerReceiver<StreamedLayer>,
    first_layer: usize,
    next_layer: usize,
    /// Whole states read before the compute, per layer.
    eager_load_per_layer: Duration,
    /// The accounting of units recovered from their whole state.
    recovery: PrefillStats,
}

impl LayerSource for LayerFeed<'_, '_, '_> {
    fn place(&mut self, layer: usize, kv: &mut KvCache) -> Result<(), InferenceError> {
        if layer < self.first_layer {
            return Err(LayerError::BeforeStream {
                layer,
                first: self.first_layer,
            }
            .into());
        }
        while self.next_layer <= layer {
            let current = self.next_layer;
            self.next_layer += 1;
            // `None`: the loader is gone; every streamed span falls back below.
            let mut loaded = match self.receiver.next(current) {
                Ok(loaded) => Some(loaded),
                Err(LayerError::LoaderStopped { .. }) => None,
                Err(error) => return Err(error.into()),
            };
            for index in 0..self.spans.len() {
                let rows = match &self.sources[index] {
                    SpanSource::Whole => continue,
                    SpanSource::Recovered(block) => {
                        let (keys, values) = block.layer(current)?;
                        (keys.clone(), values.clone())
                    }
                    SpanSource::Streamed(stream) => {
                        let fetched = loaded
                            .as_mut()
                            .and_then(|loaded| loaded.get_mut(*stream))
                            .and_then(Option::take);
                        match fetched {
                            Some(Ok(rows)) => rows,
                            Some(Err(reason)) => self.recover(index, *stream, current, &reason)?,
                            None => {
                                let reason = LayerError::LoaderStopped { layer: current };
                                self.recover(index, *stream, current, &reason)?
                            }
                        }
                    }
                };
                let span = &self.spans[index];
                let slots: Vec<usize> = self.slots[index].clone().collect();
                kv.write(current, &slots, &rows.0, &rows.1, &span.positions)?;
            }
        }
        Ok(())
    }

    fn load_per_layer(&self) -> Duration {
        let streamed = match self.receiver.received() {
            0 => Duration::ZERO,
            layers => self.receiver.fetched() / layers as u32,
        };
        self.eager_load_per_layer + streamed
    }
}

impl LayerFeed<'_, '_, '_> {
    /// Switches span `index` to its unit's whole state (read, or encoded now) after layer
    /// `layer` could not be streamed, and returns that layer's rows.
    fn recover(
        &mut self,
        index: usize,
        stream: usize,
        layer: usize,
        reason: &LayerError,
    ) -> Result<(Tensor, Tensor), InferenceError> {
        if let Some(flag) = self.abandoned.get(stream) {
            flag.store(true, Ordering::Relaxed);
        }
        let span = &self.spans[index];
        let block = span_rows(self.model, self.encoder, span, &mut self.recovery)?;
        if let Some(streamed) = self.streams.get(stream) {
            let (state, _) = self.encoder.state(span.unit)?;
            self.relayer.push(LayeringJob {
                keys: streamed.keys.clone(),
                state,
                tokens: streamed.unit_tokens.clone(),
            });
        }
        let layout_unit = unit(self.encoder.layout(), span.unit)?;
        self.recovery.warnings.push(format!(
            "{} could not be streamed ({reason}); spliced from its whole state",
            describe(layout_unit)
        ));
        let (keys, values) = block.layer(layer)?;
        let rows = (keys.clone(), values.clone());
        self.sources[index] = SpanSource::Recovered(block);
        Ok(rows)
    }
}
