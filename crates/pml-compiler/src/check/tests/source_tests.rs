//! `check_source`: parsing, dispatch by root element, and schema resolution for prompts.

use super::codes;
use crate::check::{
    CheckEnvironment, ResolvedSchema, SchemaLookup, SchemaResolver, check_schema, check_source,
};
use crate::source_loader::MemorySourceLoader;
use crate::test_sources::TRAVEL;
use std::collections::HashMap;
use std::sync::Arc;

/// Schemas by name, from source text; records the names asked for.
#[derive(Default)]
struct MapResolver {
    schemas: HashMap<String, Arc<ResolvedSchema>>,
    asked: Vec<Option<String>>,
}

impl MapResolver {
    fn with(mut self, source: &str) -> Self {
        let parse = pml_syntax::parse(source);
        let pml_syntax::ast::SourceFile::Schema(schema) = parse.file else {
            panic!("schema expected")
        };
        let check = check_schema(&schema, &MemorySourceLoader::new());
        let name = check
            .index
            .name()
            .map(|name| name.text.clone())
            .unwrap_or_default();
        let error_count =
            check.error_count() + parse.diagnostics.iter().filter(|d| d.is_error()).count();
        self.schemas.insert(
            name.clone(),
            Arc::new(ResolvedSchema {
                index: check.index,
                error_count,
                location: format!("{name}.pml"),
            }),
        );
        self
    }
}

impl SchemaResolver for MapResolver {
    fn resolve(&mut self, name: Option<&str>) -> SchemaLookup {
        self.asked.push(name.map(str::to_string));
        match name.and_then(|name| self.schemas.get(name)) {
            Some(schema) => SchemaLookup::Found(schema.clone()),
            None => SchemaLookup::NotFound {
                looked_in: "the test map".to_string(),
            },
        }
    }
}

fn check(source: &str, resolver: &mut MapResolver) -> crate::FileCheck {
    let loader = MemorySourceLoader::new();
    let mut environment = CheckEnvironment {
        loader: &loader,
        resolver,
        options: Default::default(),
    };
    check_source(source, &mut environment)
}

#[test]
fn schemas_are_checked_on_their_own() {
    let mut resolver = MapResolver::default();
    let checked = check(
        "<schema name=\"s\"><module>x</module></schema>",
        &mut resolver,
    );
    assert_eq!(codes(&checked.diagnostics), ["PML101"]);
    assert!(checked.schema.is_some());
    assert!(resolver.asked.is_empty(), "a schema needs no resolver");
}

#[test]
fn prompts_are_checked_against_the_resolved_schema() {
    let mut resolver = MapResolver::default().with(TRAVEL);
    let checked = check(
        "<prompt schema=\"travel\"><travel-plan/><nowhere/></prompt>",
        &mut resolver,
    );
    assert_eq!(codes(&checked.diagnostics), ["PML205"]);
    assert_eq!(resolver.asked, [Some("travel".to_string())]);
    assert_eq!(checked.error_count(), 1);
}

#[test]
fn syntax_and_semantic_diagnostics_come_together_in_order() {
    let mut resolver = MapResolver::default();
    let checked = check(
        "<schema name=\"s\"><module name=\"a\" name=\"b\">x</module><module>y</module></schema>",
        &mut resolver,
    );
    assert_eq!(codes(&checked.diagnostics), ["PML004", "PML101"]);
}

#[test]
fn pml203_schema_not_found() {
    let mut resolver = MapResolver::default().with(TRAVEL);
    let source = "<prompt schema=\"travle\"><travel-plan/></prompt>";
    let checked = check(source, &mut resolver);
    assert_eq!(codes(&checked.diagnostics), ["PML203"]);
    assert_eq!(
        checked.diagnostics[0].message,
        "no schema named `travle` found"
    );
    assert!(
        checked.diagnostics[0]
            .help
            .as_deref()
            .is_some_and(|help| help.contains("the test map"))
    );
    let unnamed = check("<prompt><travel-plan/></prompt>", &mut resolver);
    assert_eq!(
        codes(&unnamed.diagnostics),
        ["PML201"],
        "no not-found report when no name was given"
    );
}

#[test]
fn pml204_schema_has_errors() {
    let mut resolver = MapResolver::default()
        .with("<schema name=\"broken\"><module>x</module><module name=\"a\">y</module></schema>");
    let checked = check("<prompt schema=\"broken\"><a/></prompt>", &mut resolver);
    assert_eq!(codes(&checked.diagnostics), ["PML204"]);
    assert_eq!(
        checked.diagnostics[0].message,
        "the schema this prompt uses has 1 error"
    );
    assert!(
        checked.diagnostics[0].labels[0]
            .message
            .contains("broken.pml")
    );
    let clean = check(
        "<prompt schema=\"travel\"><travel-plan/></prompt>",
        &mut MapResolver::default().with(TRAVEL),
    );
    assert!(clean.diagnostics.is_empty());
}

#[test]
fn files_without_a_root_have_only_syntax_diagnostics() {
    let checked = check("just text", &mut MapResolver::default());
    assert!(matches!(checked.file, pml_syntax::ast::SourceFile::Empty));
    assert!(codes(&checked.diagnostics).contains(&"PML012"));
    assert!(
        checked
            .diagnostics
            .iter()
            .all(|diagnostic| diagnostic.code.starts_with("PML0")),
        "{:#?}",
        checked.diagnostics
    );
}
