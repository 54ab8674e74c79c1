//! The syntax rule table: codes are unique and in order, every rule's example triggers exactly
//! its code with its severity, and the rendered diagnostic of each example is snapshotted.

use pml_syntax::{SYNTAX_RULES, parse, render, syntax_rule};

#[test]
fn codes_are_unique_sequential_and_named_in_kebab_case() {
    for (index, rule) in SYNTAX_RULES.iter().enumerate() {
        assert_eq!(
            rule.code,
            format!("PML{:03}", index + 1),
            "codes are stable and never renumbered"
        );
        assert!(
            rule.name
                .split('-')
                .all(|word| !word.is_empty() && word.chars().all(|c| c.is_ascii_lowercase())),
            "{} is not kebab-case",
            rule.name
        );
        assert!(
            !rule.summary.is_empty() && !rule.why.is_empty(),
            "{} lacks documentation",
            rule.code
        );
        assert_eq!(
            syntax_rule(rule.code).map(|found| found.name),
            Some(rule.name)
        );
    }
    let mut names: Vec<&str> = SYNTAX_RULES.iter().map(|rule| rule.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), SYNTAX_RULES.len(), "rule names are unique");
    assert!(syntax_rule("PML999").is_none());
}

#[test]
fn every_rule_example_triggers_its_code() {
    for rule in SYNTAX_RULES {
        let parsed = parse(rule.example);
        let own: Vec<_> = parsed
            .diagnostics
            .iter()
            .filter(|diagnostic| diagnostic.code == rule.code)
            .cloned()
            .collect();
        assert_eq!(
            own.len(),
            1,
            "the example of {} should trigger it once: {:?}",
            rule.code,
            parsed.diagnostics
        );
        assert_eq!(own[0].severity, rule.severity, "{}", rule.code);
        // Invisible characters as escapes: a NUL would make the snapshot a binary file.
        let rendered = render(&own, "example.pml", rule.example, false).replace('\0', "\\0");
        insta::assert_snapshot!(format!("{}_{}", rule.code, rule.name), rendered);
    }
}
