//! The JSON-RPC loop over any reader and writer (stdio for `pml lsp`): the LSP lifecycle
//! (`initialize`, `shutdown`, `exit`), document notifications and requests, dispatched to
//! [`LanguageService`] through `from_proto` and `to_proto`. Diagnostics are debounced: an edit
//! schedules every open document (a prompt's diagnostics depend on its schema) for `debounce`
//! later, and further edits push that back, so a burst of keystrokes is checked once. Messages
//! are read on a thread of their own so the loop can wait for either the next message or the
//! next deadline.

use crate::model::ModelAvailability;
use crate::service::LanguageService;
use crate::uri::DocumentUri;
use crate::{from_proto, to_proto};
use crossbeam_channel::{Receiver, RecvTimeoutError};
use lsp_server::{ErrorCode, Message, Notification, Request, RequestId, Response};
use lsp_types::notification::{
    DidChangeTextDocument, DidCloseTextDocument, DidOpenTextDocument, DidSaveTextDocument, Exit,
    Notification as _, PublishDiagnostics,
};
use lsp_types::request::{
    Completion, DocumentSymbolRequest, FoldingRangeRequest, GotoDefinition, HoverRequest,
    Initialize, References, Request as _, Shutdown,
};
use lsp_types::{
    CompletionOptions, FoldingRangeProviderCapability, HoverProviderCapability, InitializeResult,
    OneOf, PositionEncodingKind, PublishDiagnosticsParams, SaveOptions, ServerCapabilities,
    ServerInfo, TextDocumentSyncCapability, TextDocumentSyncKind, TextDocumentSyncOptions,
    TextDocumentSyncSaveOptions,
};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

/// What the host decides about a server.
pub struct ServerOptions {
    pub model: ModelAvailability,
    /// How long after the last edit diagnostics are computed.
    pub debounce: Duration,
}

/// The default debounce: long enough to cover a burst of keystrokes, short enough to feel live.
pub const DEFAULT_DEBOUNCE: Duration = Duration::from_millis(150);

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot read a message from the client: {0}")]
    Read(std::io::Error),
    #[error("cannot write a message to the client: {0}")]
    Write(std::io::Error),
    #[error("the client closed the connection without `shutdown` and `exit`")]
    Disconnected,
    #[error("the client sent `exit` without `shutdown` first")]
    ExitWithoutShutdown,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Lifecycle {
    Uninitialized,
    Running,
    ShuttingDown,
}

/// Serves one client until `exit`. `Ok` only after `shutdown` then `exit`, as the protocol asks
/// (the process then exits 0).
pub fn serve(
    input: impl BufRead + Send + 'static,
    output: impl Write,
    options: ServerOptions,
) -> Result<(), ServerError> {
    let messages = spawn_reader(input);
    let mut server = Server {
        output,
        service: LanguageService::new(options.model),
        debounce: options.debounce,
        due: HashMap::new(),
        lifecycle: Lifecycle::Uninitialized,
    };
    server.run(&messages)
}

fn spawn_reader(mut input: impl BufRead + Send + 'static) -> Receiver<std::io::Result<Message>> {
    let (sender, receiver) = crossbeam_channel::bounded(64);
    std::thread::spawn(move || {
        loop {
            match Message::read(&mut input) {
                Ok(Some(message)) => {
                    if sender.send(Ok(message)).is_err() {
                        return;
                    }
                }
                // End of input: dropping the sender tells the loop.
                Ok(None) => return,
                Err(error) => {
                    let _ = sender.send(Err(error));
                    return;
                }
            }
        }
    });
    receiver
}

struct Server<W: Write> {
    output: W,
    service: LanguageService,
    debounce: Duration,
    /// Documents whose diagnostics are due, and when.
    due: HashMap<DocumentUri, Instant>,
    lifecycle: Lifecycle,
}

