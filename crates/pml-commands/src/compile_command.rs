//! `pmlc compile SCHEMA.pml...`: checks each schema (diagnostics as `pmlc check` renders them),
//! lays it out for the model, encodes every unit the store lacks with a progress bar, writes the
//! schema's manifest and prints a summary line. Also the compile step `pml run` takes when a
//! schema is not compiled yet ([`compile_schema`], [`units_missing`]).
// `pmlc compile` reports on stderr what it compiled and why it did not.
#![allow(clippy::print_stderr)]

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use pml_compiler::plan::{EncodeMode, SchemaLayout};
use pml_engine::Tokenizer;
use pml_runtime::encode::{EncodeReport, UnitEncoder};
use pml_runtime::inference::Runtime;
use pml_runtime::store::KeepFraction;

use crate::check_command::ColorChoice;
use crate::encode_progress::EncodeProgress;
use crate::failure::Failure;
use crate::pipeline::{
    CheckedFile, RuntimeArgs, SourceText, check, lay_out, open_draft_model, open_runtime,
};
use crate::sampling_args::DraftModelArgs;

#[derive(Args, Clone, Debug)]
pub struct CompileArgs {
    /// Schema files.
    #[arg(required = true)]
    pub schemas: Vec<PathBuf>,
    /// Store each module's heavy hitters only: this fraction of its rows (e.g. 0.5), its first
    /// rows and the ones the model attends most when it reads the module again. Smaller states to
    /// store, load and attend; answers approximate (docs/benchmarks.md). The schema's own text
    /// stays whole. `pml run` reads what the last compile stored.
    #[arg(long, value_name = "FRACTION", value_parser = parse_keep)]
    pub keep: Option<KeepFraction>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    #[command(flatten)]
    pub draft: DraftModelArgs,
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
}

fn parse_keep(text: &str) -> Result<KeepFraction, String> {
    text.parse::<f64>()
        .ok()
        .and_then(KeepFraction::new)
        .ok_or_else(|| {
            format!(
                "`{text}` is not a fraction above 0 and below 1 (e.g. 0.5); to keep every row, \
                 leave --keep out"
            )
        })
}

/// Runs `pmlc compile` and returns the exit status: 0 when every schema compiled, 1 when one has
/// errors or encoding failed, 2 when a file cannot be read or is not a schema.
pub fn run_compile(args: &CompileArgs) -> u8 {
    match compile_files(args) {
        Ok(()) => 0,
        Err(failure) => failure.report(),
    }
}

fn compile_files(args: &CompileArgs) -> Result<(), Failure> {
    let color = args.color.enabled();
    // Every file is read and checked before the model is loaded: errors come back in seconds.
    let mut schemas = Vec::with_capacity(args.schemas.len());
    let mut has_errors = false;
    let mut reported = Vec::new();
    for path in &args.schemas {
        match checked_schema(path, color) {
            Ok(file) => schemas.push(file),
            Err(Failure::Reported(diagnostics)) => {
                has_errors = true;
                reported.extend(diagnostics);
            }
            Err(failure) => return Err(failure),
        }
    }
    if has_errors {
        eprintln!("nothing compiled: fix the errors above first");
        return Err(Failure::Reported(reported));
    }
    let mut opened = open_runtime(&args.runtime)?;
    let draft_id = match &args.draft.draft_model {
        Some(draft) => Some(open_draft_model(&args.runtime, draft, &mut opened)?),
        None => None,
    };
    opened.runtime.set_keep(args.keep);
    for file in &schemas {
        let laid_out = lay_out(&opened.runtime, file, color)?;
        let summary = compile_schema(&opened.runtime, &laid_out.layout, file)?;
        eprintln!("{summary} for {}", opened.id);
        // The draft model's states are whole: it only proposes tokens.
        if let (Some(draft), Some(draft_id)) = (opened.runtime.draft_model(), &draft_id) {
            let summary = compile_schema(draft, &laid_out.layout, file)?;
            eprintln!("{summary} for {draft_id} (the draft model)");
        }
    }
    Ok(())
}

/// Reads the schema at `path` and checks it as `pmlc check` does (diagnostics rendered to
/// stderr); a prompt or an empty file is a usage error.
pub fn checked_schema(path: &Path, color: bool) -> Result<SourceText, Failure> {
    let file = SourceText::read(path)?;
    match check(&file, None, color)? {
        CheckedFile::Schema => Ok(file),
        CheckedFile::Prompt { .. } => Err(Failure::usage(format!(
            "`{}` is a prompt; `pmlc compile` takes schemas (run a prompt with `pml run`)",
            file.name()
        ))),
        CheckedFile::Empty => Err(Failure::usage(format!(
            "`{}` holds neither a schema nor a prompt",
            file.name()
        ))),
    }
}

/// What compiling one schema did.
#[derive(Clone, Debug, PartialEq)]
pub struct CompileSummary {
    pub schema_name: String,
    pub path: PathBuf,
    pub encode_mode: EncodeMode,
    /// `--keep`: the fraction of each unit's rows stored.
    pub keep: Option<KeepFraction>,
    /// Units with tokens of their own (the ones stored).
    pub n_units: usize,
    pub units_encoded: usize,
    pub units_reused: usize,
    pub tokens: usize,
    pub tokens_encoded: usize,
    /// Bytes the schema's states take in the store (from its manifest).
    pub kv_bytes: u64,
    pub elapsed: Duration,
}

