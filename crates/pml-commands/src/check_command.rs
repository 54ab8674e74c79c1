//! `pmlc check FILE...`: checks each file as a schema or a prompt (by its root element), prints
//! the diagnostics (rendered to stderr, or a JSON array to stdout) and a summary line, and
//! returns the exit status: 0 without errors, 1 with errors, 2 when a file cannot be read or the
//! command is misused.
// `pmlc check` reports its diagnostics and totals on stderr.
#![allow(clippy::print_stderr)]

use crate::diagnostic_output::{JsonDiagnostic, Totals};
use crate::model_tokenizer::load_tokenizer;
use crate::schema_lookup::{FsSchemaResolver, SchemaCache, SchemaFile};
use pml_compiler::check::{CheckEnvironment, PromptCheckOptions, ResolvedSchema, check_source};
use pml_compiler::{FsSourceLoader, Tokenizer};
use pml_syntax::first_shown;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Rendered diagnostics on stderr.
    Human,
    /// A JSON array of diagnostics on stdout.
    Json,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// Colour when stderr is a terminal and `NO_COLOR` is unset.
    Auto,
    Always,
    Never,
}

impl ColorChoice {
    /// Whether diagnostics on stderr are coloured.
    pub fn enabled(self) -> bool {
        match self {
            ColorChoice::Always => true,
            ColorChoice::Never => false,
            ColorChoice::Auto => {
                std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none()
            }
        }
    }
}

#[derive(Clone, Debug)]
pub struct CheckOptions {
    pub files: Vec<PathBuf>,
    /// The schema every prompt is checked against, instead of looking it up by name.
    pub schema: Option<PathBuf>,
    pub format: OutputFormat,
    pub color: ColorChoice,
    /// Diagnostics shown per file (0: all); the rest are counted.
    pub max_diagnostics: usize,
    /// A model whose tokenizer counts argument tokens (PML210); without one they are not checked.
    pub model: Option<String>,
}

pub const EXIT_CLEAN: u8 = 0;
pub const EXIT_ERRORS: u8 = 1;
pub const EXIT_USAGE: u8 = 2;

/// Runs the check and returns the process exit status.
pub fn run_check(options: &CheckOptions) -> u8 {
    let mut cache = SchemaCache::default();
    if let Some(schema) = &options.schema {
        match cache.load(schema) {
            SchemaFile::Schema(_) => {}
            SchemaFile::NotASchema => {
                return usage_error(&format!(
                    "`--schema {}` is not a schema file",
                    schema.display()
                ));
            }
            SchemaFile::Unreadable(reason) => {
                return usage_error(&format!(
                    "cannot read `--schema {}`: {reason}",
                    schema.display()
                ));
            }
        }
    }
    let tokenizer = match options.model.as_deref().map(load_tokenizer).transpose() {
        Ok(tokenizer) => tokenizer,
        Err(error) => return usage_error(&format!("cannot load the model's tokenizer: {error:#}")),
    };
    let color = options.color.enabled();
    let mut totals = Totals::default();
    let mut unreadable = false;
    let mut json_entries = Vec::new();
    let stderr = std::io::stderr();
    for path in &options.files {
        let source = match crate::source_file::read_source(path) {
            Ok(source) => source,
            Err(error) => {
                eprintln!("error: cannot read `{}`: {error}", path.display());
                unreadable = true;
                continue;
            }
        };
        let folder = path
            .parent()
            .filter(|parent| !parent.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let loader = FsSourceLoader::new(folder);
        let mut resolver = FsSchemaResolver {
            cache: &mut cache,
            explicit: options.schema.as_deref(),
            prompt_path: path,
        };
        let mut environment = CheckEnvironment {
            loader: &loader,
            resolver: &mut resolver,
            options: PromptCheckOptions {
                tokenizer: tokenizer
                    .as_ref()
                    .map(|tokenizer| tokenizer as &dyn Tokenizer),
            },
        };
        let mut checked = check_source(&source, &mut environment);
        totals.add(&checked.diagnostics);
        let error_count = checked.error_count();
        if let Some(schema_check) = checked.schema.take() {
            let location = path.display().to_string();
            cache.insert(
                path,
                ResolvedSchema {
                    index: schema_check.index,
                    error_count,
                    location,
                },
            );
        }
        let file_name = path.display().to_string();
        let (shown, omitted) = first_shown(&checked.diagnostics, options.max_diagnostics);
        match options.format {
            OutputFormat::Human => {
                if !shown.is_empty() {
                    let rendered = pml_syntax::render::render(shown, &file_name, &source, color);
                    // A closed stderr leaves nothing to report to; the exit status still tells.
                    let _ = write!(stderr.lock(), "{rendered}");
                }
            }
            OutputFormat::Json => {
                json_entries.extend(JsonDiagnostic::all(&file_name, &source, shown));
            }
        }
        if let Some(note) = omitted.describe() {
            let _ = writeln!(
                stderr.lock(),
                "note: {file_name}: {note}; `--max-diagnostics 0` shows them all\n"
            );
        }
    }
    if options.format == OutputFormat::Json {
        match serde_json::to_string_pretty(&json_entries) {
            Ok(json) => {
                let _ = writeln!(std::io::stdout().lock(), "{json}");
            }
            Err(error) => return usage_error(&format!("cannot write JSON: {error}")),
        }
    }
    eprintln!("{}", totals.summary());
    if unreadable {
        EXIT_USAGE
    } else if totals.errors > 0 {
        EXIT_ERRORS
    } else {
        EXIT_CLEAN
    }
}

fn usage_error(message: &str) -> u8 {
    eprintln!("error: {message}");
    EXIT_USAGE
}
