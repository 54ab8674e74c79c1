//! What a server allows and how it schedules: limits on requests, the queue, the batch.

use std::time::Duration;

/// Limits and scheduling settings of one server.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Name reported as `model` in `/health` and in answers to requests that name none.
    pub model_name: String,
    /// Other names of the same model (the one it was started with, when the registry knows it
    /// by another), listed in `/v1/models` beside `model_name`.
    pub model_aliases: Vec<String>,
    /// Largest request body accepted (larger ones get 413).
    pub max_body_bytes: usize,
    /// Largest `max_tokens` a request may ask for (larger ones get 400).
    pub max_tokens_limit: usize,
    /// `max_tokens` of a request that names none.
    pub default_max_tokens: usize,
    /// Most units (the root and each module) one schema may lay out: each is a pass to encode
    /// and a state to store, so a larger upload is refused at once (400) rather than queued.
    pub max_schema_units: usize,
    /// Completions waiting for admission beyond which new ones get 503.
    pub queue_capacity: usize,
    /// Most sequences decoded together in one batched step.
    pub max_batch: usize,
    /// How long a client may take to send a request's headers before its connection is closed
    /// (one that sends them a byte at a time must not hold a connection open).
    pub header_read_timeout: Duration,
    /// How long a client may take to send a request's body once its headers are in (one that
    /// trickles it must not hold a connection, nor a handler, open): 408 past it.
    pub body_read_timeout: Duration,
    /// Connections open at once beyond which a new one is answered 503 and closed.
    pub max_connections: usize,
    /// A client that closes its side of the connection within this long after sending its
    /// request has half-closed (`nc -N`) and still reads the answer; one that closes later has
    /// gone away, and its request is cancelled.
    pub half_close_window: Duration,
    /// Origins whose pages may call the inference routes from a browser (CORS); the routes
    /// that change the server never answer another origin.
    pub cors_origins: CorsOrigins,
    /// A completion still running this long after it arrived is ended.
    pub request_timeout: Duration,
    /// Most bytes the KV caches of the admitted sequences may take together (`None`: no
    /// bound). Each sequence reserves room for its prompt and `max_tokens` at admission; a
    /// completion waits until its reservation fits, and one that could never fit is refused.
    pub kv_cache_bytes: Option<usize>,
    /// Most KV slots each sequence of a plain prompt keeps (`--kv-budget`, H2O): one whose
    /// prompt and answer would hold more evicts what its attention reads least. A request's
    /// `kv_budget` overrides it; PML prompts are not bounded.
    pub kv_budget: Option<pml_runtime::kv_budget::KvBudget>,
    /// The pool's pressure valve (`--kv-pressure-budget`): with `kv_cache_bytes`, a plain prompt
    /// whose reservation does not fit now (or ever) is admitted at once within this many KV
    /// slots (H2O) when they fit, instead of waiting (or being refused).
    pub kv_pressure_budget: Option<pml_runtime::kv_budget::KvBudget>,
    /// Whether a plain prompt that differs by a few edits from one the prefix cache kept reuses
    /// the KV of its unchanged tokens (mode `blend` repairing what read the edits), not only the
    /// blocks before its first change (`--no-edit-reuse` turns it off).
    pub edit_reuse: bool,
    /// RAM for the KV of plain prompts' blocks (automatic prefix caching); 0 turns it off.
    pub prefix_cache_bytes: u64,
    /// Redis the prefix cache's blocks are shared through (a namespace of their own, in the
    /// engine's KV dtype), so servers pointed at it reuse each other's prompts.
    pub prefix_cache_redis: Option<pml_runtime::store::RedisConfig>,
    /// Bearer token required to upload or delete schemas.
    pub admin_token: Option<String>,
    /// Without an admin token: whether uploads and deletions are open to anyone who reaches the
    /// server (the CLI allows it only on a loopback address) or refused (403).
    pub open_admin: bool,
    /// Folder uploaded schemas are saved in and loaded from at start; `None` keeps them in
    /// memory only.
    pub saved_schemas: Option<std::path::PathBuf>,
    /// After a shutdown begins, how long running completions may go on before they are cut
    /// off (waiting ones are refused at once).
    pub shutdown_grace: Duration,
    /// Shut down on Ctrl-C / SIGTERM (the CLI); tests stop the server through its handle.
    pub handle_signals: bool,
    /// Serve the playground page at `/` (`--no-ui` turns it off).
    pub ui: bool,
    /// How answers draft tokens ahead of the model (`--speculative`, `--draft-max`; off by
    /// default: with many clients the steps are compute-bound); a request's `speculative`
    /// turns it on or off for that request.
    pub speculation: pml_engine::generation::Speculation,
    /// How a request's `"speculative": "draft"` drafts: with the server's draft model
    /// (`--draft-model`, attached to its runtime); `None` without one.
    pub draft_speculation: Option<pml_engine::generation::Speculation>,
    /// Tokens of earlier answers held for drafting (`--draft-answers`): an answer's n-gram
    /// drafts come from its prompt, its answer so far and these; 0 holds none.
    pub answer_draft_tokens: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            model_name: "pml".to_string(),
            model_aliases: Vec::new(),
            max_body_bytes: 1 << 20,
            max_tokens_limit: 4096,
            default_max_tokens: 16,
            max_schema_units: 4096,
            answer_draft_tokens:
                pml_engine::generation::speculative::earlier::DEFAULT_ANSWER_TOKENS,
            queue_capacity: 64,
            max_batch: 16,
            header_read_timeout: Duration::from_secs(30),
            body_read_timeout: Duration::from_secs(30),
            max_connections: 512,
            half_close_window: Duration::from_millis(500),
            cors_origins: CorsOrigins::Any,
            request_timeout: Duration::from_secs(600),
            kv_cache_bytes: None,
            kv_budget: None,
            kv_pressure_budget: None,
            edit_reuse: true,
            prefix_cache_bytes: 1 << 30,
            prefix_cache_redis: None,
            shutdown_grace: Duration::from_secs(3),
            admin_token: None,
            open_admin: true,
            saved_schemas: None,
            handle_signals: false,
            ui: true,
            speculation: pml_engine::generation::Speculation::Off,
            draft_speculation: None,
        }
    }
}

