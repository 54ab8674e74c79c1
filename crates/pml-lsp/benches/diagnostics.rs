//! Diagnostics latency after a one-character edit: of a generated 1 MB schema (the checker
//! benchmark's generator), and of a prompt whose schema is that 1 MB file, open beside it (the
//! schema's check is cached, only the prompt is checked again). Each iteration applies an
//! incremental `didChange` (typing a character, then deleting it, alternately) and computes the
//! document's LSP diagnostics, exactly what the server does when its debounce expires.
//! `round_trip_1mb_schema` measures the same through the JSON-RPC server ([`serve`] on pipes, no
//! debounce): from writing `didChange` to reading the `publishDiagnostics` of that version.

use criterion::{Criterion, criterion_group, criterion_main};
use lsp_server::{Message, Notification, Request, RequestId};
use pml_compiler::testing::generated_schema;
use pml_lsp::{
    DocumentUri, LanguageService, ModelAvailability, Position, Range, ServerOptions, TextChange,
    serve,
};
use serde_json::json;
use std::io::{BufReader, PipeReader, PipeWriter};
use std::time::Duration;

fn uri(text: &str) -> DocumentUri {
    DocumentUri::new(text)
}

/// Alternately types `x` at `at` and deletes it again, so the document keeps its size.
fn toggle(service: &mut LanguageService, uri: &DocumentUri, at: Position, version: &mut i32) {
    *version += 1;
    assert!(service.change(uri, *version, vec![toggle_change(at, *version)]));
}

/// The edit of [`toggle`] that makes `version` from version 1: even versions type, odd ones
/// delete.
fn toggle_change(at: Position, version: i32) -> TextChange {
    let delete = version % 2 == 1;
    let end = if delete {
        Position::new(at.line, at.character + 1)
    } else {
        at
    };
    TextChange {
        range: Some(Range::new(at, end)),
        text: if delete {
            String::new()
        } else {
            "x".to_string()
        },
    }
}

/// `change` as a `contentChanges` entry of `didChange`.
fn change_json(change: &TextChange) -> serde_json::Value {
    let position = |at: Position| json!({"line": at.line, "character": at.character});
    let range = change
        .range
        .map(|range| json!({"start": position(range.start), "end": position(range.end)}));
    json!({"range": range, "text": change.text})
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

/// The client's ends of the pipes to a server running on a thread.
struct Client {
    to_server: PipeWriter,
    from_server: BufReader<PipeReader>,
}

impl Client {
    fn send(&mut self, message: Message) {
        message
            .write(&mut self.to_server)
            .expect("write to the server");
    }

    fn notify(&mut self, method: &str, params: serde_json::Value) {
        self.send(Message::Notification(Notification::new(
            method.to_string(),
            params,
        )));
    }

    /// Reads until the response to request `id`.
    fn response(&mut self, id: i32) {
        loop {
            match Message::read(&mut self.from_server).expect("read") {
                Some(Message::Response(response)) if response.id == RequestId::from(id) => return,
                Some(_) => {}
                None => panic!("the server stopped"),
            }
        }
    }

    /// Reads until the diagnostics of `version` are published.
    fn diagnostics_of(&mut self, version: i32) {
        loop {
            match Message::read(&mut self.from_server).expect("read") {
                Some(Message::Notification(notification))
                    if notification.method == "textDocument/publishDiagnostics"
                        && notification.params["version"] == version => {}
                Some(_) => continue,
                None => panic!("the server stopped"),
            }
            return;
        }
    }
}

fn bench_round_trip(criterion: &mut Criterion) {
    let (schema_text, _) = generated_schema(1 << 20);
    let (server_in, to_server) = std::io::pipe().expect("pipe");
    let (from_server, server_out) = std::io::pipe().expect("pipe");
    let options = ServerOptions {
        model: ModelAvailability::Unavailable {
            reason: "benchmark".to_string(),
        },
        debounce: Duration::ZERO,
    };
    let server = std::thread::spawn(move || serve(BufReader::new(server_in), server_out, options));
    let mut client = Client {
        to_server,
        from_server: BufReader::new(from_server),
    };
    client.send(Message::Request(Request::new(
        RequestId::from(1),
        "initialize".to_string(),
        json!({"capabilities": {}}),
    )));
    client.response(1);
    client.notify("initialized", json!({}));
    let uri = "untitled:bench-schema.pml";
    client.notify(
        "textDocument/didOpen",
        json!({"textDocument": {"uri": uri, "languageId": "pml", "version": 1, "text": schema_text}}),
    );
    client.diagnostics_of(1);

    let mut group = criterion.benchmark_group("lsp_diagnostics");
    group.sample_size(20);
    let mut version = 1;
    group.bench_function("round_trip_1mb_schema", |bencher| {
        bencher.iter(|| {
            version += 1;
            let change = change_json(&toggle_change(Position::new(1, 20), version));
            client.notify(
                "textDocument/didChange",
                json!({"textDocument": {"uri": uri, "version": version}, "contentChanges": [change]}),
            );
            client.diagnostics_of(version);
        })
    });
    group.finish();
    client.send(Message::Request(Request::new(
        RequestId::from(2),
        "shutdown".to_string(),
        json!(null),
    )));
    client.response(2);
    client.notify("exit", json!(null));
    server
        .join()
        .expect("the server thread")
        .expect("a clean shutdown");
}

criterion_group!(benches, bench_diagnostics, bench_round_trip);
criterion_main!(benches);
