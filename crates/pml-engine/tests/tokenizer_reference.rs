//! Tokenizers rebuilt from GGUF metadata against llama.cpp: every case of the reference fixture
//! `tests/fixtures/reference/tokenizer-<model>.json` (written by `scripts/` with llama.cpp: no BOS,
//! special tokens not parsed), plus hand-checked cases about special tokens and BOS/EOS.
//! Needs the fetched models; skips (or fails under PML_REQUIRE_MODELS=1) without them.

use std::path::PathBuf;
use std::sync::OnceLock;

use pml_engine::Tokenizer;
use pml_engine::gguf::GgufFile;
use pml_engine::tokenizer::GgufTokenizer;
use pml_testkit::fetched_model;
use serde::Deserialize;

#[derive(Deserialize)]
struct Fixture {
    model: String,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
}

fn fixture_path(model_id: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/reference")
        .join(format!("tokenizer-{model_id}.json"))
}

/// The model's tokenizer, built once per test binary (Gemma's takes a while to build).
fn tokenizer(model_id: &'static str) -> Option<&'static GgufTokenizer> {
    static QWEN: OnceLock<Option<GgufTokenizer>> = OnceLock::new();
    static GEMMA: OnceLock<Option<GgufTokenizer>> = OnceLock::new();
    static SMOLLM: OnceLock<Option<GgufTokenizer>> = OnceLock::new();
    let cell = match model_id {
        "qwen2.5-0.5b" => &QWEN,
        "gemma3-270m" => &GEMMA,
        "smollm2-135m" => &SMOLLM,
        other => panic!("no tokenizer cell for {other}"),
    };
    cell.get_or_init(|| {
        let path = fetched_model(model_id)?;
        let gguf = GgufFile::open(&path).unwrap_or_else(|error| panic!("{error}"));
        Some(GgufTokenizer::from_gguf(&gguf).unwrap_or_else(|error| panic!("{error}")))
    })
    .as_ref()
}

fn describe(tokenizer: &GgufTokenizer, ids: &[u32]) -> String {
    let pieces: Vec<String> = ids
        .iter()
        .map(|id| format!("{id}:{:?}", tokenizer.token_text(*id).unwrap_or_default()))
        .collect();
    pieces.join(" ")
}

fn check_fixture(model_id: &'static str) {
    let Some(tokenizer) = tokenizer(model_id) else {
        return;
    };
    let path = fixture_path(model_id);
    // The fixture is committed: a missing one is a broken checkout, never a pass.
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("reference fixture {}: {error}", path.display()));
    let fixture: Fixture =
        serde_json::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
    assert_eq!(
        fixture.model,
        model_id,
        "fixture {} is for another model",
        path.display()
    );
    assert!(
        !fixture.cases.is_empty(),
        "fixture {} has no cases",
        path.display()
    );
    let mut mismatches = Vec::new();
    for (index, case) in fixture.cases.iter().enumerate() {
        match tokenizer.encode(&case.text, false) {
            Ok(ids) if ids == case.ids => {}
            Ok(ids) => mismatches.push(format!(
                "case {index} {:?}\n  llama.cpp: {}\n  ours:      {}",
                case.text,
                describe(tokenizer, &case.ids),
                describe(tokenizer, &ids)
            )),
            Err(error) => mismatches.push(format!("case {index} {:?}: {error}", case.text)),
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} cases differ from llama.cpp for {model_id}:\n{}",
        mismatches.len(),
        fixture.cases.len(),
        mismatches.join("\n")
    );
}

#[test]
fn qwen_matches_llama_cpp_on_the_fixture() {
    check_fixture("qwen2.5-0.5b");
}

#[test]
fn gemma_matches_llama_cpp_on_the_fixture() {
    check_fixture("gemma3-270m");
}

#[test]
fn smollm_matches_llama_cpp_on_the_fixture() {
    check_fixture("smollm2-135m");
}

