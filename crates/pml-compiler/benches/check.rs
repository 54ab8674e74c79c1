//! Checker throughput on a generated schema of about 1 MB (modules with params, nested unions,
//! collections, role blocks) and on a prompt importing one module of every kind from it:
//! index building, the schema check on a parsed tree, parse + check together, and the prompt
//! check with a tokenizer.

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pml_compiler::check::{PromptCheckOptions, check_prompt, check_schema};
use pml_compiler::testing::{WORD_TOKENIZER, generated_schema};
use pml_compiler::{MemorySourceLoader, SchemaIndex};
use pml_syntax::ast::SourceFile;
use std::fmt::Write;
use std::hint::black_box;

/// Imports every topic with arguments, a nested union member, and repeated collection members.
fn generated_prompt(n_groups: usize) -> String {
    let mut prompt = String::from("<prompt schema=\"bench\">\n");
    for index in 0..n_groups {
        let _ = writeln!(
            prompt,
            "  <topic-{index} reader=\"a new colleague\" tone=\"plain\"><detailed-{index} focus=\"risks\"><example-b/></detailed-{index}><source-2/><source-1/><source-2/></topic-{index}>"
        );
    }
    prompt.push_str("  Which topic matters most?\n</prompt>\n");
    prompt
}

fn bench_check(criterion: &mut Criterion) {
    let (source, n_groups) = generated_schema(1 << 20);
    let parse = pml_syntax::parse(&source);
    let SourceFile::Schema(schema) = &parse.file else {
        panic!("the generated schema parses as a schema")
    };
    let loader = MemorySourceLoader::new();
    let check = check_schema(schema, &loader);
    assert!(
        parse.diagnostics.is_empty() && check.diagnostics.is_empty(),
        "the benchmark schema must be clean"
    );
    let prompt_source = generated_prompt(n_groups);
    let prompt_parse = pml_syntax::parse(&prompt_source);
    let SourceFile::Prompt(prompt) = &prompt_parse.file else {
        panic!("the generated prompt parses as a prompt")
    };
    let options = PromptCheckOptions {
        tokenizer: Some(&WORD_TOKENIZER),
    };
    let prompt_diagnostics = check_prompt(prompt, &check.index, &options);
    assert!(
        prompt_parse.diagnostics.is_empty() && prompt_diagnostics.is_empty(),
        "{:?}",
        prompt_diagnostics.first()
    );

    let mut group = criterion.benchmark_group("check");
    group.sample_size(20);
    group.throughput(Throughput::Bytes(source.len() as u64));
    group.bench_function("index_1mb_schema", |bencher| {
        bencher.iter(|| SchemaIndex::build(black_box(schema)))
    });
    group.bench_function("check_1mb_schema", |bencher| {
        bencher.iter(|| check_schema(black_box(schema), &loader))
    });
    group.bench_function("parse_and_check_1mb_schema", |bencher| {
        bencher.iter(|| {
            let parse = pml_syntax::parse(black_box(&source));
            match &parse.file {
                SourceFile::Schema(schema) => check_schema(schema, &loader).diagnostics.len(),
                _ => 0,
            }
        })
    });
    group.throughput(Throughput::Bytes(prompt_source.len() as u64));
    group.bench_function("check_prompt_against_1mb_schema", |bencher| {
        bencher.iter(|| check_prompt(black_box(prompt), &check.index, &options))
    });
    group.finish();
}

criterion_group!(benches, bench_check);
criterion_main!(benches);
