//! How a command of `pmlc` or `pml` fails, and the exit status each failure gives: 1 when the
//! input has errors (already rendered as diagnostics) or the work itself failed, 2 when a file
//! cannot be read or the command is misused — the statuses `pmlc check` uses.
// A command's failure is reported on stderr as it exits.
#![allow(clippy::print_stderr)]

use pml_syntax::json::JsonDiagnostic;

use crate::check_command::{EXIT_ERRORS, EXIT_USAGE};

/// A failed command.
#[derive(Debug)]
pub enum Failure {
    /// The input has errors, and its diagnostics have been printed: nothing more to say on
    /// stderr. They are kept as `pmlc check --format json` gives them, for callers that are not
    /// a terminal (the Python module raises them).
    Reported(Vec<JsonDiagnostic>),
    /// A file cannot be read, or the arguments do not make sense.
    Usage(anyhow::Error),
    /// The work failed (model, store, engine).
    Failed(anyhow::Error),
}

impl Failure {
    pub fn usage(message: impl std::fmt::Display) -> Self {
        Failure::Usage(anyhow::anyhow!("{message}"))
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            Failure::Reported(_) | Failure::Failed(_) => EXIT_ERRORS,
            Failure::Usage(_) => EXIT_USAGE,
        }
    }

    /// Prints the error line (if any) to stderr and returns the exit status.
    pub fn report(self) -> u8 {
        let code = self.exit_code();
        match self {
            Failure::Reported(_) => {}
            Failure::Usage(error) | Failure::Failed(error) => eprintln!("error: {error:#}"),
        }
        code
    }
}

impl From<anyhow::Error> for Failure {
    fn from(error: anyhow::Error) -> Self {
        Failure::Failed(error)
    }
}
