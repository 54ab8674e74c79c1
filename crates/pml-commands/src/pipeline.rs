//! From files on disk to what the runtime runs, shared by `pmlc compile`, `pml run` and
//! `pml bench`: read a source, check it the way `pmlc check` does (same schema lookup, same
//! rendered diagnostics), open the model's runtime and store, lay a schema out and bind a prompt,
//! turning every diagnostic into rendered output and every failure into a [`Failure`] with the
//! right exit status. A prompt file is read only up to the most bytes its model's context can
//! hold ([`read_prompt`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use pml_compiler::check::{
    CheckEnvironment, PromptCheckOptions, SchemaLookup, SchemaResolver, check_source,
};
use pml_compiler::plan::{BoundPrompt, EncodeMode};
use pml_compiler::{FsSourceLoader, PlanError};
use pml_engine::device::{Backend, BackendChoice, DeviceChoice, Kernels, select_backend};
use pml_engine::gguf::GgufFile;
use pml_engine::model::WeightFormat;
use pml_runtime::inference::{
    ContextError, LaidOutSchema, PromptByteLimit, Runtime, RuntimeError, RuntimeOptions,
};
use pml_runtime::store::{DiskTier, StoreConfig, StoreError};
use pml_syntax::Diagnostic;
use pml_syntax::ast::SourceFile;
use pml_syntax::json::JsonDiagnostic;

use crate::failure::Failure;
use crate::model_fetch::{ModelChoice, model_file, resolve_model};
use crate::schema_lookup::{FsSchemaResolver, SchemaCache};

/// A source file's path and text.
#[derive(Clone, Debug)]
pub struct SourceText {
    pub path: PathBuf,
    pub text: String,
}

impl SourceText {
    /// Reads `path`; an unreadable file is a usage error (exit 2).
    pub fn read(path: &Path) -> Result<Self, Failure> {
        let text = crate::source_file::read_source(path).map_err(|error| {
            Failure::usage(format!("cannot read `{}`: {error}", path.display()))
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            text,
        })
    }

    /// Refuses a text past `runtime`'s [`Runtime::max_prompt_bytes`] (PML306, exit 2): what a
    /// file small enough to be read before the model loaded ([`read_prompt`]) is measured
    /// against once it has.
    pub fn check_bytes(&self, runtime: &Runtime) -> Result<(), Failure> {
        runtime
            .check_prompt_bytes(self.text.len() as u64)
            .map_err(|error| context_failure(error, Some(&self.name())))
    }

    /// The path as diagnostics name it.
    pub fn name(&self) -> String {
        self.path.display().to_string()
    }

    /// The folder `src` files and sibling schemas are looked up in.
    pub fn folder(&self) -> &Path {
        self.path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
    }

    /// Reads the schema's `src` files relative to its folder.
    pub fn loader(&self) -> FsSourceLoader {
        FsSourceLoader::new(self.folder())
    }
}

/// A prompt file up to this size is read before the model loads, so its errors are reported
/// without loading one, and measured against the model's byte limit once it has; a larger one is
/// measured against the limit of the model file's metadata first and read only if it fits.
pub const PROMPT_READ_FIRST_BYTES: u64 = 1 << 20;

