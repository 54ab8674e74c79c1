//! The `pml` Python module: PML's runtime in-process, the way llama-cpp-python is used — open a
//! model once (`pml.Runtime(model=...)`), compile schemas, run PML prompts in a mode with the
//! answer streamed to a callback, and read the same account `pml run` prints. It calls the code
//! the `pml` binary calls ([`pml_commands::run_command`], [`pml_commands::compile_command`]), with the
//! same flags parsed the same way, so a prompt answers alike from the shell and from Python.
//! Errors are `pml.PmlError`, carrying the first diagnostic's code, file and span.

use std::path::PathBuf;

use clap::Parser;
use pml_commands::compile_command::{checked_schema, compile_schema};
use pml_commands::failure::Failure;
use pml_commands::pipeline::{OpenRuntime, RuntimeArgs, lay_out, open_draft_model, open_runtime};
use pml_commands::run_command::{RunArgs, run_prompt};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    pml,
    PmlError,
    PyException,
    "A PML failure: `code`, `file`, `span` (byte offsets), `line` and `column` of the first \
     diagnostic where the input has errors (None otherwise), and `diagnostics`, all of them as \
     `pmlc check --format json` gives them."
);

/// `RuntimeArgs` parsed from the flags `pml` takes, so defaults are the command line's.
#[derive(Parser)]
struct RuntimeFlags {
    #[command(flatten)]
    runtime: RuntimeArgs,
}

/// `pml run`'s arguments, parsed as the binary parses them.
#[derive(Parser)]
struct RunFlags {
    #[command(flatten)]
    run: RunArgs,
}

/// An open model and module store, and the draft model when one is given.
#[pyclass(name = "Runtime", module = "pml", unsendable)]
struct Runtime {
    opened: OpenRuntime,
    /// The draft model's id, when one drafts for the model.
    draft_id: Option<String>,
    /// `--model`, `--store` and `--draft-model` as given, passed on to every run.
    flags: Vec<String>,
}

#[pymethods]
impl Runtime {
    /// Opens `model` (a registered id, fetched when absent, or a GGUF path; default: the
    /// default model) with the module store `store` (default: `$PML_HOME/store`), and
    /// `draft_model` (an id or a GGUF path of the model's tokenizer, `pml run --draft-model`)
    /// to draft tokens for it: every run then drafts with it unless its `options` say
    /// otherwise (`["--speculative", "ngram"]`).
    #[new]
    #[pyo3(signature = (model=None, store=None, *, draft_model=None))]
    fn new(
        model: Option<String>,
        store: Option<String>,
        draft_model: Option<String>,
    ) -> PyResult<Self> {
        let mut flags = Vec::new();
        if let Some(model) = model {
            flags.extend(["--model".to_string(), model]);
        }
        if let Some(store) = store {
            flags.extend(["--store".to_string(), store]);
        }
        let parsed =
            RuntimeFlags::try_parse_from(std::iter::once("pml".to_string()).chain(flags.clone()))
                .map_err(|error| PmlError::new_err(error.to_string()))?;
        let mut opened = open_runtime(&parsed.runtime).map_err(failure_error)?;
        let draft_id = match draft_model {
            Some(draft) => {
                let id = open_draft_model(&parsed.runtime, &draft, &mut opened)
                    .map_err(failure_error)?;
                flags.extend(["--draft-model".to_string(), draft]);
                Some(id)
            }
            None => None,
        };
        Ok(Self {
            opened,
            draft_id,
            flags,
        })
    }

    /// The model's id: its registry id, or its file's stem.
    #[getter]
    fn model_id(&self) -> String {
        self.opened.id.clone()
    }

    /// The draft model's id, when one drafts for the model.
    #[getter]
    fn draft_model_id(&self) -> Option<String> {
        self.draft_id.clone()
    }

