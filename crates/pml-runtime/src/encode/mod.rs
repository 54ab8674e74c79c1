//! Module encoding: computing and storing the KV of every unit of a laid-out schema
//! ([`encode_schema`]), root first, then modules in pre-order, and recording the schema's
//! manifest in the store.
//!
//! Scaffolded (the default, design §3): a unit's tokens are computed in one forward pass after its
//! context — the rows of its root and ancestors at positions below its start, spliced from their
//! stored KV — and only the unit's own rows are kept. Isolated (the Prompt Cache paper): the
//! context is BOS alone. Each unit is stored under a key of the model, the mode, its tokens and
//! positions and its context, so encoding again computes only the units whose key is not in the
//! store yet.
//!
//! - [`context`]: which rows a unit attends to; row selection; layout checks.
//! - [`unit_encoder`]: one unit's state on demand (memory, store, or encoded now), and its key.
//! - [`chunked`]: position-ordered prefill in bounded passes.
//! - [`kept`]: compressed states, a unit's heavy-hitter rows only (`pmlc compile --keep F`).

pub mod chunked;
pub mod context;
pub mod kept;
pub mod unit_encoder;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use pml_compiler::plan::{EncodeMode, LayoutUnit, SchemaLayout, UnitId};

use crate::store::{
    KeepFraction, Manifest, ManifestUnit, ModuleStore, PutOutcome, StoreError, StoreKey,
};
use pml_engine::kv_cache::KvCacheError;
use pml_engine::model::{EngineError, Model};

pub use unit_encoder::{
    PartialUnit, StateOrigin, UnitChunk, UnitEncoder, UnitMemory, UnitStart, describe,
};

/// Why a schema could not be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error(transparent)]
    Engine(Box<EngineError>),
    #[error(transparent)]
    KvCache(#[from] KvCacheError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("invalid layout: {0}")]
    InvalidLayout(String),
}

impl From<EngineError> for EncodeError {
    fn from(error: EngineError) -> Self {
        EncodeError::Engine(Box::new(error))
    }
}

impl From<candle_core::Error> for EncodeError {
    fn from(error: candle_core::Error) -> Self {
        EncodeError::Engine(Box::new(EngineError::Tensor(error)))
    }
}

/// How to encode.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EncodeOptions {
    pub mode: EncodeMode,
    /// The model's BOS token, if it uses one (see [`pml_compiler::Tokenizer::bos_token`]).
    pub bos: Option<u32>,
    /// Store each unit's heavy hitters only, this fraction of its rows (`None`: every row).
    pub keep: Option<KeepFraction>,
}

/// What happened to one unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnitOutcome {
    /// Computed and stored now.
    Encoded,
    /// Its key was already in the store.
    Reused,
    /// No tokens of its own (only nested modules).
    Empty,
}

/// Progress of [`encode_schema`], for a progress bar.
#[derive(Clone, Copy, Debug)]
pub enum EncodeEvent<'a> {
    /// Before the first unit.
    Start { n_units: usize, n_tokens: usize },
    /// Another process sharing the store is encoding `unit`: this run waits for it, then reuses
    /// its state.
    Waiting { unit: &'a LayoutUnit },
    /// After unit number `index` (0-based, in encoding order).
    Unit {
        index: usize,
        unit: &'a LayoutUnit,
        outcome: UnitOutcome,
    },
}

/// One unit's line of the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnitReport {
    pub unit: UnitId,
    /// `a/b` path of the module; empty for the root.
    pub path: String,
    pub n_tokens: usize,
    pub outcome: UnitOutcome,
    /// The unit's store key; `None` for an empty unit (nothing stored).
    pub key: Option<StoreKey>,
    /// Whether the store holds its state now (`false`: encoded, but the store could not take
    /// it).
    pub stored: bool,
}

/// What [`encode_schema`] did.
#[derive(Clone, Debug, PartialEq)]
pub struct EncodeReport {
    pub schema_name: String,
    pub mode: EncodeMode,
    /// The fraction of each unit's rows its state keeps (`None`: all).
    pub keep: Option<KeepFraction>,
    pub units: Vec<UnitReport>,
    pub elapsed: Duration,
    /// Stored states found unusable and re-encoded.
    pub warnings: Vec<String>,
    /// Where the schema's manifest was written; `None` when the store could not be written
    /// (said among the warnings).
    pub manifest_path: Option<PathBuf>,
}

