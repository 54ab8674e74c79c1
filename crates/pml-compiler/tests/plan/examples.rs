//! Every example schema in `schemas/` lays out, and every example prompt binds, with the test
//! tokenizer and both real chat templates; the results keep the plan's invariants.

use crate::support::{PieceTokenizer, chatml, gemma, parse_prompt, parse_schema};
use pml_compiler::chat_template::ChatTemplate;
use pml_compiler::plan::{BoundPrompt, NewTokenKind, SchemaLayout};
use pml_compiler::{FsSourceLoader, SchemaIndex, bind_prompt, layout_schema};
use pml_syntax::ast::SourceFile;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn example_folders() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../schemas");
    let mut folders = Vec::new();
    let mut pending = vec![root];
    while let Some(folder) = pending.pop() {
        let mut has_pml = false;
        for entry in std::fs::read_dir(&folder).expect("readable folder") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "pml") {
                has_pml = true;
            }
        }
        if has_pml {
            folders.push(folder);
        }
    }
    folders.sort();
    folders
}

fn check_layout_invariants(layout: &SchemaLayout, name: &str) {
    for unit in &layout.units {
        assert_eq!(
            unit.tokens.len(),
            unit.positions.len(),
            "{name}/{}",
            unit.name
        );
        assert!(
            unit.positions.windows(2).all(|pair| pair[0] < pair[1]),
            "{name}/{}: positions increase",
            unit.name
        );
        assert!(unit.end <= layout.end_position, "{name}/{}", unit.name);
        for slot in &unit.params {
            assert_eq!(
                unit.positions[slot.token_offset], slot.start,
                "{name}/{}",
                slot.name
            );
        }
    }
}

fn check_bound_invariants(bound: &BoundPrompt, layout: &SchemaLayout, name: &str) {
    assert_eq!(bound.new_tokens.len(), bound.new_positions.len(), "{name}");
    assert_eq!(bound.new_tokens.len(), bound.new_kinds.len(), "{name}");
    assert_eq!(
        bound.cached[0].unit, layout.units[0].id,
        "{name}: the root comes first"
    );
    let mut cached_positions = HashSet::new();
    for span in &bound.cached {
        let unit = &layout.units[span.unit.index()];
        assert!(span.rows.windows(2).all(|pair| pair[0] < pair[1]), "{name}");
        assert!(
            span.rows.iter().all(|&row| row < unit.tokens.len()),
            "{name}"
        );
        let delta = span
            .placed_at
            .map_or(0, |at| i64::from(at) - i64::from(unit.positions[0]));
        for &row in &span.rows {
            let position = i64::from(unit.positions[row]) + delta;
            assert!(
                cached_positions.insert(position),
                "{name}: two cached rows at {position}"
            );
        }
    }
    for &position in &bound.new_positions {
        assert!(
            !cached_positions.contains(&i64::from(position)),
            "{name}: a new token at cached position {position}"
        );
    }
    assert_eq!(
        bound.new_kinds.last(),
        Some(&NewTokenKind::GenerationPrompt),
        "{name}"
    );
}

fn lay_out_and_bind(tokenizer: &PieceTokenizer, template: &ChatTemplate) -> usize {
    let mut bound_prompts = 0;
    for folder in example_folders() {
        let mut schemas = Vec::new();
        let mut prompts = Vec::new();
        for entry in std::fs::read_dir(&folder).expect("readable folder") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|ext| ext != "pml") {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("readable example");
            match pml_syntax::parse(&source).file {
                SourceFile::Schema(_) => schemas.push((path, source)),
                SourceFile::Prompt(_) => prompts.push((path, source)),
                SourceFile::Empty => panic!("{} has no root", path.display()),
            }
        }
        let loader = FsSourceLoader::new(&folder);
        for (path, source) in &schemas {
            let schema = parse_schema(source);
            let index = SchemaIndex::build(&schema);
            let name = path.display().to_string();
            let layout = layout_schema(
                &schema, &index, source, tokenizer, template, &loader, 131_072,
            )
            .unwrap_or_else(|diagnostics| panic!("{name}: {diagnostics:#?}"));
            check_layout_invariants(&layout, &name);
            for (prompt_path, prompt_source) in &prompts {
                let prompt = parse_prompt(prompt_source);
                if prompt.schema.as_ref().map(|n| n.text.as_str())
                    != Some(layout.schema_name.as_str())
                {
                    continue;
                }
                let prompt_name = prompt_path.display().to_string();
                let bound = bind_prompt(
                    &prompt,
                    &index,
                    &layout,
                    prompt_source,
                    tokenizer,
                    template,
                    true,
                )
                .unwrap_or_else(|diagnostics| panic!("{prompt_name}: {diagnostics:#?}"));
                check_bound_invariants(&bound, &layout, &prompt_name);
                bound_prompts += 1;
            }
        }
    }
    bound_prompts
}

#[test]
fn examples_lay_out_and_bind_with_chatml() {
    let count = lay_out_and_bind(&PieceTokenizer::new(), &chatml());
    assert!(count >= 20, "only {count} example prompts bound");
}

#[test]
fn examples_lay_out_and_bind_with_gemma() {
    let count = lay_out_and_bind(&PieceTokenizer::with_bos(), &gemma());
    assert!(count >= 20, "only {count} example prompts bound");
}
