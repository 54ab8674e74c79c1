//! Property tests: `parse` never panics, is deterministic, and every span it returns (in the
//! tree and in diagnostics) lies within the source on char boundaries, for arbitrary strings,
//! for strings built from PML-ish fragments, and for mutations of the case files.

use pml_syntax::ast::{Attribute, Name, PromptItem, SchemaItem, SourceFile};
use pml_syntax::names::{ROOT_ELEMENTS, SCHEMA_ELEMENTS};
use pml_syntax::{Span, parse, render};
use proptest::prelude::*;
use std::path::Path;

fn collect_attribute_spans(attributes: &[Attribute], spans: &mut Vec<Span>) {
    for attribute in attributes {
        spans.extend([attribute.name.span, attribute.value_span, attribute.span]);
    }
}

fn collect_name_span(name: &Option<Name>, spans: &mut Vec<Span>) {
    spans.extend(name.iter().map(|name| name.span));
}

fn collect_schema_item_spans(item: &SchemaItem, spans: &mut Vec<Span>) {
    let children = match item {
        SchemaItem::Text(run) => {
            spans.push(run.span);
            return;
        }
        SchemaItem::Module(module) => {
            spans.extend([module.span, module.open_tag]);
            collect_name_span(&module.name, spans);
            collect_attribute_spans(&module.attributes, spans);
            &module.items
        }
        SchemaItem::Union(union) => {
            spans.extend([union.span, union.open_tag]);
            collect_attribute_spans(&union.attributes, spans);
            &union.items
        }
        SchemaItem::Collection(collection) => {
            spans.extend([collection.span, collection.open_tag]);
            collect_name_span(&collection.name, spans);
            collect_attribute_spans(&collection.attributes, spans);
            &collection.items
        }
        SchemaItem::Param(param) => {
            spans.extend([param.span, param.open_tag, param.tag.span]);
            spans.extend(param.scaffold.iter().map(|scaffold| scaffold.span));
            collect_name_span(&param.name, spans);
            collect_attribute_spans(&param.attributes, spans);
            return;
        }
        SchemaItem::Role(block) => {
            spans.extend([block.span, block.open_tag]);
            spans.extend(block.close_tag);
            &block.items
        }
    };
    for child in children {
        collect_schema_item_spans(child, spans);
    }
}

fn collect_prompt_item_spans(item: &PromptItem, spans: &mut Vec<Span>) {
    let children = match item {
        PromptItem::Text(run) => {
            spans.push(run.span);
            return;
        }
        PromptItem::RoleClose { span, .. } => {
            spans.push(*span);
            return;
        }
        PromptItem::Import(import) => {
            spans.extend([import.span, import.open_tag, import.name.span]);
            collect_attribute_spans(&import.arguments, spans);
            &import.items
        }
        PromptItem::Role(block) => {
            spans.extend([block.span, block.open_tag]);
            spans.extend(block.close_tag);
            &block.items
        }
    };
    for child in children {
        collect_prompt_item_spans(child, spans);
    }
}

/// Parses `source` and checks the properties; `Err` describes the first violation.
fn check(source: &str) -> Result<(), TestCaseError> {
    let parsed = parse(source);
    prop_assert_eq!(&parsed, &parse(source), "parsing is deterministic");
    let mut spans = Vec::new();
    match &parsed.file {
        SourceFile::Empty => {}
        SourceFile::Schema(schema) => {
            spans.extend([schema.span, schema.open_tag]);
            collect_name_span(&schema.name, &mut spans);
            collect_attribute_spans(&schema.attributes, &mut spans);
            for item in &schema.items {
                collect_schema_item_spans(item, &mut spans);
            }
        }
        SourceFile::Prompt(prompt) => {
            spans.extend([prompt.span, prompt.open_tag]);
            collect_name_span(&prompt.schema, &mut spans);
            collect_attribute_spans(&prompt.attributes, &mut spans);
            for item in &prompt.items {
                collect_prompt_item_spans(item, &mut spans);
            }
        }
    }
    spans.extend(
        parsed
            .diagnostics
            .iter()
            .flat_map(|diagnostic| diagnostic.labels.iter().map(|label| label.span)),
    );
    for span in spans {
        prop_assert!(
            span.start <= span.end && span.end <= source.len(),
            "span {:?} outside 0..{}",
            span,
            source.len()
        );
        prop_assert!(
            source.is_char_boundary(span.start) && source.is_char_boundary(span.end),
            "span {:?} splits a char",
            span
        );
    }
    // Rendering must cope with every diagnostic the parser makes.
    let _ = render(&parsed.diagnostics, "fuzz.pml", source, false);
    Ok(())
}