impl EncodeReport {
    pub fn n_encoded(&self) -> usize {
        self.count(UnitOutcome::Encoded)
    }

    /// The units encoded now whose states the store could not take, by path (`the root` for
    /// the schema's own text).
    pub fn not_stored(&self) -> Vec<String> {
        self.units
            .iter()
            .filter(|unit| !unit.stored)
            .map(|unit| {
                if unit.path.is_empty() {
                    "the root".to_string()
                } else {
                    format!("module `{}`", unit.path)
                }
            })
            .collect()
    }

    pub fn n_reused(&self) -> usize {
        self.count(UnitOutcome::Reused)
    }

    /// Tokens computed in this run.
    pub fn tokens_encoded(&self) -> usize {
        self.units
            .iter()
            .filter(|unit| unit.outcome == UnitOutcome::Encoded)
            .map(|unit| unit.n_tokens)
            .sum()
    }

    fn count(&self, outcome: UnitOutcome) -> usize {
        self.units
            .iter()
            .filter(|unit| unit.outcome == outcome)
            .count()
    }
}

/// Encodes every unit of `layout` that `store` does not hold yet, in layout order (root first,
/// then modules in pre-order), reporting each unit to `progress`, then writes the schema's
/// manifest.
pub fn encode_schema(
    model: &Model,
    layout: &SchemaLayout,
    options: EncodeOptions,
    store: &ModuleStore,
    progress: &mut dyn FnMut(EncodeEvent<'_>),
) -> Result<EncodeReport, EncodeError> {
    let mut run = EncodeRun::new(layout, store, progress);
    loop {
        let step = EncodeStep {
            max_tokens: usize::MAX,
            max_units: usize::MAX,
            pass_tokens: 0,
        };
        if let Some(report) = run.advance(model, layout, options, store, step, progress)? {
            return Ok(report);
        }
    }
}

/// How much of an [`EncodeRun`] one call of [`EncodeRun::advance`] may do: it stops after the
/// unit that reaches either bound (so it always does one unit or more).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EncodeStep {
    /// Tokens computed (units encoded now; stored ones cost a look-up).
    pub max_tokens: usize,
    /// Units visited, computed or not.
    pub max_units: usize,
    /// What a forward pass counts against `max_tokens` however few tokens it computes: a pass
    /// reads every weight, so a short unit costs about what this many tokens do (on a 0.5B model
    /// on two cores, a 6-token unit takes as long as a 30-token chunk).
    pub pass_tokens: usize,
}

/// What one [`EncodeRun::visit`] does.
#[derive(Clone, Copy)]
enum Visit {
    /// Computes chunks within the step.
    Compute(EncodeStep),
    /// Stops at the first unit with tokens left to compute, its chunks left to the caller.
    ToChunk { max_units: usize },
}

/// A schema's encoding in steps, so a server can encode between its other work instead of
/// stopping it for a whole schema. It holds no borrow: each step takes the model, layout and
/// store again (the layout must be the one it began with), and reads the states of the units it
/// needs as context from the store, where the steps before put them.
#[derive(Debug)]
pub struct EncodeRun {
    started: Instant,
    /// The next unit, by index in layout order.
    next: usize,
    previous: Option<Manifest>,
    units: Vec<UnitReport>,
    manifest_units: Vec<ManifestUnit>,
    warnings: Vec<String>,
    /// The states the encoders of the steps before held.
    memory: UnitMemory,
    /// The unit a step left part way through.
    pending: Option<Box<PartialUnit>>,
}

