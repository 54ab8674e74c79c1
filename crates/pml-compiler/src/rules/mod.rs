//! The registry of compiler diagnostics: one documented [`Rule`] per stable code, schema rules
//! `PML1xx` in [`SCHEMA_RULES`], prompt rules `PML2xx` in [`PROMPT_RULES`] and layout and
//! binding rules `PML3xx` in [`LAYOUT_RULES`]. Codes are never renumbered; a retired rule keeps
//! its number out of use. [`all_rules`] adds the parser's rules and is what `pmlc explain` and the
//! `docs/diagnostics.md` test read.

mod layout_rules;
mod prompt_rules;
mod schema_rules;

pub use layout_rules::*;
pub use prompt_rules::*;
pub use schema_rules::*;

use pml_syntax::{Diagnostic, Rule};

/// Every rule of the toolchain, syntax rules first, in code order within each stage.
pub fn all_rules() -> impl Iterator<Item = &'static Rule> {
    pml_syntax::SYNTAX_RULES
        .iter()
        .chain(SCHEMA_RULES)
        .chain(PROMPT_RULES)
        .chain(LAYOUT_RULES)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_ordered_and_in_their_stage_range() {
        let codes: Vec<&str> = all_rules().map(|rule| rule.code).collect();
        let mut sorted = codes.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(codes, sorted, "codes are unique and listed in order");
        assert!(
            SCHEMA_RULES
                .iter()
                .all(|rule| rule.code.starts_with("PML1") && rule.code.len() == 6)
        );
        assert!(
            PROMPT_RULES
                .iter()
                .all(|rule| rule.code.starts_with("PML2") && rule.code.len() == 6)
        );
        assert!(
            LAYOUT_RULES
                .iter()
                .all(|rule| rule.code.starts_with("PML3") && rule.code.len() == 6)
        );
    }

    #[test]
    fn rules_are_documented() {
        for rule in SCHEMA_RULES.iter().chain(PROMPT_RULES).chain(LAYOUT_RULES) {
            assert!(
                rule.name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c == '-'),
                "{}",
                rule.code
            );
            assert!(
                !rule.summary.is_empty() && !rule.why.is_empty() && !rule.example.is_empty(),
                "{}",
                rule.code
            );
        }
    }

    #[test]
    fn find_rule_ignores_case() {
        assert_eq!(
            find_rule("pml101").map(|rule| rule.name),
            Some("missing-name")
        );
        assert_eq!(find_rule("PML001").map(|rule| rule.code), Some("PML001"));
        assert!(find_rule("PML100").is_none());
    }

    #[test]
    fn diagnostics_take_the_rule_severity() {
        assert!(!diagnostic(&EMPTY_UNION, "w").is_error());
        assert!(diagnostic(&MISSING_NAME, "e").is_error());
    }
}