    /// Compiles the schema file `schema` (what `pmlc compile` does): encodes every module the
    /// store lacks, for the draft model too when there is one; returns the summary line (one
    /// per model).
    fn compile(&mut self, schema: PathBuf) -> PyResult<String> {
        let file = checked_schema(&schema, false).map_err(failure_error)?;
        let runtime = &self.opened.runtime;
        let laid_out = lay_out(runtime, &file, false).map_err(failure_error)?;
        let summary = compile_schema(runtime, &laid_out.layout, &file).map_err(failure_error)?;
        let mut summary = format!("{summary} for {}", self.opened.id);
        if let (Some(draft), Some(draft_id)) = (runtime.draft_model(), &self.draft_id) {
            let drafted = compile_schema(draft, &laid_out.layout, &file).map_err(failure_error)?;
            summary.push_str(&format!("\n{drafted} for {draft_id} (the draft model)"));
        }
        Ok(summary)
    }

    /// Runs the prompt file `prompt` as `pml run PROMPT --mode MODE ...` does (its schema
    /// compiled on first use); `on_token(text)` receives the answer as it is generated.
    /// `options` are more of `pml run`'s flags, e.g. `["--select", "deviation"]`.
    #[pyo3(signature = (prompt, mode="reuse", *, schema=None, max_tokens=None, temperature=None,
                        recompute=None, min_fidelity=None, options=Vec::new(), on_token=None))]
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        py: Python<'_>,
        prompt: PathBuf,
        mode: &str,
        schema: Option<PathBuf>,
        max_tokens: Option<usize>,
        temperature: Option<f32>,
        recompute: Option<String>,
        min_fidelity: Option<f32>,
        options: Vec<String>,
        on_token: Option<Py<PyAny>>,
    ) -> PyResult<RunResult> {
        let mut argv: Vec<String> = vec!["pml".into(), prompt.display().to_string()];
        argv.extend([
            "--mode".into(),
            mode.into(),
            "--color".into(),
            "never".into(),
        ]);
        let optional = [
            ("--schema", schema.map(|path| path.display().to_string())),
            ("--max-tokens", max_tokens.map(|n| n.to_string())),
            ("--temperature", temperature.map(|t| t.to_string())),
            ("--recompute", recompute),
            ("--min-fidelity", min_fidelity.map(|f| f.to_string())),
        ];
        for (flag, value) in optional {
            if let Some(value) = value {
                argv.extend([flag.to_string(), value]);
            }
        }
        argv.extend(self.flags.iter().cloned());
        argv.extend(options);
        let args = RunFlags::try_parse_from(&argv)
            .map_err(|error| PmlError::new_err(error.to_string()))?
            .run;
        // The callback's first exception ends the streaming to it and is raised after the run.
        let mut callback_error: Option<PyErr> = None;
        let mut on_text = |piece: &str| {
            if let (Some(callback), None) = (&on_token, &callback_error)
                && let Err(error) = callback.call1(py, (piece,))
            {
                callback_error = Some(error);
            }
        };
        let opened = &mut self.opened;
        // What `pml run` prints on the way (the fidelity guard's notes, `--show-plan`'s plan)
        // comes back in the result rather than on the host program's stderr.
        let mut notices = Vec::new();
        let outcome = run_prompt(&args, |_| Ok(opened), &mut on_text, &mut |notice| {
            notices.push(notice.to_string())
        })
        .map_err(failure_error)?;
        if let Some(error) = callback_error {
            return Err(error);
        }
        let report = outcome.json(&self.opened.id, 0.0);
        Ok(RunResult {
            summary: outcome.summary(&self.opened.id),
            json: serde_json::to_string(&report)
                .map_err(|error| PmlError::new_err(error.to_string()))?,
            answer: report.answer,
            mode: report.mode,
            finish_reason: report.finish_reason,
            ttft_ms: report.ttft_ms,
            tokens_reused: report.tokens_reused,
            tokens_recomputed: report.tokens_recomputed,
            tokens_new: report.tokens_new,
            tokens_generated: report.tokens_generated,
            tokens_drafted: report.tokens_drafted,
            tokens_accepted: report.tokens_accepted,
            decode_ms_per_token: report.decode_ms_per_token,
            estimated_fidelity: report.estimated_fidelity,
            fidelity_guard_fired: report.fidelity_guard_fired,
            notices,
        })
    }

    fn __repr__(&self) -> String {
        match &self.draft_id {
            Some(draft) => format!(
                "pml.Runtime(model={:?}, draft_model={draft:?})",
                self.opened.id
            ),
            None => format!("pml.Runtime(model={:?})", self.opened.id),
        }
    }
}

