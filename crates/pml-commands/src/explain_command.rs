//! `pmlc explain [CODE]`: the documentation of one diagnostic code, or the list of all codes.

use pml_compiler::rules::{all_rules, find_rule};
use pml_syntax::{Rule, Severity};

/// The text `pmlc explain CODE` prints, or `None` for an unknown code.
pub fn explain(code: &str) -> Option<String> {
    find_rule(code).map(describe)
}

/// One line per rule: code, severity, name and summary.
pub fn list_rules() -> String {
    all_rules()
        .map(|rule| {
            format!(
                "{}  {:<7}  {:<30}  {}\n",
                rule.code,
                severity_word(rule.severity),
                rule.name,
                rule.summary
            )
        })
        .collect()
}

fn describe(rule: &Rule) -> String {
    let example: String = rule
        .example
        .lines()
        .map(|line| format!("    {line}\n"))
        .collect();
    format!(
        "{code} {name} ({severity})\n\n{summary}\n\nWhy is this bad?\n{why}\n\nExample:\n{example}",
        code = rule.code,
        name = rule.name,
        severity = severity_word(rule.severity),
        summary = rule.summary,
        why = rule.why,
    )
}

fn severity_word(severity: Severity) -> &'static str {
    match severity {
        Severity::Error => "error",
        Severity::Warning => "warning",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explains_known_codes_in_any_case() {
        let text = explain("pml205").expect("PML205 is a rule");
        assert!(
            text.starts_with("PML205 unknown-module (error)\n"),
            "{text}"
        );
        assert!(text.contains("Why is this bad?"));
        assert!(text.contains("    <prompt schema=\"travel\">"));
        assert!(explain("PML999").is_none());
    }

    #[test]
    fn lists_every_rule() {
        assert_eq!(list_rules().lines().count(), all_rules().count());
    }
}
