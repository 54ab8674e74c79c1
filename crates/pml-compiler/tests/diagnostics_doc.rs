//! `docs/diagnostics.md` documents exactly the codes of `all_rules()`: one `### CODE name`
//! section per rule, in the same order, with the rule's severity and summary, and no section for
//! an unknown code.

use pml_compiler::all_rules;
use pml_syntax::Severity;

struct Section {
    code: String,
    name: String,
    body: String,
}

fn sections(markdown: &str) -> Vec<Section> {
    let mut sections: Vec<Section> = Vec::new();
    for line in markdown.lines() {
        if let Some(heading) = line.strip_prefix("### ") {
            let mut words = heading.split_whitespace();
            let code = words.next().unwrap_or_default().to_string();
            let name = words.next().unwrap_or_default().to_string();
            sections.push(Section {
                code,
                name,
                body: String::new(),
            });
        } else if let Some(section) = sections.last_mut() {
            section.body.push_str(line);
            section.body.push('\n');
        }
    }
    sections
}

#[test]
fn every_code_is_documented_and_no_other() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/diagnostics.md");
    let markdown = std::fs::read_to_string(path).expect("docs/diagnostics.md exists");
    let documented = sections(&markdown);
    let documented_codes: Vec<&str> = documented
        .iter()
        .map(|section| section.code.as_str())
        .collect();
    let rule_codes: Vec<&str> = all_rules().map(|rule| rule.code).collect();
    assert_eq!(
        documented_codes, rule_codes,
        "docs/diagnostics.md sections differ from the rule tables"
    );
    for (section, rule) in documented.iter().zip(all_rules()) {
        assert_eq!(section.name, rule.name, "{}: name", rule.code);
        let severity = match rule.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        assert!(
            section
                .body
                .contains(&format!("**Severity:** {severity}\n")),
            "{}: severity",
            rule.code
        );
        assert!(
            section
                .body
                .contains(&format!("**What it does.** {}\n", rule.summary)),
            "{}: summary",
            rule.code
        );
        // Invisible characters are written as escapes in the document (a NUL would make it a
        // binary file for git).
        let example = rule.example.replace('\0', "\\0");
        assert!(section.body.contains(&example), "{}: example", rule.code);
        assert!(section.body.contains("**Fix.** "), "{}: fix", rule.code);
    }
}