impl EncodeRun {
    /// Begins encoding `layout` (reported to `progress` as [`EncodeEvent::Start`]).
    pub fn new(
        layout: &SchemaLayout,
        store: &ModuleStore,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> Self {
        progress(EncodeEvent::Start {
            n_units: layout.units.len(),
            n_tokens: layout.units.iter().map(|unit| unit.tokens.len()).sum(),
        });
        Self {
            started: Instant::now(),
            next: 0,
            previous: store.read_manifest(&layout.schema_name).found(),
            units: Vec::with_capacity(layout.units.len()),
            manifest_units: Vec::with_capacity(layout.units.len()),
            warnings: Vec::new(),
            memory: UnitMemory::default(),
            pending: None,
        }
    }

    /// Units done so far.
    pub fn units_done(&self) -> usize {
        self.next
    }

    /// Encodes the next units, within `step`; once the last is done, writes the manifest and
    /// returns the report. A unit longer than `step.max_tokens` is computed over several steps,
    /// in equal chunks of at most that many tokens.
    pub fn advance(
        &mut self,
        model: &Model,
        layout: &SchemaLayout,
        options: EncodeOptions,
        store: &ModuleStore,
        step: EncodeStep,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> Result<Option<EncodeReport>, EncodeError> {
        self.visit(
            model,
            layout,
            options,
            store,
            Visit::Compute(step),
            progress,
        )
    }

    /// Like [`Self::advance`], but computes nothing: visits up to `max_units` units that need
    /// no pass (found in the store, empty), stores the unit whose chunks the caller's passes
    /// have computed, and begins the next unit to compute, whose chunks are then the caller's
    /// to run beside its other rows ([`Self::pending_chunk`], [`Self::chunk_computed`]): a
    /// server's step reads the weights once for its decoding sequences and the encoding.
    pub fn advance_to_chunk(
        &mut self,
        model: &Model,
        layout: &SchemaLayout,
        options: EncodeOptions,
        store: &ModuleStore,
        max_units: usize,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> Result<Option<EncodeReport>, EncodeError> {
        let visit = Visit::ToChunk { max_units };
        self.visit(model, layout, options, store, visit, progress)
    }

    /// The next chunk, of at most `max_tokens`, of the unit [`Self::advance_to_chunk`] began;
    /// `None` when there is none or its tokens are all computed.
    pub fn pending_chunk<'a>(
        &'a mut self,
        layout: &'a SchemaLayout,
        max_tokens: usize,
    ) -> Option<UnitChunk<'a>> {
        self.pending.as_mut()?.next_chunk(layout, max_tokens)
    }

    /// Whether a unit is begun with tokens left to compute: until a pass has computed them,
    /// [`Self::advance_to_chunk`] has nothing to do.
    pub fn computing(&self, layout: &SchemaLayout) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|partial| !partial.is_computed(layout))
    }

    /// A pass has appended the chunk [`Self::pending_chunk`] gave to its cache.
    pub fn chunk_computed(&mut self) {
        if let Some(partial) = self.pending.as_mut() {
            partial.chunk_computed();
        }
    }

    /// The loop of [`Self::advance`] and [`Self::advance_to_chunk`].
    fn visit(
        &mut self,
        model: &Model,
        layout: &SchemaLayout,
        options: EncodeOptions,
        store: &ModuleStore,
        visit: Visit,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> Result<Option<EncodeReport>, EncodeError> {
        let mut encoder = UnitEncoder::new(model, layout, options.mode, options.bos, store)?
            .with_keep(options.keep)
            .with_memory(std::mem::take(&mut self.memory));
        let (step, compute) = match visit {
            Visit::Compute(step) => (step, true),
            Visit::ToChunk { max_units } => {
                let step = EncodeStep {
                    max_tokens: usize::MAX,
                    max_units,
                    pass_tokens: 0,
                };
                (step, false)
            }
        };
        let max_chunk = step.max_tokens.min(chunked::MAX_CHUNK_TOKENS);
        let (mut tokens, mut visited) = (0, 0);
        while let Some(unit) = layout.units.get(self.next)
            && tokens < step.max_tokens
            && visited < step.max_units
        {
            let started = match self.pending.take() {
                Some(partial) => UnitStart::Computing(partial),
                None => encoder.begin_unit(unit.id, max_chunk, &mut |waiting| {
                    progress(EncodeEvent::Waiting { unit: waiting })
                })?,
            };
            let outcome = match started {
                UnitStart::Done(StateOrigin::Encoded) => UnitOutcome::Encoded,
                UnitStart::Done(StateOrigin::Store | StateOrigin::Memory) => UnitOutcome::Reused,
                UnitStart::Done(StateOrigin::Empty) => UnitOutcome::Empty,
                UnitStart::Computing(mut partial) => {
                    if compute {
                        let computed =
                            encoder.compute_chunks(&mut partial, step.max_tokens - tokens)?;
                        tokens += computed.max(step.pass_tokens);
                    }
                    if partial.is_computed(layout) {
                        encoder.finish_unit(*partial)?;
                        UnitOutcome::Encoded
                    } else {
                        self.pending = Some(partial);
                        break;
                    }
                }
            };
            let key = match outcome {
                UnitOutcome::Empty => None,
                _ => Some(encoder.key(unit.id)?),
            };
            if let Some(key) = &key {
                self.manifest_units.push(ManifestUnit {
                    unit_id: unit.id.0,
                    path: unit.path.clone(),
                    key: key.clone(),
                    n_tokens: unit.tokens.len(),
                    bytes: stored_bytes(&encoder, model, unit, key, self.previous.as_ref()),
                });
            }
            visited += 1;
            self.units.push(UnitReport {
                unit: unit.id,
                path: unit.path.join("/"),
                n_tokens: unit.tokens.len(),
                outcome,
                stored: outcome != UnitOutcome::Encoded || encoder.stored(unit.id),
                key,
            });
            progress(EncodeEvent::Unit {
                index: self.next,
                unit,
                outcome,
            });
            self.next += 1;
        }
        self.warnings.extend_from_slice(encoder.warnings());
        self.memory = encoder.into_memory();
        if self.next < layout.units.len() {
            return Ok(None);
        }
        let manifest = Manifest::new(
            layout.schema_name.clone(),
            store.spec().model_fingerprint.clone(),
            options.mode,
            std::mem::take(&mut self.manifest_units),
        )
        .with_keep(options.keep);
        let manifest_path = match store.write_manifest(&manifest) {
            Ok(path) => Some(path),
            Err(error @ StoreError::Io { .. }) => {
                self.warnings.push(format!(
                    "the schema's manifest cannot be written ({error}): its states are used \
                     for this run only"
                ));
                None
            }
            Err(error) => return Err(error.into()),
        };
        Ok(Some(EncodeReport {
            schema_name: layout.schema_name.clone(),
            mode: options.mode,
            keep: options.keep,
            units: std::mem::take(&mut self.units),
            elapsed: self.started.elapsed(),
            warnings: std::mem::take(&mut self.warnings),
            manifest_path,
        }))
    }
}