/// Reads the prompt at `path` (for the model `args` name) without ever holding more of it than
/// the model's context can hold ([`PromptByteLimit`]): a file past it is refused (PML306, exit
/// 2) by its size, unread. Files up to [`PROMPT_READ_FIRST_BYTES`] are read at once and leave
/// the check to [`SourceText::check_bytes`]; a stream that turns out longer is read on only up to
/// the limit.
pub fn read_prompt(path: &Path, args: &RuntimeArgs) -> Result<SourceText, Failure> {
    let cannot_read = |error: std::io::Error| {
        Failure::usage(format!("cannot read `{}`: {error}", path.display()))
    };
    let name = path.display().to_string();
    let mut file = std::fs::File::open(path).map_err(cannot_read)?;
    let size = file.metadata().map_err(cannot_read)?.len();
    let mut bytes = Vec::new();
    if size <= PROMPT_READ_FIRST_BYTES {
        (&mut file)
            .take(PROMPT_READ_FIRST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(cannot_read)?;
    }
    if size > PROMPT_READ_FIRST_BYTES || bytes.len() as u64 > PROMPT_READ_FIRST_BYTES {
        let limit = model_prompt_byte_limit(args)?;
        let check = |bytes: u64| {
            limit
                .check(bytes)
                .map_err(|error| context_failure(error, Some(&name)))
        };
        check(size)?;
        let room = (limit.max_bytes() + 1).saturating_sub(bytes.len() as u64);
        (&mut file)
            .take(room)
            .read_to_end(&mut bytes)
            .map_err(cannot_read)?;
        check(bytes.len() as u64)?;
    }
    let text = crate::source_file::decode(bytes)
        .map_err(|error| Failure::usage(format!("cannot read `{}`: {error}", path.display())))?;
    Ok(SourceText {
        path: path.to_path_buf(),
        text,
    })
}

/// The byte limit of the model `args` names, from its file's metadata alone (fetching a
/// registered model first, as loading it would).
fn model_prompt_byte_limit(args: &RuntimeArgs) -> Result<PromptByteLimit, Failure> {
    let model = resolve_model(args.model.as_deref()).map_err(Failure::Usage)?;
    let path = model_file(&model)?;
    let gguf = GgufFile::open(&path)
        .with_context(|| format!("reading the metadata of {}", path.display()))?;
    Ok(PromptByteLimit::of_gguf(&gguf)
        .with_context(|| format!("reading the vocabulary of {}", path.display()))?)
}

/// A prompt its model's context cannot hold (the file `file`, if it is one): bad input, refused
/// before anything was computed (exit 2), with what to change.
pub fn context_failure(error: ContextError, file: Option<&str>) -> Failure {
    let help = match &error {
        ContextError::TooLong { .. } => {
            "lower `--max-tokens`, or shorten the prompt (less text, fewer imports of collection \
             members)"
        }
        ContextError::TooLarge { .. } => "shorten the prompt, or split it across several runs",
    };
    let file = file.map(|name| format!("`{name}`: ")).unwrap_or_default();
    Failure::usage(format!(
        "{file}{error}\nhelp: {help} (`pmlc explain {}`)",
        error.code()
    ))
}

/// How module states are computed at compile time (`--encode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EncodeArg {
    /// After the always-present text before the module (exact when imported right after it).
    #[default]
    Scaffolded,
    /// Each module alone after BOS (the Prompt Cache paper).
    Isolated,
}

impl From<EncodeArg> for EncodeMode {
    fn from(arg: EncodeArg) -> Self {
        match arg {
            EncodeArg::Scaffolded => EncodeMode::Scaffolded,
            EncodeArg::Isolated => EncodeMode::Isolated,
        }
    }
}

/// How the model's weights are held in memory (`--weights`); part of every store key (as the
/// format it resolves to), so a schema compiled with one format is encoded again for another.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum WeightsArg {
    /// `quantized` on the CPU, `quantized-and-f16` on a GPU (where prefill's f16 products on
    /// tensor cores beat the quantized kernels: SmolLM2 on an H100, 4096 tokens, 43 against
    /// 77 ms).
    #[default]
    Auto,
    /// The GGUF's quantized blocks only, multiplied by our kernels at every row count (least
    /// memory, and as fast as the dense copies).
    Quantized,
    /// Quantized kernels for calls of a few rows (decode), f32 copies for larger ones.
    QuantizedAndF32,
    /// Quantized kernels for calls of a few rows (decode), f16 copies for larger ones.
    QuantizedAndF16,
    F16,
    Bf16,
    F32,
}

impl WeightsArg {
    /// The format for a model on the CPU (`on_cpu`) or on a GPU.
    pub fn format(self, on_cpu: bool) -> WeightFormat {
        match self {
            WeightsArg::Auto if on_cpu => WeightFormat::Quantized,
            WeightsArg::Auto => WeightFormat::QuantizedAndF16,
            WeightsArg::QuantizedAndF32 => WeightFormat::QuantizedAndF32,
            WeightsArg::QuantizedAndF16 => WeightFormat::QuantizedAndF16,
            WeightsArg::Quantized => WeightFormat::Quantized,
            WeightsArg::F16 => WeightFormat::F16,
            WeightsArg::Bf16 => WeightFormat::Bf16,
            WeightsArg::F32 => WeightFormat::F32,
        }
    }

