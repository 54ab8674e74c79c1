//! Incremental detokenization with the real tokenizers: streaming a text's tokens one at a time
//! yields exactly the text, with no replacement character where byte-level BPE (Qwen) or byte
//! fallback (Gemma) split a character across tokens, and with Gemma's leading spaces kept.
//! Skipped (with a notice) when a model is not fetched, unless `PML_REQUIRE_MODELS=1`.

use pml_engine::Tokenizer;
use pml_engine::generation::IncrementalDetokenizer;
use pml_engine::gguf::GgufFile;
use pml_engine::tokenizer::GgufTokenizer;
use pml_testkit::fetched_model;

/// Accents, CJK, emoji and rare hieroglyphs (byte fallback even in a 262k vocabulary):
/// characters of 2, 3 and 4 bytes, some split across tokens.
const TEXT: &str = "Déjà vu in 東京: naïve café ☕ costs 5€ 🙂🦀 — ok, 𓂀 ꙮ 𒀭 too";

fn tokenizer(id: &str) -> Option<GgufTokenizer> {
    let path = fetched_model(id)?;
    let gguf = GgufFile::open(&path).expect("the fetched GGUF opens");
    Some(GgufTokenizer::from_gguf(&gguf).expect("the tokenizer builds"))
}

/// Streams `text`'s tokens after the `context` text and returns the pieces released.
fn stream_pieces(tokenizer: &GgufTokenizer, context: &str, text: &str) -> Vec<String> {
    let context_tokens = tokenizer.encode(context, false).unwrap();
    let mut all_tokens = context_tokens.clone();
    all_tokens.extend(tokenizer.encode(text, false).unwrap());
    let text_tokens = &all_tokens[context_tokens.len()..];
    let mut detokenizer = IncrementalDetokenizer::new(tokenizer, &context_tokens);
    let mut pieces: Vec<String> = text_tokens
        .iter()
        .map(|&token| detokenizer.push(token).unwrap())
        .collect();
    pieces.push(detokenizer.finish().unwrap());
    pieces
}

fn check(id: &str) {
    let Some(tokenizer) = tokenizer(id) else {
        return;
    };
    let tokens = tokenizer.encode(TEXT, false).unwrap();
    let split_characters = tokens
        .iter()
        .filter(|&&token| tokenizer.decode(&[token]).unwrap().contains('\u{FFFD}'))
        .count();
    assert!(
        split_characters > 0,
        "{id}: the text should split a character across tokens"
    );

    let pieces = stream_pieces(&tokenizer, "", TEXT);
    assert!(
        pieces.iter().all(|piece| !piece.contains('\u{FFFD}')),
        "{id}: {pieces:?}"
    );
    assert_eq!(pieces.concat(), tokenizer.decode(&tokens).unwrap(), "{id}");

    // After a prompt, the answer's first word keeps its leading space.
    let pieces = stream_pieces(&tokenizer, "The capital of France is", " Paris.");
    assert_eq!(pieces.concat(), " Paris.", "{id}: {pieces:?}");
}

#[test]
fn qwen_streams_exact_text() {
    check("qwen2.5-0.5b");
}

#[test]
fn gemma_streams_exact_text() {
    check("gemma3-270m");
}
