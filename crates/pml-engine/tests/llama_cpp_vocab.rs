//! Tokenizers rebuilt from GGUF metadata against llama.cpp's own tokenizer test set: the
//! vocab-only files `ggml-vocab-<name>.gguf` with their `.inp` (texts) and `.out` (token ids)
//! pairs from llama.cpp's `models/` folder, tokenized as its `test-tokenizer-0` does (no BOS or
//! EOS added, control tokens not parsed). Every pair of every vocab whose family PML supports.
//!
//! The data comes from `scripts/fetch-llama-cpp-testdata.sh` (run by `scripts/test.sh`), found by
//! `pml_testkit::llama_cpp_models`; absent, the tests skip, or fail under `PML_REQUIRE_MODELS=1`.

use std::path::Path;

use pml_engine::Tokenizer;
use pml_engine::gguf::GgufFile;
use pml_engine::tokenizer::GgufTokenizer;
use pml_testkit::llama_cpp_models;

/// Separator of the texts in an `.inp` file (llama.cpp's `convert_hf_to_gguf_update.py`).
const SEPARATOR: &str = "\n__ggml_vocab_test__\n";

/// The texts and expected ids of `ggml-vocab-<name>.gguf`.
fn pairs(dir: &Path, name: &str) -> Vec<(String, Vec<u32>)> {
    let read = |extension: &str| {
        let path = dir.join(format!("ggml-vocab-{name}.gguf.{extension}"));
        std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
    };
    let inputs = read("inp");
    let outputs = read("out");
    // Every text is followed by the separator, the last one too.
    let texts: Vec<&str> = inputs
        .strip_suffix(SEPARATOR)
        .unwrap_or_else(|| panic!("{name}: .inp does not end with the separator"))
        .split(SEPARATOR)
        .collect();
    let ids: Vec<Vec<u32>> = outputs
        .lines()
        .map(|line| {
            line.split_whitespace()
                .map(|id| id.parse().unwrap_or_else(|_| panic!("bad id {id:?}")))
                .collect()
        })
        .collect();
    assert_eq!(
        texts.len(),
        ids.len(),
        "{name}: {} texts but {} id lines",
        texts.len(),
        ids.len()
    );
    assert!(!texts.is_empty(), "{name}: no pairs");
    texts.into_iter().map(str::to_owned).zip(ids).collect()
}

/// Every pair of vocab `name` tokenizes as llama.cpp does; the mismatches listed otherwise.
fn check_vocab(name: &str) {
    let Some(dir) = llama_cpp_models() else {
        return;
    };
    let path = dir.join(format!("ggml-vocab-{name}.gguf"));
    let gguf = GgufFile::open(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    let tokenizer =
        GgufTokenizer::from_gguf(&gguf).unwrap_or_else(|error| panic!("{name}: {error}"));
    let pairs = pairs(&dir, name);
    let mut mismatches = Vec::new();
    for (text, expected) in &pairs {
        let ids = tokenizer
            .encode(text, false)
            .unwrap_or_else(|error| panic!("{name}: {text:?}: {error}"));
        if &ids != expected {
            mismatches.push(format!(
                "{text:?}\n  llama.cpp: {expected:?}\n  pml:       {ids:?}"
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{name}: {} of {} pairs differ:\n{}",
        mismatches.len(),
        pairs.len(),
        mismatches.join("\n")
    );
}

macro_rules! vocab_tests {
    ($($test:ident => $name:literal,)*) => {
        $(
            #[test]
            fn $test() {
                check_vocab($name);
            }
        )*
    };
}

vocab_tests! {
    qwen2 => "qwen2",
    llama_bpe => "llama-bpe",
    llama_spm => "llama-spm",
    gpt_2 => "gpt-2",
    phi_3 => "phi-3",
    deepseek_llm => "deepseek-llm",
    deepseek_coder => "deepseek-coder",
    starcoder => "starcoder",
    refact => "refact",
    command_r => "command-r",
    falcon => "falcon",
    mpt => "mpt",
}
