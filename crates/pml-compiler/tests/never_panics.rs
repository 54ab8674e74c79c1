//! The checker never panics, whatever the parser hands it: example schemas and prompts
//! (`schemas/`) and the error fixtures (`tests/fixtures/errors/`) are mutated (slices deleted,
//! duplicated or replaced by PML fragments) and arbitrary PML-like text is generated; every result
//! is checked as a schema or as a prompt against several schemas, with a tokenizer. Every label
//! must also lie inside the source on character boundaries (the renderer slices by it), and every
//! code must be documented.

use pml_compiler::check::{PromptCheckOptions, check_prompt, check_schema};
use pml_compiler::testing::FnTokenizer;
use pml_compiler::{MemorySourceLoader, RefuseSources, SchemaIndex, all_rules};
use pml_syntax::Diagnostic;
use pml_syntax::ast::SourceFile;
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One token per character, its code point as id.
const CHAR_TOKENIZER: FnTokenizer = FnTokenizer::new(
    |text| text.chars().map(u32::from).collect(),
    |ids| ids.iter().filter_map(|&id| char::from_u32(id)).collect(),
    0x11_0000,
);

const FRAGMENTS: &[&str] = &[
    "<module name=\"a\">",
    "<module name=\"tokyo\">",
    "<module>",
    "</module>",
    "<module name=\"s\" src=\"a.txt\"/>",
    "<module name=\"s\" src=\"../x\">t</module>",
    "<union>",
    "<union default=\"a\">",
    "<union scaffold=\"zz\">",
    "</union>",
    "<collection name=\"c\">",
    "</collection>",
    "<param name=\"p\" len=\"3\"/>",
    "<param name=\"p\" len=\"0\"/>",
    "<parameter name=\"q\" length=\"99999999999999999999\"/>",
    "<param len=\"x\">scaffold</param>",
    "<user>",
    "</user>",
    "<system>",
    "</system>",
    "<assistant>",
    "</assistant>",
    "<tokyo/>",
    "<a p=\"1 2 3 4 5\">",
    "</a>",
    "<overseas>",
    "</overseas>",
    "<travel-plan duration=\"a b c d\">",
    "</travel-plan>",
    "<schema name=\"travel\">",
    "</schema>",
    "<prompt schema=\"travel\">",
    "</prompt>",
    "<![CDATA[ x < y ]]>",
    "<!-- c -->",
    "&lt;",
    "&bogus;",
    "<",
    ">",
    "/>",
    "\"",
    "=",
    " name=\"\" ",
    "é東",
    "\n    ",
];

fn seed_files() -> &'static Vec<String> {
    static SEEDS: OnceLock<Vec<String>> = OnceLock::new();
    SEEDS.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut files = Vec::new();
        collect_pml(&root.join("schemas"), &mut files);
        collect_pml(&root.join("tests/fixtures/errors"), &mut files);
        files.sort();
        let mut seeds: Vec<String> = files
            .iter()
            .filter_map(|path| std::fs::read_to_string(path).ok())
            .collect();
        // Large example files make every case slow; a prefix keeps their structure's beginning.
        for seed in &mut seeds {
            let cut = seed
                .char_indices()
                .map(|(index, _)| index)
                .take_while(|&index| index <= 6_000)
                .last();
            if let Some(cut) = cut.filter(|_| seed.len() > 6_000) {
                seed.truncate(cut);
            }
        }
        assert!(seeds.len() >= 29, "the error fixtures at least are there");
        seeds
    })
}

fn collect_pml(folder: &Path, files: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        let path = entry.path();
        if path.is_dir() {
            collect_pml(&path, files);
        } else if path.extension().is_some_and(|extension| extension == "pml") {
            files.push(path);
        }
    }
}

/// Schemas to check prompts against: every seed schema, indexed.
fn seed_schemas() -> &'static Vec<SchemaIndex> {
    static SCHEMAS: OnceLock<Vec<SchemaIndex>> = OnceLock::new();
    SCHEMAS.get_or_init(|| {
        seed_files()
            .iter()
            .filter_map(|source| match pml_syntax::parse(source).file {
                SourceFile::Schema(schema) => Some(SchemaIndex::build(&schema)),
                _ => None,
            })
            .collect()
    })
}

#[derive(Clone, Debug)]
enum Mutation {
    Delete { at: usize, len: usize },
    Insert { at: usize, fragment: usize },
    Duplicate { at: usize, len: usize, to: usize },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 0..200usize).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (any::<usize>(), 0..FRAGMENTS.len())
            .prop_map(|(at, fragment)| Mutation::Insert { at, fragment }),
        (any::<usize>(), 0..200usize, any::<usize>())
            .prop_map(|(at, len, to)| Mutation::Duplicate { at, len, to }),
    ]
}

