//! Edit reuse in the prefix cache, on the tiny model: a plain prompt sent again after a small
//! edit in its middle reuses the cached KV of its unchanged tokens past the edit — `usage` says
//! how many were reused, recomputed and new — and, its KV being approximate there, keeps no
//! blocks past its first change; with edit reuse off only the blocks before the change are
//! reused.

mod support;

use pml_server::ServerConfig;
use serde_json::{Value, json};
use support::TestServer;

/// 160 letters: 161 prompt tokens with BOS for the letter tokenizer.
fn document() -> String {
    "the harbor museum opened in nineteen hundred and one; its first keeper wrote the guide "
        .repeat(2)[..160]
        .to_string()
}

/// The document with a word changed at letter 60: blocks 0..=2 (tokens 0..48) stay exact.
fn edited() -> String {
    let mut text = document();
    text.replace_range(60..64, "WXYZ");
    text
}

fn usage(server: &TestServer, prompt: &str) -> Value {
    let (status, answer) =
        server.complete(&json!({"prompt": prompt, "max_tokens": 4, "temperature": 0}));
    assert_eq!(status, 200, "{answer}");
    answer["usage"].clone()
}

#[test]
fn an_edited_prompt_reuses_its_unchanged_tokens_past_the_edit() {
    let server = TestServer::tiny(ServerConfig::default());
    let first = usage(&server, &document());
    assert_eq!(first["cached_tokens"], 0, "{first}");
    let edit = usage(&server, &edited());
    let (prompt, cached, recomputed, new) = (
        edit["prompt_tokens"].as_u64().expect("prompt"),
        edit["cached_tokens"].as_u64().expect("cached"),
        edit["recomputed_tokens"].as_u64().expect("recomputed"),
        edit["new_tokens"].as_u64().expect("new"),
    );
    assert_eq!(cached + recomputed + new, prompt, "{edit}");
    // The prefix splice alone would reuse 48 tokens (three blocks before letter 60, BOS first);
    // the diff also reuses the ~100 after the change, of the 10 full blocks kept.
    assert!(cached + recomputed > 120, "{edit}");
    assert!(recomputed > 0, "{edit}");
    assert!((4..=20).contains(&new), "{edit}");
    assert_eq!(edit["prompt_tokens_details"]["cached_tokens"], cached);

    // Its approximate KV was not kept as blocks: the same edited prompt again finds only the
    // blocks before its change as an exact prefix, and is edit-reused again.
    let again = usage(&server, &edited());
    assert_eq!(again["cached_tokens"], edit["cached_tokens"], "{again}");
}

#[test]
fn without_edit_reuse_only_the_blocks_before_the_edit_are_reused() {
    let server = TestServer::tiny(ServerConfig {
        edit_reuse: false,
        ..ServerConfig::default()
    });
    usage(&server, &document());
    let edit = usage(&server, &edited());
    assert_eq!(edit["cached_tokens"], 48, "{edit}");
    assert_eq!(edit["recomputed_tokens"], 0, "{edit}");
}
