//! Parser cases as data: every `cases/NNNN_name.pml` is parsed and snapshotted as the AST dump
//! followed by the rendered diagnostics. Also checks that every emitted diagnostic is documented
//! in the rule table with the same severity, and tells the user what to do.

use pml_syntax::{SYNTAX_RULES, dump::dump, parse, render};

#[test]
fn parser_cases() {
    insta::glob!("cases/*.pml", |path| {
        let source = std::fs::read_to_string(path).expect("case files are UTF-8");
        let parsed = parse(&source);
        for diagnostic in &parsed.diagnostics {
            let rule = SYNTAX_RULES
                .iter()
                .find(|rule| rule.code == diagnostic.code)
                .unwrap_or_else(|| panic!("{} is not in SYNTAX_RULES", diagnostic.code));
            assert_eq!(
                rule.severity, diagnostic.severity,
                "{}: severity differs from its rule",
                diagnostic.code
            );
            assert!(diagnostic.help.is_some(), "{}: no help", diagnostic.code);
        }
        let file_name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("case.pml");
        let rendered = render(&parsed.diagnostics, file_name, &source, false);
        insta::assert_snapshot!(format!(
            "{}--- diagnostics ---\n{rendered}",
            dump(&parsed.file)
        ));
    });
}
