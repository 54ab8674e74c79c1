//! [`Runtime`]: one loaded model with its tokenizer, chat template and module store — the API the
//! CLI and the server call.
//!
//! - [`Runtime::compile`]: a schema's source → check, layout, encode every unit the store lacks,
//!   manifest (`pmlc compile`).
//! - [`Runtime::run`]: a prompt's source and its schema's → layout, bind, cached inference in the
//!   chosen mode, streamed answer and statistics (`pml run`).
//!
//! Below those, [`Runtime::encode`] and [`Runtime::run_bound`] take the compiler's
//! [`SchemaLayout`] and [`BoundPrompt`] directly; [`Runtime::prefill`] stops after the prefill
//! (benchmarks and fidelity measurements compare its logits across modes).
//!
//! A prompt its model's context cannot hold is refused before anything is computed
//! ([`ContextError`]): `run`, `run_bound` and `prefill` check its positions and the answer's
//! `max_tokens` ([`Runtime::check_context`]); hosts bound a text's bytes before tokenizing it
//! ([`Runtime::max_prompt_bytes`], [`Runtime::check_prompt_bytes`]).

use std::path::Path;

use pml_compiler::chat_template::ChatTemplate;
use pml_compiler::plan::{BoundPrompt, EncodeMode, SchemaLayout};
use pml_compiler::{
    LaidOutSchema, PlanError, PlanModel, SourceLoader, Tokenizer, bind_source, lay_out_source,
};

use crate::chat::{ChatSetupError, model_chat_template};
use crate::encode::{
    EncodeError, EncodeEvent, EncodeOptions, EncodeReport, EncodeRun, EncodeStep, UnitEncoder,
    encode_schema,
};
use crate::kv_budget::KvBudget;
use crate::store::{KeepFraction, ModuleStore, StateSpec, StoreConfig, StoreError};
use crate::tokenizer::PmlTokenizer;
use pml_engine::device::{BackendChoice, DeviceError, select_backend};
use pml_engine::generation::{Generation, SamplingParams, Speculation};
use pml_engine::gguf::{GgufError, GgufFile};
use pml_engine::kv_cache::{KvCache, ParallelScaling};
use pml_engine::model::{EngineError, Model, WeightFormat};
use pml_engine::tokenizer::TokenizerError;

use super::context_limit::{self, ContextError, PromptByteLimit};
use super::model_load::load_model_and_tokenizer;
use super::plan::SplicePlan;
use super::stats::RunStats;
use super::{InferenceError, InferenceMode, Prefill};