/// What a run answered and its account: the fields of `pml run --json`, and `summary`, the line
/// `pml run` prints to stderr.
#[pyclass(module = "pml", get_all, frozen)]
struct RunResult {
    answer: String,
    summary: String,
    /// `pml run --json`'s whole report, as JSON text.
    json: String,
    mode: String,
    finish_reason: String,
    ttft_ms: f64,
    tokens_reused: usize,
    tokens_recomputed: usize,
    tokens_new: usize,
    tokens_generated: usize,
    /// Tokens drafted ahead of the model and the ones it accepted.
    tokens_drafted: usize,
    tokens_accepted: usize,
    decode_ms_per_token: Option<f64>,
    estimated_fidelity: Option<f32>,
    fidelity_guard_fired: bool,
    /// The lines `pml run` prints to stderr on the way (the fidelity guard's notes,
    /// `--show-plan`'s plan), in order.
    notices: Vec<String>,
}

#[pymethods]
impl RunResult {
    fn __repr__(&self) -> String {
        format!(
            "pml.RunResult(answer={:?}, summary={:?})",
            self.answer, self.summary
        )
    }
}

/// A failure as `PmlError`: the diagnostics' code, file and span where the input has errors.
fn failure_error(failure: Failure) -> PyErr {
    match failure {
        Failure::Reported(diagnostics) => Python::attach(|py| {
            let message = diagnostics.first().map_or_else(
                || "the input has errors".to_string(),
                |first| format!("{}: {}", first.code, first.message),
            );
            let error = PmlError::new_err(message);
            if let Err(failed) = describe(py, &error, &diagnostics) {
                return failed;
            }
            error
        }),
        Failure::Usage(error) | Failure::Failed(error) => PmlError::new_err(format!("{error:#}")),
    }
}

/// Sets the exception's `code`, `file`, `span`, `line`, `column` (the first diagnostic's first
/// label) and `diagnostics` (every one, as Python objects); the class says None and `()`
/// where there are none.
fn describe(
    py: Python<'_>,
    error: &PyErr,
    diagnostics: &[pml_syntax::json::JsonDiagnostic],
) -> PyResult<()> {
    let value = error.value(py);
    let json = py.import("json")?;
    let text =
        serde_json::to_string(diagnostics).map_err(|error| PmlError::new_err(error.to_string()))?;
    let all = json.call_method1("loads", (text,))?;
    value.setattr("diagnostics", &all)?;
    let first = diagnostics.first();
    let label = first.and_then(|first| first.labels.first());
    value.setattr("code", first.map(|first| first.code.to_string()))?;
    value.setattr("file", first.map(|first| first.file.clone()))?;
    value.setattr(
        "span",
        label.map(|label| (label.span.start, label.span.end)),
    )?;
    value.setattr("line", label.map(|label| label.line))?;
    value.setattr("column", label.map(|label| label.column))?;
    Ok(())
}

#[pymodule]
fn pml(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_class::<Runtime>()?;
    module.add_class::<RunResult>()?;
    // What an error without diagnostics (a missing file, a bad flag, a failed load) says.
    let error_type = module.py().get_type::<PmlError>();
    for attribute in ["code", "file", "span", "line", "column"] {
        error_type.setattr(attribute, module.py().None())?;
    }
    error_type.setattr("diagnostics", ())?;
    module.add("PmlError", error_type)?;
    module.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