fn fragment() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("<".to_owned()),
        Just("</".to_owned()),
        Just(">".to_owned()),
        Just("/>".to_owned()),
        Just("=".to_owned()),
        Just("\"".to_owned()),
        Just("'".to_owned()),
        Just(" ".to_owned()),
        Just("\n".to_owned()),
        Just("\r\n".to_owned()),
        Just("\t".to_owned()),
        Just("&".to_owned()),
        Just("&lt;".to_owned()),
        Just("&#x".to_owned()),
        Just(";".to_owned()),
        Just("<![CDATA[".to_owned()),
        Just("]]>".to_owned()),
        Just("<!--".to_owned()),
        Just("-->".to_owned()),
        Just("<?".to_owned()),
        Just("?>".to_owned()),
        Just("é".to_owned()),
        Just("東".to_owned()),
        prop::sample::select(
            ROOT_ELEMENTS
                .iter()
                .chain(SCHEMA_ELEMENTS)
                .copied()
                .chain([
                    "name", "len", "length", "default", "scaffold", "src", "modle", "unit.py", "x",
                ])
                .collect::<Vec<_>>(),
        )
        .prop_map(str::to_owned),
        "[a-zA-Z0-9 ]{1,5}",
    ]
}

fn case_files() -> Vec<String> {
    let directory = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases");
    let mut paths: Vec<_> = std::fs::read_dir(directory)
        .expect("tests/cases exists")
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.extension().is_some_and(|extension| extension == "pml"))
        .collect();
    paths.sort();
    paths
        .iter()
        .map(|path| std::fs::read_to_string(path).expect("case files are UTF-8"))
        .collect()
}

#[derive(Clone, Debug)]
enum Mutation {
    Insert { at: usize, character: char },
    Delete { at: usize },
    Replace { at: usize, character: char },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let character = prop_oneof![
        4 => prop::sample::select(vec!['<', '>', '/', '=', '"', '\'', '&', ';', '!', '[', ']', '-', '?', ' ', '\n', 'a']),
        1 => any::<char>(),
    ];
    prop_oneof![
        (any::<usize>(), character.clone())
            .prop_map(|(at, character)| Mutation::Insert { at, character }),
        any::<usize>().prop_map(|at| Mutation::Delete { at }),
        (any::<usize>(), character).prop_map(|(at, character)| Mutation::Replace { at, character }),
    ]
}

/// Applies a mutation at a char boundary chosen by `at` modulo the number of boundaries.
fn apply(text: &mut String, mutation: &Mutation) {
    let boundaries: Vec<usize> = text
        .char_indices()
        .map(|(index, _)| index)
        .chain([text.len()])
        .collect();
    let pick = |at: usize| boundaries[at % boundaries.len()];
    match *mutation {
        Mutation::Insert { at, character } => text.insert(pick(at), character),
        Mutation::Delete { .. } | Mutation::Replace { .. } if text.is_empty() => {}
        Mutation::Delete { at } => {
            let index = boundaries[at % (boundaries.len() - 1)];
            text.remove(index);
        }
        Mutation::Replace { at, character } => {
            let index = boundaries[at % (boundaries.len() - 1)];
            text.remove(index);
            text.insert(index, character);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_strings(source in any::<String>()) {
        check(&source)?;
    }

    #[test]
    fn pml_like_fragments(pieces in prop::collection::vec(fragment(), 0..80)) {
        check(&pieces.concat())?;
    }

    #[test]
    fn mutated_case_files(file_index in any::<usize>(), mutations in prop::collection::vec(mutation(), 1..8)) {
        let files = case_files();
        let mut source = files[file_index % files.len()].clone();
        for mutation in &mutations {
            apply(&mut source, mutation);
        }
        check(&source)?;
    }
}

#[test]
fn the_mutator_keeps_strings_valid_and_changes_them() {
    let mut text = "a東é".to_owned();
    apply(
        &mut text,
        &Mutation::Replace {
            at: 1,
            character: 'x',
        },
    );
    assert_eq!(text, "axé");
    apply(&mut text, &Mutation::Delete { at: 2 });
    assert_eq!(text, "ax");
    apply(
        &mut text,
        &Mutation::Insert {
            at: 2,
            character: '<',
        },
    );
    assert_eq!(text, "ax<");
    let mut empty = String::new();
    apply(&mut empty, &Mutation::Delete { at: 5 });
    assert_eq!(empty, "");
}

/// Deep nesting once overflowed the stack of every recursive stage; the parser now stops building
/// elements at its depth limit, so neither it nor a walk of its tree can run out of stack.
#[test]
fn deeply_nested_input_is_bounded() {
    for (open, close) in [("<module name=\"m\">", "</module>"), ("<a>", "</a>")] {
        let root = if open.starts_with("<module") {
            "<schema name=\"s\">"
        } else {
            "<prompt schema=\"s\">"
        };
        let depth = 100_000;
        let source = format!("{root}{}{}", open.repeat(depth), close.repeat(depth));
        let parsed = std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || pml_syntax::parse(&source))
            .expect("spawn parser thread")
            .join()
            .expect("parsing deeply nested input must not overflow a small stack");
        let too_deep: Vec<_> = parsed
            .diagnostics
            .iter()
            .filter(|diagnostic| diagnostic.code == "PML017")
            .collect();
        assert_eq!(
            too_deep.len(),
            1,
            "{:?}",
            &parsed.diagnostics[..3.min(parsed.diagnostics.len())]
        );
    }
}