    /// [`Self::format`] for the device `choice` names.
    pub fn format_for(self, choice: &BackendChoice) -> WeightFormat {
        self.format(choice.device == DeviceChoice::Cpu)
    }
}

/// The model and the module store a command works with.
#[derive(Args, Clone, Debug, Default)]
pub struct RuntimeArgs {
    /// Model: an id or alias (see `pml models list`; fetched first if it is not yet) or a path
    /// to a GGUF file; the default model when absent.
    #[arg(long, short = 'm', value_name = "MODEL")]
    pub model: Option<String>,
    /// Module store tiers, fastest first: a comma-separated list of `device:SIZE` (the
    /// model's device memory: a GPU's, or on the CPU host memory), `ram:SIZE`,
    /// `disk:PATH[?max=SIZE]` and `redis://HOST:PORT[?max=SIZE&timeout_ms=N&cluster=1]`, or a folder
    /// (RAM over disk there), plus `dtype:f32` to store states exactly instead of in f16.
    /// Default: `$PML_STORE`, else RAM over disk at `$PML_HOME/store`, f16.
    #[arg(long, value_name = "SPEC")]
    pub store: Option<String>,
    /// How module states are encoded; `pml run` must use the mode the schema was compiled with.
    #[arg(long, value_enum, default_value_t = EncodeArg::Scaffolded)]
    pub encode: EncodeArg,
    /// How the weights are held in memory; compile and run with the same format.
    #[arg(long, value_enum, default_value_t = WeightsArg::default())]
    pub weights: WeightsArg,
    #[command(flatten)]
    pub backend: BackendArgs,
}

/// Where the model runs and which kernels run it (`--device`, `--kernels`).
#[derive(Args, Clone, Debug, Default)]
pub struct BackendArgs {
    /// Device: `cpu`, `cuda` or `cuda:N` (a build with the `cuda` feature). Default:
    /// `$PML_DEVICE`, else the CPU.
    #[arg(long, value_name = "DEVICE")]
    pub device: Option<DeviceChoice>,
    /// Kernels: `native` (our CPU kernels; the CPU's default) or `candle` (candle's operations,
    /// the only ones on CUDA). Default: `$PML_KERNELS`, else the device's.
    #[arg(long, value_name = "KERNELS")]
    pub kernels: Option<Kernels>,
    /// The dtype of the KV cache, K and V alike (llama.cpp's `--cache-type-k`/`-v`): f32 keeps
    /// K and V exactly as computed; f16 (llama.cpp's default) halves what a decode step reads,
    /// at the cost of rounding K and V once (logits move by up to 2% of the largest on
    /// Qwen2.5-0.5B, 15% on Gemma-3-270M).
    #[arg(long, value_enum, value_name = "TYPE", default_value = "f32")]
    pub cache_type: CacheType,
}

/// A KV cache dtype the engine holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum CacheType {
    F16,
    Bf16,
    #[default]
    F32,
}

impl CacheType {
    pub fn dtype(self) -> candle_core::DType {
        match self {
            CacheType::F16 => candle_core::DType::F16,
            CacheType::Bf16 => candle_core::DType::BF16,
            CacheType::F32 => candle_core::DType::F32,
        }
    }
}

impl BackendArgs {
    /// The flags over the environment; a variable that does not parse is a usage error.
    pub fn choice(&self) -> Result<BackendChoice, Failure> {
        BackendChoice::resolve(self.device, self.kernels)
            .map(|choice| choice.with_kv_dtype(self.cache_type.dtype()))
            .map_err(|error| Failure::usage(error.to_string()))
    }

    /// The selected device and kernels; a device that cannot be opened is a usage error.
    pub fn select(&self) -> Result<Backend, Failure> {
        select_backend(self.choice()?).map_err(|error| Failure::usage(error.to_string()))
    }
}

/// A loaded model with its store.
pub struct OpenRuntime {
    pub model: ModelChoice,
    /// The model's id: its registry id, or its file's stem.
    pub id: String,
    pub runtime: Runtime,
}

impl OpenRuntime {
    /// For a command whose process ends right after: leaves the model, tokenizer and store to
    /// the OS instead of freeing them. Freeing is one allocation at a time (Gemma-3's
    /// 262k-token vocabulary alone): `perf` showed ~200 ms of `free` after `pml run` had
    /// printed its answer, where the exit returns every page at once. Nothing is lost: the
    /// store writes each state synchronously (temp file, then rename), and its locks are
    /// `flock`s the kernel releases with the process.
    pub fn release_at_exit(self) {
        std::mem::forget(self);
    }
}