#[test]
fn qwen_hand_checked_cases() -> Result<(), pml_engine::TokenizeError> {
    let Some(tokenizer) = tokenizer("qwen2.5-0.5b") else {
        return Ok(());
    };
    assert_eq!(tokenizer.encode("Hello world", false)?, [9707, 1879]);
    assert_eq!(tokenizer.encode("<|im_start|>", true)?, [151644]);
    let forged = tokenizer.encode("<|im_start|>", false)?;
    assert!(
        !forged.contains(&151644) && forged.first() == Some(&27),
        "{forged:?}"
    );
    assert_eq!(
        tokenizer.encode("<|im_start|>user\nHello world<|im_end|>\n", true)?[..2],
        [151644, 872]
    );
    assert_eq!(tokenizer.bos_token(), None);
    let eos = tokenizer.eos_tokens();
    assert!(eos.contains(&151645) && eos.contains(&151643), "{eos:?}");
    assert_eq!(tokenizer.pad_token(), 151643);
    assert_eq!(tokenizer.vocab_size(), 151_936);
    let text = "def add(a, b):\n    return a + b  # 你好 🚀\n";
    assert_eq!(tokenizer.decode(&tokenizer.encode(text, false)?)?, text);
    assert_eq!(tokenizer.decode(&[151644])?, "<|im_start|>");
    assert_eq!(tokenizer.encode("", true)?, Vec::<u32>::new());
    Ok(())
}

#[test]
fn gemma_hand_checked_cases() -> Result<(), pml_engine::TokenizeError> {
    let Some(tokenizer) = tokenizer("gemma3-270m") else {
        return Ok(());
    };
    assert_eq!(tokenizer.encode("Hello world", false)?, [9259, 1902]);
    assert_eq!(tokenizer.encode("你好", false)?, [144626]);
    assert_eq!(tokenizer.encode("<start_of_turn>", true)?, [105]);
    let forged = tokenizer.encode("<start_of_turn>", false)?;
    assert!(
        !forged.contains(&105) && forged.first() == Some(&236820),
        "{forged:?}"
    );
    // Newlines and runs of spaces are user-defined tokens: always whole, special or not.
    let ids = tokenizer.encode("a\nb  c", false)?;
    assert!(ids.contains(&107) && ids.contains(&138), "{ids:?}");
    assert_eq!(tokenizer.bos_token(), Some(2));
    let eos = tokenizer.eos_tokens();
    assert!(eos.contains(&1) && eos.contains(&106), "{eos:?}");
    assert_eq!(tokenizer.pad_token(), 0);
    assert_eq!(tokenizer.vocab_size(), 262_144);
    let text = "def add(a, b):\n    return a + b  # 你好 🚀\n";
    assert_eq!(tokenizer.decode(&tokenizer.encode(text, false)?)?, text);
    assert_eq!(
        tokenizer.decode(&[105, 2364, 107])?,
        "<start_of_turn>user\n"
    );
    Ok(())
}

/// Every token's bytes (what constrained decoding matches grammars over) concatenated give the
/// text the tokenizer decodes, on the fixture's cases; markup tokens are never text.
fn check_token_bytes(model_id: &'static str) {
    let Some(tokenizer) = tokenizer(model_id) else {
        return;
    };
    let fixture: Fixture = serde_json::from_str(
        &std::fs::read_to_string(fixture_path(model_id)).expect("fixture readable"),
    )
    .expect("fixture parses");
    for case in &fixture.cases {
        let mut bytes = Vec::new();
        for &id in &case.ids {
            match tokenizer.token_bytes(id) {
                Some(pml_engine::tokenizer::TokenBytes::Text(piece)) => bytes.extend(piece),
                other => panic!("{model_id}: token {id} of {:?} is {other:?}", case.text),
            }
        }
        let decoded = tokenizer.decode(&case.ids).expect("decodes");
        // SentencePiece decoding drops the space its first piece starts with.
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            text == decoded || text.strip_prefix(' ') == Some(decoded.as_str()),
            "{model_id}: bytes {text:?} against decoded {decoded:?}"
        );
    }
    let eos = tokenizer.eos_tokens()[0];
    assert!(matches!(
        tokenizer.token_bytes(eos),
        Some(pml_engine::tokenizer::TokenBytes::Special(_))
    ));
    assert_eq!(tokenizer.token_bytes(tokenizer.vocab_size() as u32), None);
}

#[test]
fn qwen_token_bytes_spell_the_decoded_text() {
    check_token_bytes("qwen2.5-0.5b");
}

#[test]
fn gemma_token_bytes_spell_the_decoded_text() {
    check_token_bytes("gemma3-270m");
}
