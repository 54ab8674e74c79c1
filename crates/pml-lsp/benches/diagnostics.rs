//! Diagnostics latency after a one-character edit: of a generated 1 MB schema (the checker
//! benchmark's generator), and of a prompt whose schema is that 1 MB file, open beside it (the
//! schema's check is cached, only the prompt is checked again). Each iteration applies an
//! incremental `didChange` (typing a character, then deleting it, alternately) and computes the
//! document's LSP diagnostics, exactly what the server does when its debounce expires.

use criterion::{Criterion, criterion_group, criterion_main};
use lsp_types::{Position, Range, TextDocumentContentChangeEvent, Uri};
use pml_compiler::testing::generated_schema;
use pml_lsp::{LanguageService, ModelAvailability};
use std::str::FromStr;

fn uri(text: &str) -> Uri {
    Uri::from_str(text).expect("a valid URI")
}

/// Alternately types `x` at `at` and deletes it again, so the document keeps its size.
fn toggle(service: &mut LanguageService, uri: &Uri, at: Position, version: &mut i32) {
    let delete = *version % 2 == 0;
    let end = if delete {
        Position::new(at.line, at.character + 1)
    } else {
        at
    };
    let change = TextDocumentContentChangeEvent {
        range: Some(Range::new(at, end)),
        range_length: None,
        text: if delete {
            String::new()
        } else {
            "x".to_string()
        },
    };
    *version += 1;
    assert!(service.change(uri, *version, vec![change]));
}

fn bench_diagnostics(criterion: &mut Criterion) {
    let (schema_text, _) = generated_schema(1 << 20);
    let schema_uri = uri("untitled:bench-schema.pml");
    let prompt_uri = uri("untitled:bench-prompt.pml");
    let mut service = LanguageService::new(ModelAvailability::Unavailable {
        reason: "benchmark".to_string(),
    });
    service.open(schema_uri.clone(), schema_text, 1);
    service.open(
        prompt_uri.clone(),
        "<prompt schema=\"bench\">\n  <topic-7 reader=\"a colleague\" tone=\"plain\"/>\n  Which?\n</prompt>\n"
            .to_string(),
        1,
    );
    let (diagnostics, _) = service.diagnostics(&schema_uri).expect("open");
    assert!(diagnostics.is_empty(), "the generated schema is clean");
    let (diagnostics, _) = service.diagnostics(&prompt_uri).expect("open");
    assert!(diagnostics.is_empty(), "{diagnostics:?}");

    let mut group = criterion.benchmark_group("lsp_diagnostics");
    group.sample_size(20);
    // Line 1 is `  <system>You are a careful assistant.</system>`: type inside its text.
    let in_text = Position::new(1, 20);
    let mut version = 1;
    group.bench_function("edit_1mb_schema", |bencher| {
        bencher.iter(|| {
            toggle(&mut service, &schema_uri, in_text, &mut version);
            service.diagnostics(&schema_uri).map(|(d, _)| d.len())
        })
    });
    // Line 2 holds the prompt's trailing text.
    let mut prompt_version = 1;
    group.bench_function("edit_prompt_of_1mb_schema", |bencher| {
        bencher.iter(|| {
            toggle(
                &mut service,
                &prompt_uri,
                Position::new(2, 3),
                &mut prompt_version,
            );
            service.diagnostics(&prompt_uri).map(|(d, _)| d.len())
        })
    });
    group.finish();
}

criterion_group!(benches, bench_diagnostics);
criterion_main!(benches);