impl<W: Write> Server<W> {
    fn run(&mut self, messages: &Receiver<std::io::Result<Message>>) -> Result<(), ServerError> {
        loop {
            let next_due = self.due.values().min().copied();
            let received = match next_due {
                Some(at) => messages.recv_deadline(at),
                None => messages.recv().map_err(|_| RecvTimeoutError::Disconnected),
            };
            let message = match received {
                Ok(message) => message.map_err(ServerError::Read)?,
                Err(RecvTimeoutError::Timeout) => {
                    self.publish_due()?;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Err(ServerError::Disconnected),
            };
            match message {
                Message::Request(request) => self.request(request)?,
                Message::Notification(notification) => {
                    if notification.method == Exit::METHOD {
                        return match self.lifecycle {
                            Lifecycle::ShuttingDown => Ok(()),
                            _ => Err(ServerError::ExitWithoutShutdown),
                        };
                    }
                    self.notification(notification);
                }
                // The server sends no requests, so no response is awaited.
                Message::Response(_) => {}
            }
        }
    }

    fn send(&mut self, message: Message) -> Result<(), ServerError> {
        message.write(&mut self.output).map_err(ServerError::Write)
    }

    fn respond<R: serde::Serialize>(
        &mut self,
        id: RequestId,
        result: R,
    ) -> Result<(), ServerError> {
        self.send(Message::Response(Response::new_ok(id, result)))
    }

    fn fail(&mut self, id: RequestId, code: ErrorCode, message: String) -> Result<(), ServerError> {
        self.send(Message::Response(Response::new_err(
            id,
            code as i32,
            message,
        )))
    }

    fn request(&mut self, request: Request) -> Result<(), ServerError> {
        let Request { id, method, params } = request;
        match (self.lifecycle, method.as_str()) {
            (Lifecycle::Uninitialized, Initialize::METHOD) => {
                self.lifecycle = Lifecycle::Running;
                return self.respond(id, initialize_result());
            }
            (Lifecycle::Uninitialized, _) => {
                return self.fail(
                    id,
                    ErrorCode::ServerNotInitialized,
                    "the server is not initialized".into(),
                );
            }
            (_, Initialize::METHOD) => {
                return self.fail(id, ErrorCode::InvalidRequest, "already initialized".into());
            }
            (_, Shutdown::METHOD) => {
                self.lifecycle = Lifecycle::ShuttingDown;
                return self.respond(id, ());
            }
            (Lifecycle::ShuttingDown, _) => {
                return self.fail(
                    id,
                    ErrorCode::InvalidRequest,
                    "the server is shutting down".into(),
                );
            }
            (Lifecycle::Running, _) => {}
        }
        let service = &self.service;
        let result = match method.as_str() {
            HoverRequest::METHOD => parse::<lsp_types::HoverParams>(params).map(|p| {
                let (uri, position) =
                    from_proto::document_position(p.text_document_position_params);
                json(service.hover(&uri, position).map(to_proto::hover))
            }),
            GotoDefinition::METHOD => parse::<lsp_types::GotoDefinitionParams>(params).map(|p| {
                let (uri, position) =
                    from_proto::document_position(p.text_document_position_params);
                json(
                    service
                        .definition(&uri, position)
                        .and_then(to_proto::location),
                )
            }),
            References::METHOD => parse::<lsp_types::ReferenceParams>(params).map(|p| {
                let (uri, position) = from_proto::document_position(p.text_document_position);
                let include_declaration = p.context.include_declaration;
                json(to_proto::locations(service.references(
                    &uri,
                    position,
                    include_declaration,
                )))
            }),
            Completion::METHOD => parse::<lsp_types::CompletionParams>(params).map(|p| {
                let (uri, position) = from_proto::document_position(p.text_document_position);
                json(map(
                    service.completion(&uri, position),
                    to_proto::completion_item,
                ))
            }),
            DocumentSymbolRequest::METHOD => {
                parse::<lsp_types::DocumentSymbolParams>(params).map(|p| {
                    let symbols = service.document_symbols(&from_proto::uri(&p.text_document.uri));
                    json(map(symbols, to_proto::document_symbol))
                })
            }
            FoldingRangeRequest::METHOD => {
                parse::<lsp_types::FoldingRangeParams>(params).map(|p| {
                    let folds = service.folding_ranges(&from_proto::uri(&p.text_document.uri));
                    json(map(folds, to_proto::folding_range))
                })
            }
            _ => {
                return self.fail(
                    id,
                    ErrorCode::MethodNotFound,
                    format!("`{method}` is not supported"),
                );
            }
        };
        match result {
            Ok(value) => self.respond(id, value),
            Err(error) => self.fail(id, ErrorCode::InvalidParams, error.to_string()),
        }
    }

    fn notification(&mut self, notification: Notification) {
        let Notification { method, params } = notification;
        match method.as_str() {
            DidOpenTextDocument::METHOD => {
                if let Ok(p) = parse::<lsp_types::DidOpenTextDocumentParams>(params) {
                    let document = p.text_document;
                    self.service.open(
                        from_proto::uri(&document.uri),
                        document.text,
                        document.version,
                    );
                    self.schedule_all();
                }
            }
            DidChangeTextDocument::METHOD => {
                if let Ok(p) = parse::<lsp_types::DidChangeTextDocumentParams>(params) {
                    let document = p.text_document;
                    let changes = map(p.content_changes, from_proto::change);
                    if self.service.change(
                        &from_proto::uri(&document.uri),
                        document.version,
                        changes,
                    ) {
                        self.schedule_all();
                    }
                }
            }
            DidCloseTextDocument::METHOD => {
                if let Ok(p) = parse::<lsp_types::DidCloseTextDocumentParams>(params) {
                    let uri = p.text_document.uri;
                    let document = from_proto::uri(&uri);
                    self.service.close(&document);
                    self.due.remove(&document);
                    // Clear what the editor shows for a file no longer open.
                    self.publish(uri, Vec::new(), None).ok();
                    self.schedule_all();
                }
            }
            DidSaveTextDocument::METHOD => {
                self.service.saved();
                self.schedule_all();
            }
            // `initialized`, `$/cancelRequest` (every request is answered at once), settings...
            _ => {}
        }
    }

    /// Every open document's diagnostics are due one debounce from now.
    fn schedule_all(&mut self) {
        let at = Instant::now() + self.debounce;
        for uri in self.service.open_uris() {
            self.due.insert(uri, at);
        }
    }

    fn publish_due(&mut self) -> Result<(), ServerError> {
        let now = Instant::now();
        let mut ready: Vec<DocumentUri> = self
            .due
            .iter()
            .filter(|(_, at)| **at <= now)
            .map(|(uri, _)| uri.clone())
            .collect();
        ready.sort();
        for document in ready {
            self.due.remove(&document);
            // Every URI the service holds came from the client, so it converts back.
            let (Some((diagnostics, version)), Some(uri)) = (
                self.service.diagnostics(&document),
                to_proto::uri(&document),
            ) else {
                continue;
            };
            self.publish(uri, map(diagnostics, to_proto::diagnostic), Some(version))?;
        }
        Ok(())
    }

    fn publish(
        &mut self,
        uri: lsp_types::Uri,
        diagnostics: Vec<lsp_types::Diagnostic>,
        version: Option<i32>,
    ) -> Result<(), ServerError> {
        let params = PublishDiagnosticsParams::new(uri, diagnostics, version);
        self.send(Message::Notification(Notification::new(
            PublishDiagnostics::METHOD.to_string(),
            params,
        )))
    }
}

fn parse<P: DeserializeOwned>(params: serde_json::Value) -> Result<P, serde_json::Error> {
    serde_json::from_value(params)
}

fn map<T, U>(values: Vec<T>, convert: impl FnMut(T) -> U) -> Vec<U> {
    values.into_iter().map(convert).collect()
}

fn json(value: impl serde::Serialize) -> serde_json::Value {
    // LSP types always serialise; `null` is the protocol's "nothing here" anyway.
    serde_json::to_value(value).unwrap_or(serde_json::Value::Null)
}

fn initialize_result() -> InitializeResult {
    InitializeResult {
        capabilities: ServerCapabilities {
            position_encoding: Some(PositionEncodingKind::UTF16),
            text_document_sync: Some(TextDocumentSyncCapability::Options(
                TextDocumentSyncOptions {
                    open_close: Some(true),
                    change: Some(TextDocumentSyncKind::INCREMENTAL),
                    save: Some(TextDocumentSyncSaveOptions::SaveOptions(SaveOptions {
                        include_text: Some(false),
                    })),
                    ..TextDocumentSyncOptions::default()
                },
            )),
            hover_provider: Some(HoverProviderCapability::Simple(true)),
            definition_provider: Some(OneOf::Left(true)),
            references_provider: Some(OneOf::Left(true)),
            completion_provider: Some(CompletionOptions {
                trigger_characters: Some(vec!["<".to_string(), " ".to_string()]),
                ..CompletionOptions::default()
            }),
            document_symbol_provider: Some(OneOf::Left(true)),
            folding_range_provider: Some(FoldingRangeProviderCapability::Simple(true)),
            ..ServerCapabilities::default()
        },
        server_info: Some(ServerInfo {
            name: "pml-lsp".to_string(),
            version: Some(env!("CARGO_PKG_VERSION").to_string()),
        }),
    }
}