/// Bytes a unit's state takes in the slowest tier that stored it (its file on disk): from this
/// run's put, else from the previous manifest, else the size of its K and V.
fn stored_bytes(
    encoder: &UnitEncoder<'_>,
    model: &Model,
    unit: &LayoutUnit,
    key: &StoreKey,
    previous: Option<&Manifest>,
) -> u64 {
    let from_put = encoder.puts(unit.id).and_then(|puts| {
        puts.iter().rev().find_map(|put| match put.outcome {
            PutOutcome::Stored { bytes } => Some(bytes),
            PutOutcome::TooLarge { .. } | PutOutcome::Unavailable => None,
        })
    });
    let from_previous = || {
        previous.and_then(|manifest| {
            manifest
                .units
                .iter()
                .find(|entry| entry.key == *key)
                .map(|entry| entry.bytes)
        })
    };
    from_put.or_else(from_previous).unwrap_or_else(|| {
        let layout = model.kv_layout();
        let row_bytes = 2 * layout.n_layers * layout.n_kv_heads * layout.head_dim;
        let value_bytes = encoder.store().spec().state_dtype.size_in_bytes();
        let rows = encoder
            .unit_keep(unit.id)
            .map_or(unit.tokens.len(), |keep| keep.rows_of(unit.tokens.len()));
        (row_bytes * value_bytes * rows) as u64
    })
}