/// Resolves the model (fetching it when absent), loads it and opens its store.
pub fn open_runtime(args: &RuntimeArgs) -> Result<OpenRuntime, Failure> {
    let model = resolve_model(args.model.as_deref()).map_err(Failure::Usage)?;
    let path = model_file(&model)?;
    let id = model.id();
    let store = store_config(args.store.as_deref())?;
    let backend = args.backend.choice()?;
    let options = RuntimeOptions {
        weight_format: args.weights.format_for(&backend),
        backend,
        encode_mode: args.encode.into(),
        store,
    };
    let runtime = Runtime::load(&path, &options)
        .with_context(|| format!("loading {id} from {}", path.display()))?;
    Ok(OpenRuntime { model, id, runtime })
}

/// Loads `draft` (an id or a GGUF path, fetched if absent) as [`open_runtime`] loads the model,
/// with the same device, weights, encoding and store, and attaches it to `target` to draft
/// for it; a draft of another vocabulary is a usage error. Returns its id.
pub fn open_draft_model(
    args: &RuntimeArgs,
    draft: &str,
    target: &mut OpenRuntime,
) -> Result<String, Failure> {
    let args = RuntimeArgs {
        model: Some(draft.to_owned()),
        ..args.clone()
    };
    let opened = open_runtime(&args)?;
    target
        .runtime
        .attach_draft_model(opened.runtime)
        .map_err(|error| Failure::usage(format!("--draft-model {}: {error}", opened.id)))?;
    Ok(opened.id)
}

/// The store `--store SPEC` names (parsed by [`StoreConfig::parse`]), else `$PML_STORE`'s, else
/// the default; a spec that does not parse is a usage error.
pub fn store_config(spec: Option<&str>) -> Result<StoreConfig, Failure> {
    let parsed = match spec {
        Some(spec) => DiskTier::default_root().and_then(|root| StoreConfig::parse(spec, &root)),
        None => StoreConfig::from_env(),
    };
    parsed.map_err(|error| match error {
        StoreError::InvalidSpec(_) => Failure::usage(error.to_string()),
        error => Failure::Failed(anyhow::Error::new(error).context("locating the module store")),
    })
}

/// What a checked file turned out to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CheckedFile {
    Schema,
    /// A prompt, with the schema file it names (found as `pmlc check` finds it).
    Prompt {
        schema_path: PathBuf,
    },
    Empty,
}

/// Checks `file` as `pmlc check` does, printing its diagnostics (warnings too) to stderr. Errors
/// give [`Failure::Reported`] with them; a prompt's schema is looked up by name unless `explicit_schema`.
pub fn check(
    file: &SourceText,
    explicit_schema: Option<&Path>,
    color: bool,
) -> Result<CheckedFile, Failure> {
    // A schema file the user named that cannot be read is a misuse (exit 2), as any unreadable
    // file is, not a diagnostic of the prompt.
    if let Some(schema) = explicit_schema
        && let Err(error) = crate::source_file::read_source(schema)
    {
        return Err(Failure::usage(format!(
            "cannot read the schema {}: {error}",
            schema.display()
        )));
    }
    let mut cache = SchemaCache::default();
    let mut resolver = RecordingResolver {
        inner: FsSchemaResolver {
            cache: &mut cache,
            explicit: explicit_schema,
            prompt_path: &file.path,
        },
        found: None,
    };
    let loader = file.loader();
    let mut environment = CheckEnvironment {
        loader: &loader,
        resolver: &mut resolver,
        options: PromptCheckOptions::default(),
    };
    let checked = check_source(&file.text, &mut environment);
    print_diagnostics(&checked.diagnostics, file, color);
    if checked.error_count() > 0 {
        return Err(Failure::Reported(json_diagnostics(
            &checked.diagnostics,
            file,
        )));
    }
    match checked.file {
        SourceFile::Schema(_) => Ok(CheckedFile::Schema),
        SourceFile::Empty => Ok(CheckedFile::Empty),
        SourceFile::Prompt(_) => {
            let location = resolver
                .found
                .ok_or_else(|| Failure::usage(format!("no schema found for `{}`", file.name())))?;
            Ok(CheckedFile::Prompt {
                schema_path: PathBuf::from(location),
            })
        }
    }
}

