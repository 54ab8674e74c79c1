//! The spawned-process variant of `pml-lsp`'s random-edit property (which runs thousands of
//! edits on the library): a seeded stream of incremental edits — PML fragments, half tags and
//! multi-byte characters at arbitrary UTF-16 positions — sent to the real `pml lsp`, with hover,
//! completion and definition requests in between. The server must answer every request, publish
//! diagnostics for the last version, and exit 0 after `shutdown`/`exit`.

mod lsp_client;

use lsp_client::LspClient;
use pml_lsp::testing::EDIT_FRAGMENTS as FRAGMENTS;
use serde_json::json;

/// xorshift64: a fixed, dependency-free stream, so a failure replays exactly.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound
    }
}

#[test]
fn random_edits_over_stdio_never_break_the_server() {
    let folder = std::env::temp_dir().join(format!("pml-lsp-random-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&folder);
    std::fs::create_dir_all(&folder).expect("temp folder");
    std::fs::write(
        folder.join("s.pml"),
        "<schema name=\"s\">\n  <module name=\"m\">T <param name=\"p\" len=\"3\"/>\n    <union><module name=\"a\">A</module><module name=\"b\">B</module></union>\n  </module>\n</schema>\n",
    )
    .expect("write schema");
    let uri = pml_lsp::uri::from_path(&folder.join("p.pml"))
        .expect("absolute path")
        .as_str()
        .to_string();
    let (mut client, _) = LspClient::start(&["--no-model", "--debounce-ms", "5"], &folder);
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "pml", "version": 0,
               "text": "<prompt schema=\"s\">\n  <m p=\"𝄞 x\"><a/></m>\n</prompt>\n"}}),
    );
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let edits = 150;
    for version in 1..=edits {
        let start = json!({"line": rng.below(6), "character": rng.below(40)});
        let end = json!({"line": rng.below(6), "character": rng.below(40)});
        let (start, end) = if (start["line"].as_u64(), start["character"].as_u64())
            <= (end["line"].as_u64(), end["character"].as_u64())
        {
            (start, end)
        } else {
            (end, start)
        };
        let text: String = (0..rng.below(4))
            .map(|_| FRAGMENTS[rng.below(FRAGMENTS.len() as u64) as usize])
            .collect();
        client.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": uri, "version": version},
                   "contentChanges": [{"range": {"start": start, "end": end}, "text": text}]}),
        );
        let at = json!({"textDocument": {"uri": uri},
                        "position": {"line": rng.below(6), "character": rng.below(40)}});
        let method = [
            "textDocument/hover",
            "textDocument/completion",
            "textDocument/definition",
        ][rng.below(3) as usize];
        client.request(method, at);
    }
    // Diagnostics are eventually published for the last version.
    loop {
        let published = client.diagnostics(&uri);
        if published["version"] == edits {
            break;
        }
    }
    client.request(
        "textDocument/documentSymbol",
        json!({"textDocument": {"uri": uri}}),
    );
    assert!(client.shutdown().success());
    let _ = std::fs::remove_dir_all(&folder);
}
