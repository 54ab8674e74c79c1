//! [`Runtime`]: one loaded model with its tokenizer, chat template and module store — the API the
//! CLI and the server call. `encode` stores a laid-out schema's modules; `run` answers a bound
//! prompt in a chosen mode and reports its statistics. Layout and binding are the compiler's:
//! the runtime sees only [`SchemaLayout`] and [`BoundPrompt`].

use std::path::Path;

use pml_compiler::Tokenizer;
use pml_compiler::chat_template::ChatTemplate;
use pml_compiler::plan::{BoundPrompt, EncodeMode, SchemaLayout};

use crate::chat::{ChatSetupError, model_chat_template};
use crate::device::default_device;
use crate::encode::{
    EncodeError, EncodeEvent, EncodeOptions, EncodeReport, ModelIdentity, UnitEncoder, UnitStates,
    encode_schema,
};
use crate::generation::{Generation, SamplingParams};
use crate::gguf::{GgufError, GgufFile};
use crate::model::{EngineError, Model, ModelConfig, WeightFormat};
use crate::tokenizer::{GgufTokenizer, TokenizerError};

use super::plan::SplicePlan;
use super::stats::RunStats;
use super::{InferenceError, InferenceMode, Prefill};

/// Why a runtime could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("cannot build the tokenizer: {0}")]
    Tokenizer(#[from] TokenizerError),
    #[error(transparent)]
    ChatTemplate(#[from] ChatSetupError),
}

/// How a runtime computes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeOptions {
    pub weight_format: WeightFormat,
    pub encode_mode: EncodeMode,
}

/// A model ready for cached inference.
pub struct Runtime {
    model: Model,
    identity: ModelIdentity,
    tokenizer: Box<dyn Tokenizer>,
    template: ChatTemplate,
    states: Box<dyn UnitStates>,
    encode_mode: EncodeMode,
}

impl Runtime {
    /// Loads the GGUF at `path` (weights, tokenizer, chat template, fingerprint) with `states`
    /// as its module store.
    pub fn load(
        path: &Path,
        options: RuntimeOptions,
        states: Box<dyn UnitStates>,
    ) -> Result<Self, RuntimeError> {
        let mut gguf = GgufFile::open(path)?;
        let tokenizer = GgufTokenizer::from_gguf(&gguf)?;
        let template = model_chat_template(&gguf, &tokenizer)?;
        let fingerprint = gguf.fingerprint().to_string();
        let config = ModelConfig::from_gguf(&gguf)?;
        let model =
            Model::from_source(config, &mut gguf, options.weight_format, &default_device())?;
        Ok(Self::from_parts(
            model,
            fingerprint,
            Box::new(tokenizer),
            template,
            states,
            options.encode_mode,
        ))
    }

    /// A runtime from parts already in hand (tests use the tiny models); `fingerprint` must
    /// identify the model's weights (see [`ModelIdentity`]).
    pub fn from_parts(
        model: Model,
        fingerprint: impl Into<String>,
        tokenizer: Box<dyn Tokenizer>,
        template: ChatTemplate,
        states: Box<dyn UnitStates>,
        encode_mode: EncodeMode,
    ) -> Self {
        let identity = ModelIdentity::of(&model, fingerprint);
        Self {
            model,
            identity,
            tokenizer,
            template,
            states,
            encode_mode,
        }
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn identity(&self) -> &ModelIdentity {
        &self.identity
    }

    /// The tokenizer layout and binding must use.
    pub fn tokenizer(&self) -> &dyn Tokenizer {
        self.tokenizer.as_ref()
    }

    /// The chat template layout and binding expand role tags with.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    pub fn states(&self) -> &dyn UnitStates {
        self.states.as_ref()
    }

    pub fn encode_mode(&self) -> EncodeMode {
        self.encode_mode
    }

    /// Encodes every unit of `layout` the store lacks (the work of `pmlc compile` after layout).
    pub fn encode(
        &self,
        layout: &SchemaLayout,
        progress: &mut dyn FnMut(EncodeEvent<'_>),
    ) -> Result<EncodeReport, EncodeError> {
        encode_schema(
            &self.model,
            &self.identity,
            layout,
            self.encode_options(),
            self.states.as_ref(),
            progress,
        )
    }

    /// Answers `bound` in `mode`, streaming text to `on_text` (the work of `pml run` after
    /// binding).
    pub fn run(
        &self,
        layout: &SchemaLayout,
        bound: &BoundPrompt,
        mode: InferenceMode,
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(Generation, RunStats), InferenceError> {
        let mut encoder = self.encoder(layout)?;
        super::generate(
            &self.model,
            self.tokenizer.as_ref(),
            &mut encoder,
            bound,
            mode,
            params,
            on_text,
        )
    }

    /// The prefill alone (benchmarks and fidelity measurements compare its logits across modes).
    pub fn prefill(
        &self,
        layout: &SchemaLayout,
        bound: &BoundPrompt,
        mode: InferenceMode,
    ) -> Result<Prefill, InferenceError> {
        let plan = SplicePlan::new(layout, bound)?;
        let mut encoder = self.encoder(layout)?;
        super::prefill(&self.model, &mut encoder, &plan, mode, 0)
    }

    fn encoder<'a>(&'a self, layout: &'a SchemaLayout) -> Result<UnitEncoder<'a>, EncodeError> {
        let options = self.encode_options();
        UnitEncoder::new(
            &self.model,
            &self.identity,
            layout,
            options.mode,
            options.bos,
            self.states.as_ref(),
        )
    }

    fn encode_options(&self) -> EncodeOptions {
        EncodeOptions {
            mode: self.encode_mode,
            bos: self.tokenizer.bos_token(),
        }
    }
}