/// Remembers where the schema of the prompt being checked was found.
struct RecordingResolver<'a> {
    inner: FsSchemaResolver<'a>,
    /// The found schema's location (its path, as the schema cache spells it).
    found: Option<String>,
}

impl SchemaResolver for RecordingResolver<'_> {
    fn resolve(&mut self, name: Option<&str>) -> SchemaLookup {
        let lookup = self.inner.resolve(name);
        if let SchemaLookup::Found(schema) = &lookup {
            self.found = Some(schema.location.clone());
        }
        lookup
    }
}

/// Renders `diagnostics` of `file` to stderr as `pmlc check` does (the first
/// [`pml_syntax::DEFAULT_MAX_SHOWN`], and a count of the rest).
pub fn print_diagnostics(diagnostics: &[Diagnostic], file: &SourceText, color: bool) {
    if diagnostics.is_empty() {
        return;
    }
    let (shown, omitted) = pml_syntax::first_shown(diagnostics, pml_syntax::DEFAULT_MAX_SHOWN);
    let mut rendered = pml_syntax::render::render(shown, &file.name(), &file.text, color);
    if let Some(note) = omitted.describe() {
        rendered.push_str(&format!(
            "note: {}: {note}; `pmlc check --max-diagnostics 0` shows them all\n",
            file.name()
        ));
    }
    // A closed stderr leaves nothing to report to; the exit status still tells.
    let _ = write!(std::io::stderr().lock(), "{rendered}");
}

/// `diagnostics` of `file` as `pmlc check --format json` gives them.
pub fn json_diagnostics(diagnostics: &[Diagnostic], file: &SourceText) -> Vec<JsonDiagnostic> {
    JsonDiagnostic::all(&file.name(), &file.text, diagnostics)
}

/// Lays `schema` out for the runtime's model, rendering layout errors against its source.
pub fn lay_out(
    runtime: &Runtime,
    schema: &SourceText,
    color: bool,
) -> Result<LaidOutSchema, Failure> {
    runtime
        .lay_out(&schema.text, &schema.loader())
        .map_err(|error| runtime_failure(error, schema, color))
}

/// Binds `prompt` to a laid-out schema, rendering binding errors against its source.
pub fn bind(
    runtime: &Runtime,
    schema: &LaidOutSchema,
    prompt: &SourceText,
    color: bool,
) -> Result<BoundPrompt, Failure> {
    runtime
        .bind(schema, &prompt.text)
        .map_err(|error| runtime_failure(error, prompt, color))
}

/// A runtime error about `file`: diagnostics are rendered, a file of the wrong kind is a usage
/// error, anything else a failure.
fn runtime_failure(error: RuntimeError, file: &SourceText, color: bool) -> Failure {
    match error {
        RuntimeError::Plan(PlanError::Diagnostics { diagnostics, .. }) => {
            print_diagnostics(&diagnostics, file, color);
            Failure::Reported(json_diagnostics(&diagnostics, file))
        }
        error @ RuntimeError::Plan(PlanError::WrongKind { .. }) => {
            Failure::usage(format!("`{}`: {error}", file.name()))
        }
        error => Failure::Failed(anyhow::Error::new(error).context(file.name())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `auto` keeps the file's blocks only on the CPU and adds f16 copies for prefill on a GPU;
    /// a named format is that format everywhere.
    #[test]
    fn auto_weights_depend_on_the_device() {
        assert_eq!(WeightsArg::default(), WeightsArg::Auto);
        assert_eq!(WeightsArg::Auto.format(true), WeightFormat::Quantized);
        assert_eq!(
            WeightsArg::Auto.format(false),
            WeightFormat::QuantizedAndF16
        );
        let cuda = BackendChoice {
            device: DeviceChoice::Cuda(0),
            kernels: None,
            kv_dtype: None,
        };
        assert_eq!(
            WeightsArg::Auto.format_for(&cuda),
            WeightFormat::QuantizedAndF16
        );
        for named in [WeightsArg::Quantized, WeightsArg::F32] {
            assert_eq!(named.format(true), named.format(false));
        }
    }
}