/// Why a runtime could not be set up or a source could not be compiled or run.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error("cannot build the tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    ChatTemplate(#[from] ChatSetupError),
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The schema or prompt source has errors, or is the wrong kind of file.
    #[error(transparent)]
    Plan(#[from] PlanError),
    #[error(transparent)]
    Encode(#[from] EncodeError),
    #[error(transparent)]
    Inference(#[from] InferenceError),
    /// A draft model that cannot draft for this model.
    #[error("the draft model cannot draft for this model: {0}")]
    DraftModel(String),
}

/// How a runtime computes and where its store lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuntimeOptions {
    /// Where the model runs and which kernels run it.
    pub backend: BackendChoice,
    pub weight_format: WeightFormat,
    pub encode_mode: EncodeMode,
    pub store: StoreConfig,
}

impl RuntimeOptions {
    /// The default weight format and encoding mode, the device and kernels `$PML_DEVICE` and
    /// `$PML_KERNELS` name (else the CPU's), and the store under `$PML_HOME`.
    pub fn from_env() -> Result<Self, RuntimeError> {
        Ok(Self {
            backend: BackendChoice::resolve(None, None)?,
            weight_format: WeightFormat::default(),
            encode_mode: EncodeMode::default(),
            store: StoreConfig::from_env()?,
        })
    }
}

/// A model ready for cached inference.
pub struct Runtime {
    model: Model,
    tokenizer: PmlTokenizer,
    template: ChatTemplate,
    store: ModuleStore,
    encode_mode: EncodeMode,
    /// Module states hold this fraction of their rows (`pmlc compile --keep F`; `None`: all).
    keep: Option<KeepFraction>,
    /// Mode `reuse` attends spliced modules as parallel contexts with APE's correction.
    parallel_scaling: Option<ParallelScaling>,
    /// Answers decode within this many KV slots (`pml run --kv-budget`; `None`: unbounded).
    kv_budget: Option<KvBudget>,
    max_positions: u32,
    /// A smaller model of the same vocabulary, with its own module store, that drafts tokens
    /// for this one (`--draft-model`).
    draft: Option<Box<Runtime>>,
}

impl Runtime {
    /// Loads the GGUF at `path` (weights, tokenizer, chat template, fingerprint, context length)
    /// and opens its module store.
    pub fn load(path: &Path, options: &RuntimeOptions) -> Result<Self, RuntimeError> {
        let gguf = GgufFile::open(path)?;
        let max_positions = u32::try_from(gguf.context_length()?).unwrap_or(u32::MAX);
        let backend = select_backend(options.backend)?;
        let (model, tokenizer) = load_model_and_tokenizer(&gguf, options.weight_format, &backend)?;
        let template = model_chat_template(&gguf, &tokenizer)?;
        let spec = StateSpec::new(gguf.fingerprint(), model.kv_layout())
            .with_state_dtype(options.store.state_dtype);
        let store = ModuleStore::open_on(&options.store, spec, &backend.device)?;
        Ok(Self::from_parts(
            model,
            PmlTokenizer::from(tokenizer),
            template,
            store,
            options.encode_mode,
            max_positions,
        ))
    }

    /// A runtime from parts already in hand (tests use the tiny models). The store's spec must
    /// name this model's fingerprint and KV layout.
    pub fn from_parts(
        model: Model,
        tokenizer: PmlTokenizer,
        template: ChatTemplate,
        store: ModuleStore,
        encode_mode: EncodeMode,
        max_positions: u32,
    ) -> Self {
        Self {
            model,
            tokenizer,
            template,
            store,
            encode_mode,
            keep: None,
            parallel_scaling: None,
            kv_budget: None,
            max_positions,
            draft: None,
        }
    }

    /// Drafts with `draft` where an answer's speculation asks for a draft model; refused when
    /// its vocabulary is not this model's. Its module states are its own (its store's spec
    /// names its fingerprint): compile a schema for it too ([`Self::draft_model`]'s
    /// [`Self::encode`]), or its units are encoded on first use.
    pub fn attach_draft_model(&mut self, draft: Runtime) -> Result<(), RuntimeError> {
        pml_engine::generation::speculative::draft_model::check_vocabularies(
            &self.tokenizer,
            &draft.tokenizer,
        )
        .map_err(RuntimeError::DraftModel)?;
        self.draft = Some(Box::new(draft));
        Ok(())
    }

    /// The draft model's runtime, when one is attached.
    pub fn draft_model(&self) -> Option<&Runtime> {
        self.draft.as_deref()
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn tokenizer(&self) -> &PmlTokenizer {
        &self.tokenizer
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Positions the model was trained for (the GGUF's context length): a prompt and its
    /// answer must fit in them.
    pub fn max_positions(&self) -> u32 {
        self.max_positions
    }

    /// How many bytes of prompt text this model's context can hold ([`PromptByteLimit`]).
    pub fn prompt_byte_limit(&self) -> PromptByteLimit {
        PromptByteLimit {
            context: self.max_positions,
            longest_token_bytes: pml_engine::Tokenizer::longest_token_bytes(&self.tokenizer),
        }
    }

    /// The most bytes of prompt text this model's context can hold: its context length times
    /// the most bytes one token of its vocabulary covers. A longer text can never fit, so it can
    /// be refused before it is tokenized (or read whole).
    pub fn max_prompt_bytes(&self) -> u64 {
        self.prompt_byte_limit().max_bytes()
    }

    /// Refuses a prompt of `bytes` bytes (a text, or a PML prompt's source) past
    /// [`Self::max_prompt_bytes`] (PML306).
    pub fn check_prompt_bytes(&self, bytes: u64) -> Result<(), ContextError> {
        self.prompt_byte_limit().check(bytes)
    }

    /// Refuses a planned prompt whose positions and answer of up to `max_tokens` tokens run past
    /// the model's context (PML305).
    pub fn check_context(&self, plan: &SplicePlan, max_tokens: usize) -> Result<(), ContextError> {
        context_limit::check_positions(plan.positions_taken(), max_tokens, self.max_positions)
    }

    pub fn store(&self) -> &ModuleStore {
        &self.store
    }

    /// Swaps in another store of this model (e.g. a RAM-only one for an evaluation that encodes
    /// thousands of throwaway modules) and returns the old one.
    pub fn replace_store(&mut self, store: ModuleStore) -> Result<ModuleStore, RuntimeError> {
        if store.spec() != self.store.spec() {
            return Err(StoreError::mismatch(
                "store spec",
                format!("{:?}", self.store.spec()),
                format!("{:?}", store.spec()),
            )
            .into());
        }
        Ok(std::mem::replace(&mut self.store, store))
    }

    pub fn encode_mode(&self) -> EncodeMode {
        self.encode_mode
    }

    /// Decode answers within `budget` KV slots, the prompt's rows cut to it after the prefill
    /// ([`super::budgeted_decode`]).
    pub fn set_kv_budget(&mut self, budget: Option<KvBudget>) {
        self.kv_budget = budget;
    }

    /// Compile and read compressed module states that keep `keep` of each unit's rows (their
    /// heavy hitters), or whole ones (`None`, the default).
    pub fn set_keep(&mut self, keep: Option<KeepFraction>) {
        self.keep = keep;
    }

    pub fn keep(&self) -> Option<KeepFraction> {
        self.keep
    }

    /// Mode `reuse` attends the modules it splices as parallel contexts, re-weighted by
    /// `scaling` (APE's attention temperature and scale), or plainly (`None`, the default).
    pub fn set_parallel_scaling(&mut self, scaling: Option<ParallelScaling>) {
        self.parallel_scaling = scaling;
    }

    /// The fraction of rows the states of schema `schema_name` were last compiled to keep, by
    /// its manifest (`None`: whole states, or never compiled).
    pub fn compiled_keep(&self, schema_name: &str) -> Option<KeepFraction> {
        self.store
            .read_manifest(schema_name)
            .found()
            .and_then(|manifest| manifest.keep)
    }

    /// Parses, checks and lays out a schema's source; `loader` reads its `src` files.
    pub fn lay_out(
        &self,
        schema_source: &str,
        loader: &dyn SourceLoader,
    ) -> Result<LaidOutSchema, RuntimeError> {
        Ok(lay_out_source(schema_source, self.plan_model(), loader)?)
    }

    /// What the compiler's layout and binding need of this model.
    pub fn plan_model(&self) -> PlanModel<'_> {
        PlanModel {
            tokenizer: &self.tokenizer,
            template: &self.template,
            max_positions: self.max_positions,
        }
    }

    /// Lays a schema out and encodes every unit the store lacks (`pmlc compile`).
    pub fn compile(
        &self,
        schema_source: &str,
        loader: &dyn SourceLoader,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> Result<(LaidOutSchema, EncodeReport), RuntimeError> {
        let laid_out = self.lay_out(schema_source, loader)?;
        let report = self.encode(&laid_out.layout, progress)?;
        Ok((laid_out, report))
    }

    /// Binds a prompt's source to a laid-out schema, with the generation prompt at the end.
    pub fn bind(
        &self,
        schema: &LaidOutSchema,
        prompt_source: &str,
    ) -> Result<BoundPrompt, RuntimeError> {
        Ok(bind_source(schema, prompt_source, self.plan_model())?)
    }

    /// Answers a prompt (`pml run`): binds it to its schema, runs it in `mode` and streams the
    /// answer to `on_text`. Units missing from the store are encoded on the fly (and reported).
    pub fn run(
        &self,
        schema: &LaidOutSchema,
        prompt_source: &str,
        mode: InferenceMode,
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(Generation, RunStats), RuntimeError> {
        let bound = self.bind(schema, prompt_source)?;
        Ok(self.run_bound(&schema.layout, &bound, mode, params, on_text)?)
    }

    /// Encodes every unit of `layout` the store lacks and writes the schema's manifest.
    pub fn encode(
        &self,
        layout: &SchemaLayout,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> Result<EncodeReport, EncodeError> {
        encode_schema(
            &self.model,
            layout,
            self.encode_options(),
            &self.store,
            progress,
        )
    }

    /// Begins encoding `layout` in steps ([`Self::encode_step`]), for a caller with other work
    /// to do between them.
    pub fn begin_encode(
        &self,
        layout: &SchemaLayout,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> EncodeRun {
        EncodeRun::new(layout, &self.store, progress)
    }

    /// The next step of `run`, begun on this `layout`: the report once the last unit is done.
    pub fn encode_step(
        &self,
        run: &mut EncodeRun,
        layout: &SchemaLayout,
        step: EncodeStep,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> Result<Option<EncodeReport>, EncodeError> {
        run.advance(
            &self.model,
            layout,
            self.encode_options(),
            &self.store,
            step,
            progress,
        )
    }

    /// [`EncodeRun::advance_to_chunk`] on this runtime: stores what the caller's passes
    /// computed, visits up to `max_units` units and begins the next one to compute.
    pub fn encode_to_chunk(
        &self,
        run: &mut EncodeRun,
        layout: &SchemaLayout,
        max_units: usize,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> Result<Option<EncodeReport>, EncodeError> {
        run.advance_to_chunk(
            &self.model,
            layout,
            self.encode_options(),
            &self.store,
            max_units,
            progress,
        )
    }

    /// The layout `layout`'s schema had when the store's states of its changed units were
    /// computed (see [`super::previous_layout`]), for edit reuse; `None` when nothing changed
    /// or the previous states cannot be used.
    pub fn previous_layout(
        &self,
        layout: &SchemaLayout,
    ) -> Result<Option<super::previous_layout::PreviousLayout>, InferenceError> {
        let options = self.encode_options();
        if options.keep.is_some() {
            // Edit reuse rebuilds the layout of whole states; compressed ones are compiled again.
            return Ok(None);
        }
        super::previous_layout::previous_layout(
            &self.model,
            &self.store,
            options.mode,
            options.bos,
            layout,
        )
    }

    /// Answers a bound prompt in `mode`, streaming text to `on_text`; a prompt whose answer of
    /// `params.max_tokens` would run past the context is refused first.
    pub fn run_bound(
        &self,
        layout: &SchemaLayout,
        bound: &BoundPrompt,
        mode: InferenceMode,
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(Generation, RunStats), InferenceError> {
        let plan = SplicePlan::new(layout, bound)?;
        self.check_context(&plan, params.max_tokens)?;
        let mut encoder = self.encoder(layout)?;
        let draft = match (params.speculation, self.draft_model()) {
            (Speculation::Draft { .. }, Some(draft)) => Some(super::DraftPrefill {
                model: &draft.model,
                encoder: draft.encoder(layout)?,
            }),
            _ => None,
        };
        super::generate(
            &self.model,
            &self.tokenizer,
            &mut encoder,
            &plan,
            mode,
            params,
            self.kv_budget,
            draft,
            on_text,
        )
    }

    /// Allocates the host memory of the cache [`Self::run_bound`] will build for `plan` and
    /// faults in the rows the prompt fills, before that run's clock starts, as llama.cpp
    /// clears its KV buffers when it creates a context rather than when a prompt comes
    /// ([`KvCache::reserve_host_memory`]). For a process that runs one prompt; a device cache,
    /// a sliding-window model's and one spliced from compressed states (fewer rows) do not
    /// use it, so none is made for the last.
    pub fn reserve_cache(
        &self,
        layout: &SchemaLayout,
        bound: &BoundPrompt,
        params: &SamplingParams,
    ) -> Result<(), InferenceError> {
        if !self.model.device().is_cpu() || self.keep.is_some() {
            return Ok(());
        }
        let plan = SplicePlan::new(layout, bound)?;
        let (capacity, rows) = super::cache_slots(&plan, params, self.kv_budget);
        KvCache::reserve_host_memory(&self.model.kv_layout(), capacity, rows);
        Ok(())
    }

    /// The prefill alone: the KV cache of the whole prompt and its last token's logits. A prompt
    /// past the context is refused first; one that decodes after it checks its own answer's
    /// room ([`Self::check_context`]).
    pub fn prefill(
        &self,
        layout: &SchemaLayout,
        bound: &BoundPrompt,
        mode: InferenceMode,
    ) -> Result<Prefill, InferenceError> {
        let plan = SplicePlan::new(layout, bound)?;
        self.check_context(&plan, 0)?;
        let mut encoder = self.encoder(layout)?;
        super::prefill(&self.model, &mut encoder, &plan, mode, 0)
    }

    /// [`Self::prefill`] in stages: the cached spans spliced now, the tokens to compute left
    /// for [`super::StagedPrefill::advance`] (mode `blend` runs whole), with room for `reserve`
    /// decoded tokens.
    pub fn stage_prefill(
        &self,
        layout: &SchemaLayout,
        bound: &BoundPrompt,
        mode: InferenceMode,
        reserve: usize,
    ) -> Result<super::Staged, InferenceError> {
        let plan = SplicePlan::new(layout, bound)?;
        let mut encoder = self.encoder(layout)?;
        super::staged::stage(&self.model, &mut encoder, &plan, mode, reserve)
    }

    /// The fastest store tier holding each unit's state (`device`, `ram`, `disk`, `redis`), in
    /// the order of `layout.units`; `None` for a unit still to encode.
    pub fn unit_tiers(
        &self,
        layout: &SchemaLayout,
    ) -> Result<Vec<Option<&'static str>>, InferenceError> {
        let encoder = self.encoder(layout)?;
        layout
            .units
            .iter()
            .map(|unit| {
                let key = encoder.key(unit.id)?;
                Ok(self.store.tier_holding(&key).map_err(EncodeError::from)?)
            })
            .collect()
    }

    fn encoder<'a>(&'a self, layout: &'a SchemaLayout) -> Result<UnitEncoder<'a>, EncodeError> {
        let options = self.encode_options();
        Ok(
            UnitEncoder::new(&self.model, layout, options.mode, options.bos, &self.store)?
                .with_keep(options.keep)
                .with_parallel_scaling(self.parallel_scaling),
        )
    }

    fn encode_options(&self) -> EncodeOptions {
        EncodeOptions {
            mode: self.encode_mode,
            bos: self.tokenizer.bos_token(),
            keep: self.keep,
        }
    }
}
