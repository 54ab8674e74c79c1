//! The registry of compiler diagnostics: one documented [`Rule`] per stable code, schema rules
//! `PML1xx` in [`SCHEMA_RULES`] and prompt rules `PML2xx` in [`PROMPT_RULES`]. Codes are never
//! renumbered; a retired rule keeps its number out of use. [`all_rules`] adds the parser's rules
//! and is what `pmlc explain` and the `docs/diagnostics.md` test read.

mod prompt_rules;
mod schema_rules;

pub use prompt_rules::*;
pub use schema_rules::*;

use pml_syntax::{Diagnostic, Rule};

/// Every rule of the toolchain, syntax rules first, in code order within each stage.
pub fn all_rules() -> impl Iterator<Item = &'static Rule> {
    pml_syntax::SYNTAX_RULES
        .iter()
        .chain(SCHEMA_RULES)
        .chain(PROMPT_RULES)
}

/// The rule with this code (case-insensitive, so `pml101` works on the command line).
pub fn find_rule(code: &str) -> Option<&'static Rule> {
    all_rules().find(|rule| rule.code.eq_ignore_ascii_case(code))
}

/// A diagnostic for `rule`, with the rule's code and severity.
pub(crate) fn diagnostic(rule: &Rule, message: impl Into<String>) -> Diagnostic {
    let diagnostic = Diagnostic::error(rule.code, message);
    Diagnostic {
        severity: rule.severity,
        ..diagnostic
    }
}
