//! Every compiler diagnostic, rendered: each `tests/fixtures/errors/PMLnnn_name.pml` is checked
//! (prompts against the schema they name, found as `pmlc check` finds it) and its rendered
//! diagnostics are snapshotted. Also checks that every compiler rule has a fixture that triggers
//! it, and that every emitted diagnostic matches its rule's severity and carries help.
//!
//! A fixture may start with `<!-- checked with: schema FILE -->` to be checked against an
//! explicit schema (as with `--schema FILE`); argument lengths are counted one token per word.

use pml_commands::schema_lookup::{FsSchemaResolver, SchemaCache};
use pml_compiler::FsSourceLoader;
use pml_compiler::check::{CheckEnvironment, PromptCheckOptions, check_source};
use pml_compiler::rules::{PROMPT_RULES, SCHEMA_RULES, all_rules};
use pml_compiler::testing::WORD_TOKENIZER;
use std::path::{Path, PathBuf};

/// The fixture folder relative to this crate (the working directory of `cargo test`), so paths
/// in messages are the same on every machine.
const FIXTURES: &str = "../../tests/fixtures/errors";

fn explicit_schema(source: &str) -> Option<PathBuf> {
    let directive = source.strip_prefix("<!-- checked with: schema ")?;
    let file = directive.split_whitespace().next()?;
    Some(Path::new(FIXTURES).join(file))
}

/// Checks one fixture the way `pmlc check` does, with the word tokenizer.
fn check_fixture(path: &Path) -> (String, Vec<pml_syntax::Diagnostic>) {
    let source = std::fs::read_to_string(path).expect("fixtures are UTF-8");
    let explicit = explicit_schema(&source);
    let mut cache = SchemaCache::default();
    let mut resolver = FsSchemaResolver {
        cache: &mut cache,
        explicit: explicit.as_deref(),
        prompt_path: path,
    };
    let loader = FsSourceLoader::new(FIXTURES);
    let mut environment = CheckEnvironment {
        loader: &loader,
        resolver: &mut resolver,
        options: PromptCheckOptions {
            tokenizer: Some(&WORD_TOKENIZER),
        },
    };
    let checked = check_source(&source, &mut environment);
    (source, checked.diagnostics)
}

fn fixture_code(path: &Path) -> String {
    let name = path
        .file_name()
        .and_then(|name| name.to_str())
        .unwrap_or_default();
    name.split('_').next().unwrap_or_default().to_string()
}

#[test]
fn rendered_diagnostics() {
    insta::glob!("../../../tests/fixtures/errors", "PML*.pml", |absolute| {
        let file_name = absolute
            .file_name()
            .and_then(|name| name.to_str())
            .expect("file name");
        let path = Path::new(FIXTURES).join(file_name);
        let (source, diagnostics) = check_fixture(&path);
        let code = fixture_code(&path);
        assert!(
            diagnostics.iter().any(|diagnostic| diagnostic.code == code),
            "{file_name} does not trigger {code}: {diagnostics:#?}"
        );
        for diagnostic in &diagnostics {
            let rule = all_rules()
                .find(|rule| rule.code == diagnostic.code)
                .unwrap_or_else(|| panic!("{} is in no rule table", diagnostic.code));
            assert_eq!(
                rule.severity, diagnostic.severity,
                "{}: severity differs from its rule",
                diagnostic.code
            );
            assert!(diagnostic.help.is_some(), "{}: no help", diagnostic.code);
            assert!(
                !diagnostic.labels.is_empty(),
                "{}: no label",
                diagnostic.code
            );
        }
        insta::assert_snapshot!(pml_syntax::render(&diagnostics, file_name, &source, false));
    });
}

#[test]
fn every_compiler_rule_has_a_fixture() {
    let names: Vec<String> = std::fs::read_dir(FIXTURES)
        .expect("fixture folder")
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().into_string().ok())
        .collect();
    for rule in SCHEMA_RULES.iter().chain(PROMPT_RULES) {
        let expected = format!("{}_{}.pml", rule.code, rule.name.replace('-', "_"));
        assert!(
            names.contains(&expected),
            "missing fixture {FIXTURES}/{expected}"
        );
    }
}