/// The nearest character boundary at or below `at % (len + 1)`.
fn boundary(text: &str, at: usize) -> usize {
    let mut position = at % (text.len() + 1);
    while !text.is_char_boundary(position) {
        position -= 1;
    }
    position
}

fn apply(text: &mut String, mutation: &Mutation) {
    match *mutation {
        Mutation::Delete { at, len } => {
            let start = boundary(text, at);
            let end = boundary(text, start + len.min(text.len() - start));
            text.replace_range(start..end.max(start), "");
        }
        Mutation::Insert { at, fragment } => {
            let at = boundary(text, at);
            text.insert_str(at, FRAGMENTS[fragment]);
        }
        Mutation::Duplicate { at, len, to } => {
            let start = boundary(text, at);
            let end = boundary(text, start + len.min(text.len() - start)).max(start);
            let slice = text[start..end].to_string();
            let to = boundary(text, to);
            text.insert_str(to, &slice);
        }
    }
}

fn assert_well_formed(source: &str, diagnostics: &[Diagnostic]) {
    for diagnostic in diagnostics {
        assert!(
            all_rules().any(|rule| rule.code == diagnostic.code),
            "undocumented code {}",
            diagnostic.code
        );
        for label in &diagnostic.labels {
            let span = label.span;
            assert!(
                span.start <= span.end && span.end <= source.len(),
                "{}: span {span:?} outside the source",
                diagnostic.code
            );
            assert!(
                source.is_char_boundary(span.start) && source.is_char_boundary(span.end),
                "{}: span {span:?} splits a character",
                diagnostic.code
            );
        }
    }
}

/// Checks `source` every way the toolchain can.
fn check_everything(source: &str) {
    let parse = pml_syntax::parse(source);
    match &parse.file {
        SourceFile::Schema(schema) => {
            let loader = MemorySourceLoader::new()
                .with_file("a.txt", "text")
                .with_bytes("b.bin", &[0xff]);
            let check = check_schema(schema, &loader);
            assert_well_formed(source, &check.diagnostics);
            assert_well_formed(source, &check_schema(schema, &RefuseSources).diagnostics);
            // The mutated schema's own index must also serve prompts.
            let prompt = pml_syntax::parse(
                "<prompt schema=\"travel\"><a p=\"1\"><tokyo/></a><tokyo/></user></prompt>",
            );
            if let SourceFile::Prompt(prompt) = &prompt.file {
                let options = PromptCheckOptions {
                    tokenizer: Some(&CHAR_TOKENIZER),
                };
                let _ = check_prompt(prompt, &check.index, &options);
            }
            let (Some(first), Some(last)) =
                (check.index.modules().next(), check.index.modules().last())
            else {
                return;
            };
            let _ = check.index.are_exclusive(first.0, last.0);
            let _ = check.index.path(last.0);
        }
        SourceFile::Prompt(prompt) => {
            let options = PromptCheckOptions {
                tokenizer: Some(&CHAR_TOKENIZER),
            };
            for schema in seed_schemas() {
                assert_well_formed(source, &check_prompt(prompt, schema, &options));
            }
            assert_well_formed(
                source,
                &check_prompt(
                    prompt,
                    &SchemaIndex::default(),
                    &PromptCheckOptions::default(),
                ),
            );
        }
        SourceFile::Empty => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn mutated_examples_never_panic(seed in any::<prop::sample::Index>(), mutations in prop::collection::vec(mutation(), 1..8)) {
        let seeds = seed_files();
        let mut source = seeds[seed.index(seeds.len())].clone();
        for mutation in &mutations {
            apply(&mut source, mutation);
        }
        check_everything(&source);
    }

    #[test]
    fn generated_markup_never_panics(pieces in prop::collection::vec(prop_oneof![
        (0..FRAGMENTS.len()).prop_map(|index| FRAGMENTS[index].to_string()),
        "[a-z<>/=\" \n]{0,12}",
    ], 0..60)) {
        let body: String = pieces.concat();
        check_everything(&format!("<schema name=\"travel\">{body}</schema>"));
        check_everything(&format!("<prompt schema=\"travel\">{body}</prompt>"));
        check_everything(&body);
    }
}

#[test]
fn unmutated_seeds_are_checked_too() {
    for seed in seed_files() {
        check_everything(seed);
    }
}