/// Which browser origins may call the inference routes (`--cors-origins`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum CorsOrigins {
    /// Any origin (`*`), as llama.cpp's server and vLLM allow by default: the inference routes
    /// carry no credentials a page could borrow.
    #[default]
    Any,
    /// These origins only (`scheme://host[:port]`, compared without case).
    List(Vec<String>),
    /// No cross-origin calls.
    None,
}

impl CorsOrigins {
    /// `*`, `none`, or a comma-separated list of origins.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let spec = spec.trim();
        if spec == "*" {
            return Ok(Self::Any);
        }
        if spec.is_empty() || spec.eq_ignore_ascii_case("none") {
            return Ok(Self::None);
        }
        let origins = spec
            .split(',')
            .map(|origin| origin.trim().trim_end_matches('/').to_ascii_lowercase())
            .collect::<Vec<_>>();
        match origins
            .iter()
            .find(|origin| !(origin.starts_with("http://") || origin.starts_with("https://")))
        {
            Some(bad) => Err(format!(
                "`{bad}` is not an origin: give `*`, `none` or origins such as \
                 http://localhost:3000, separated by commas"
            )),
            None => Ok(Self::List(origins)),
        }
    }

    /// Whether a page of `origin` may call the inference routes.
    pub fn allows(&self, origin: &str) -> bool {
        match self {
            Self::Any => true,
            Self::List(origins) => origins
                .iter()
                .any(|allowed| allowed.eq_ignore_ascii_case(origin.trim_end_matches('/'))),
            Self::None => false,
        }
    }
}
