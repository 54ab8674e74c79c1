//! Layout and binding never panic: example schemas and prompts are mutated (slices deleted or
//! duplicated, PML fragments inserted) and laid out and bound, with layouts of the unmutated
//! schema too; every diagnostic must have a documented code and labels inside its source.

use crate::support::PieceTokenizer;
use crate::support::chatml;
use pml_compiler::{MemorySourceLoader, SchemaIndex, all_rules, bind_prompt, layout_schema};
use pml_syntax::Diagnostic;
use pml_syntax::ast::SourceFile;
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

const FRAGMENTS: &[&str] = &[
    "<module name=\"x\">",
    "</module>",
    "<union default=\"x\">",
    "</union>",
    "<collection name=\"c\">",
    "</collection>",
    "<param name=\"p\" len=\"2\">a b c d</param>",
    "<user>",
    "</user>",
    "<assistant>",
    "<tokyo/>",
    "<x p=\"1 2 3\"/>",
    "text\n",
    "<!-- c -->",
];

/// (schema source, prompt sources) of each example folder.
fn seeds() -> &'static Vec<(String, Vec<String>)> {
    static SEEDS: OnceLock<Vec<(String, Vec<String>)>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
        let mut folders = vec![root];
        let mut seeds = Vec::new();
        while let Some(folder) = folders.pop() {
            let mut schema = None;
            let mut prompts = Vec::new();
            for entry in std::fs::read_dir(&folder).expect("readable").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    folders.push(path);
                    continue;
                }
                let Ok(source) = std::fs::read_to_string(&path) else {
                    continue;
                };
                match pml_syntax::parse(&source).file {
                    SourceFile::Schema(_) => schema = Some(source),
                    SourceFile::Prompt(_) => prompts.push(source),
                    SourceFile::Empty => {}
                }
            }
            if let Some(schema) = schema {
                prompts.sort();
                seeds.push((schema, prompts));
            }
        }
        seeds.sort();
        seeds
    })
}

fn boundary(text: &str, at: usize) -> usize {
    let mut position = at % (text.len() + 1);
    while !text.is_char_boundary(position) {
        position -= 1;
    }
    position
}

#[derive(Clone, Debug)]
enum Mutation {
    Delete { at: usize, len: usize },
    Duplicate { at: usize, len: usize, to: usize },
    Insert { at: usize, fragment: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0..120usize).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), 0..120usize, any::<usize>())
            .prop_map(|(at, len, to)| Mutation::Duplicate { at, len, to }),
        (any::<usize>(), 0..FRAGMENTS.len())
            .prop_map(|(at, fragment)| Mutation::Insert { at, fragment }),
    ]
}

fn apply(text: &str, mutations: &[Mutation]) -> String {
    let mut text = text.to_string();
    for mutation in mutations {
        match *mutation {
            Mutation::Delete { at, len } => {
                let start = boundary(&text, at);
                let end = boundary(&text, start + len.min(text.len() - start)).max(start);
                text.replace_range(start..end, "");
            }
            Mutation::Duplicate { at, len, to } => {
                let start = boundary(&text, at);
                let end = boundary(&text, start + len.min(text.len() - start)).max(start);
                let slice = text[start..end].to_string();
                let to = boundary(&text, to);
                text.insert_str(to, &slice);
            }
            Mutation::Insert { at, fragment } => {
                let at = boundary(&text, at);
                text.insert_str(at, FRAGMENTS[fragment]);
            }
        }
    }
    text
}

fn assert_well_formed(source: &str, diagnostics: &[Diagnostic]) {
    assert!(!diagnostics.is_empty(), "an error comes with a diagnostic");
    for diagnostic in diagnostics {
        assert!(
            all_rules().any(|rule| rule.code == diagnostic.code),
            "{}",
            diagnostic.code
        );
        for label in &diagnostic.labels {
            assert!(
                source.get(label.span.start..label.span.end).is_some(),
                "{diagnostic:?}"
            );
        }
    }
}

/// Lays `schema_source` out and binds each prompt, with a layout of `layout_source` (the
/// unmutated schema) as well.
fn run(schema_source: &str, layout_source: &str, prompts: &[String], max_positions: u32) {
    let tokenizer = PieceTokenizer::new();
    let template = chatml();
    let loader = MemorySourceLoader::new();
    let SourceFile::Schema(schema) = pml_syntax::parse(schema_source).file else {
        return;
    };
    let index = SchemaIndex::build(&schema);
    let mut layouts = Vec::new();
    match layout_schema(
        &schema,
        &index,
        schema_source,
        &tokenizer,
        &template,
        &loader,
        max_positions,
    ) {
        Ok(layout) => layouts.push(layout),
        Err(diagnostics) => assert_well_formed(schema_source, &diagnostics),
    }
    if let SourceFile::Schema(original) = pml_syntax::parse(layout_source).file {
        let original_index = SchemaIndex::build(&original);
        if let Ok(layout) = layout_schema(
            &original,
            &original_index,
            layout_source,
            &tokenizer,
            &template,
            &loader,
            max_positions,
        ) {
            layouts.push(layout);
        }
    }
    for prompt_source in prompts {
        let SourceFile::Prompt(prompt) = pml_syntax::parse(prompt_source).file else {
            continue;
        };
        for layout in &layouts {
            if let Err(diagnostics) = bind_prompt(
                &prompt,
                &index,
                layout,
                prompt_source,
                &tokenizer,
                &template,
                true,
            ) {
                assert_well_formed(prompt_source, &diagnostics);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn mutated_schemas_and_prompts(
        seed in any::<usize>(),
        schema_mutations in proptest::collection::vec(mutation(), 0..3),
        prompt_mutations in proptest::collection::vec(mutation(), 0..3),
        small_context in any::<bool>(),
    ) {
        let seeds = seeds();
        let (schema, prompts) = &seeds[seed % seeds.len()];
        let mutated_schema = apply(schema, &schema_mutations);
        let mutated_prompts: Vec<String> =
            prompts.iter().map(|prompt| apply(prompt, &prompt_mutations)).collect();
        let max_positions = if small_context { 200 } else { 131_072 };
        run(&mutated_schema, schema, &mutated_prompts, max_positions);
    }
}