/// Encodes every unit of `layout` the store lacks, with a progress bar, and sums up; a store
/// that cannot be written (read-only, full) is an error naming what it did not take.
pub fn compile_schema(
    runtime: &Runtime,
    layout: &SchemaLayout,
    file: &SourceText,
) -> Result<CompileSummary, Failure> {
    compile_schema_if_writable(runtime, layout, file)?.map_err(|unstored| {
        Failure::Failed(anyhow::anyhow!(
            "`{}` is not compiled: {unstored}",
            layout.schema_name
        ))
    })
}

/// What a store that could not be written left out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotStored {
    /// The units whose states it did not take.
    pub units: Vec<String>,
    /// Whether the schema's manifest was written.
    pub manifest_written: bool,
}

impl fmt::Display for NotStored {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the module store cannot be written")?;
        if !self.units.is_empty() {
            write!(f, "; not stored: {}", self.units.join(", "))?;
        }
        if !self.manifest_written {
            write!(f, "; its manifest is not written")?;
        }
        Ok(())
    }
}

/// [`compile_schema`], or what the store did not take (the reason among the warnings printed):
/// a run then computes the states it lacks itself.
pub fn compile_schema_if_writable(
    runtime: &Runtime,
    layout: &SchemaLayout,
    file: &SourceText,
) -> Result<Result<CompileSummary, NotStored>, Failure> {
    let mut progress = EncodeProgress::new(&layout.schema_name);
    let encoded = runtime.encode(layout, &mut |event| progress.observe(event));
    progress.finish();
    let report = encoded.with_context(|| format!("encoding `{}`", layout.schema_name))?;
    for warning in &report.warnings {
        eprintln!("warning: {warning}");
    }
    let units = report.not_stored();
    let Some(manifest_path) = report.manifest_path.as_ref().filter(|_| units.is_empty()) else {
        return Ok(Err(NotStored {
            units,
            manifest_written: report.manifest_path.is_some(),
        }));
    };
    let manifest = runtime
        .store()
        .read_manifest(&layout.schema_name)
        .found()
        .with_context(|| {
            format!(
                "the manifest of `{}` cannot be read back from {}",
                layout.schema_name,
                manifest_path.display()
            )
        })?;
    Ok(Ok(summarize(
        &report,
        file,
        manifest.units.iter().map(|unit| unit.bytes).sum(),
    )))
}

fn summarize(report: &EncodeReport, file: &SourceText, kv_bytes: u64) -> CompileSummary {
    let stored = report.units.iter().filter(|unit| unit.key.is_some());
    CompileSummary {
        schema_name: report.schema_name.clone(),
        path: file.path.clone(),
        encode_mode: report.mode,
        keep: report.keep,
        n_units: stored.clone().count(),
        units_encoded: report.n_encoded(),
        units_reused: report.n_reused(),
        tokens: stored.map(|unit| unit.n_tokens).sum(),
        tokens_encoded: report.tokens_encoded(),
        kv_bytes,
        elapsed: report.elapsed,
    }
}

impl fmt::Display for CompileSummary {
    /// `compiled `travel` (schemas/travel/travel.pml, scaffolded): 14 units, 2345 tokens, KV
    /// 57.6 MB — encoded 14 units (2345 tokens) in 25.3 s (92 tok/s), reused 0 from the store`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mode = match self.encode_mode {
            EncodeMode::Scaffolded => "scaffolded",
            EncodeMode::Isolated => "isolated",
        };
        let keep = self.keep.map_or(String::new(), |keep| {
            format!(", heavy hitters {keep} of each")
        });
        write!(
            f,
            "compiled `{}` ({}, {mode}{keep}): {} units, {} tokens, KV {:.1} MB — ",
            self.schema_name,
            self.path.display(),
            self.n_units,
            self.tokens,
            self.kv_bytes as f64 / 1e6,
        )?;
        let seconds = self.elapsed.as_secs_f64();
        if self.units_encoded == 0 {
            write!(
                f,
                "nothing to encode: all {} units reused from the store ({seconds:.2} s)",
                self.units_reused
            )
        } else {
            write!(
                f,
                "encoded {} units ({} tokens) in {seconds:.1} s ({:.0} tok/s), reused {} from the \
                 store",
                self.units_encoded,
                self.tokens_encoded,
                self.tokens_encoded as f64 / seconds.max(1e-9),
                self.units_reused,
            )
        }
    }
}

/// How many of `layout`'s stored units the runtime's store lacks (0: compiled).
pub fn units_missing(runtime: &Runtime, layout: &SchemaLayout) -> anyhow::Result<usize> {
    let encoder = UnitEncoder::new(
        runtime.model(),
        layout,
        runtime.encode_mode(),
        runtime.tokenizer().bos_token(),
        runtime.store(),
    )?
    .with_keep(runtime.keep());
    let mut missing = 0;
    for unit in layout.units.iter().filter(|unit| !unit.tokens.is_empty()) {
        if !runtime.store().contains(&encoder.key(unit.id)?)? {
            missing += 1;
        }
    }
    Ok(missing)
}
