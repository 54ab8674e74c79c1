//! `pml serve`: load the model once, load the schemas uploaded before (kept under the store's
//! folder, `schemas/`) and optionally every schema of a folder, and answer prompts over HTTP
//! until Ctrl-C / SIGTERM (new requests refused, running ones given a grace period). The server
//! itself lives in the `pml-server` crate; this module only turns flags into its configuration.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use pml_commands::failure::Failure;
use pml_commands::pipeline::{RuntimeArgs, open_draft_model, open_runtime, store_config};
use pml_commands::sampling_args::{SpeculationArgs, SpeculativeArg};
use pml_engine::generation::Speculation;
use pml_engine::generation::speculative::earlier::DEFAULT_ANSWER_TOKENS;
use pml_runtime::kv_budget::KvBudget;
use pml_runtime::store::TierConfig;
use pml_server::{CorsOrigins, ServerConfig, ServerError, ServerHandle};

#[derive(Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback by default: put a proxy in front to expose it).
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    #[arg(long, default_value_t = 8080)]
    port: u16,
    #[command(flatten)]
    runtime: RuntimeArgs,
    /// Load (and compile in the background) every `*.pml` schema in this folder and its
    /// subfolders at start; each one's `src=` includes are read relative to its own folder.
    /// Uploaded schemas may not use `src=`.
    #[arg(long, value_name = "DIR")]
    schemas: Option<PathBuf>,
    /// Browser origins whose pages may call the inference routes (CORS): `*` (the default, as
    /// llama.cpp's server and vLLM allow), `none`, or origins separated by commas
    /// (`http://localhost:3000`). Schema upload and deletion answer no other origin.
    #[arg(long, value_name = "ORIGINS", default_value = "*")]
    cors_origins: String,
    /// Connections open at once; a further one is answered 503 and closed.
    #[arg(long, value_name = "N", default_value_t = 512)]
    max_connections: usize,
    /// Bearer token required to upload or delete schemas (also read from `PML_ADMIN_TOKEN`).
    #[arg(long, env = "PML_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: Option<String>,
    /// Most sequences decoded together in one batched step.
    #[arg(long, default_value_t = 16)]
    max_batch: usize,
    /// Completions that may wait for the engine; beyond it requests get 503.
    #[arg(long, default_value_t = 64)]
    queue: usize,
    /// Largest `max_tokens` a request may ask for.
    #[arg(long, default_value_t = 4096)]
    max_tokens_limit: usize,
    /// Most units (the root and each module) a schema may lay out; a larger upload is refused.
    #[arg(long, default_value_t = 4096)]
    max_schema_units: usize,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_body_bytes: usize,
    /// Seconds after which a request is ended.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// RAM (MiB) for the KV of plain prompts' blocks, reused by later prompts that start the
    /// same way (automatic prefix caching); 0 turns it off.
    #[arg(long, value_name = "MIB", default_value_t = 1024)]
    prefix_cache_mib: u64,
    /// Memory (MiB) the KV caches of the running completions may take together: each reserves
    /// its prompt and `max_tokens` when admitted, and waits until that fits; one that never can
    /// is refused (400). Unbounded when absent (`--max-batch` still bounds the batch).
    #[arg(long, value_name = "MIB")]
    kv_cache_mib: Option<usize>,
    /// Hold at most N KV slots per sequence of a plain prompt or chat (H2O): the first few
    /// (attention sinks), the newest (`--kv-recent`) and those that received the most
    /// attention; a sequence whose prompt and answer would hold more evicts the others, and
    /// reserves only N slots of `--kv-cache-mib`. A request's `kv_budget` overrides it. Such
    /// sequences decode in passes of their own and skip the prefix cache.
    #[arg(long, value_name = "N")]
    kv_budget: Option<usize>,
    /// With `--kv-budget`: the newest slots always kept (default: half the budget, H2O's split).
    #[arg(long, value_name = "N", requires = "kv_budget")]
    kv_recent: Option<usize>,
    /// The pool's pressure valve: with `--kv-cache-mib`, a plain prompt or chat whose
    /// reservation does not fit now (or ever) is admitted at once within N KV slots (H2O, half
    /// of them the newest) when they fit, instead of waiting (or being refused); counted in
    /// `pml_kv_pressure_admissions_total`.
    #[arg(long, value_name = "N", requires = "kv_cache_mib")]
    kv_pressure_budget: Option<usize>,
    /// Reuse a plain prompt's cached KV only up to its first change. By default a prompt that
    /// differs by a few edits from one the prefix cache kept (a document or file sent again)
    /// reuses the KV of every unchanged token, mode `blend` recomputing what read the edits.
    #[arg(long)]
    no_edit_reuse: bool,
    /// Serve no playground page at `/` (the API alone).
    #[arg(long)]
    no_ui: bool,
    #[command(flatten)]
    speculation: SpeculationArgs,
    /// With n-gram drafts: tokens of earlier answers held, in which an answer's last tokens are
    /// looked up too (REST's datastore, llama.cpp's dynamic lookup cache), so an answer that
    /// repeats an earlier one is drafted from it; 0 holds none (a server whose speed should not
    /// depend on what it answered others).
    #[arg(long, value_name = "TOKENS", default_value_t = DEFAULT_ANSWER_TOKENS)]
    draft_answers: usize,
}

pub fn run(args: ServeArgs) -> Result<(), Failure> {
    // Checked before the model loads.
    let kv_budget = args
        .kv_budget
        .map(|slots| KvBudget::h2o(slots, args.kv_recent))
        .transpose()
        .map_err(|error| Failure::usage(error.to_string()))?;
    let kv_pressure_budget = args
        .kv_pressure_budget
        .map(|slots| KvBudget::h2o(slots, None))
        .transpose()
        .map_err(|error| {
            Failure::usage(
                error
                    .to_string()
                    .replace("--kv-budget", "--kv-pressure-budget"),
            )
        })?;
    let cors_origins = CorsOrigins::parse(&args.cors_origins)
        .map_err(|error| Failure::usage(format!("--cors-origins: {error}")))?;
    if args.max_connections == 0 {
        return Err(Failure::usage("--max-connections must be at least 1"));
    }
    args.speculation.check().map_err(Failure::usage)?;
    let mut opened = open_runtime(&args.runtime)?;
    if let Some(draft) = &args.speculation.draft.draft_model {
        open_draft_model(&args.runtime, draft, &mut opened)?;
    }
    let store = store_config(args.runtime.store.as_deref())?;
    let saved_schemas = store.root.join("schemas");
    // Plain prompts' blocks are shared through the store's Redis, when it has one.
    let prefix_cache_redis = store.tiers.iter().find_map(|tier| match tier {
        TierConfig::Redis(redis) => Some(redis.clone()),
        _ => None,
    });
    let open_admin = args.admin_token.is_none() && args.host.is_loopback();
    let config = ServerConfig {
        model_name: opened.id.clone(),
        // The name it was asked for by, when the registry knows the model by another.
        model_aliases: args
            .runtime
            .model
            .iter()
            .filter(|given| {
                **given != opened.id && !given.contains('/') && !given.ends_with(".gguf")
            })
            .cloned()
            .collect(),
        max_body_bytes: args.max_body_bytes,
        max_tokens_limit: args.max_tokens_limit,
        queue_capacity: args.queue,
        max_schema_units: args.max_schema_units,
        max_batch: args.max_batch,
        request_timeout: Duration::from_secs(args.timeout),
        kv_cache_bytes: args.kv_cache_mib.map(|mib| mib << 20),
        kv_budget,
        kv_pressure_budget,
        edit_reuse: !args.no_edit_reuse,
        speculation: args.speculation.speculation(SpeculativeArg::Off),
        draft_speculation: (args.speculation.draft.draft_model.as_ref()).map(|_| {
            Speculation::Draft {
                max_draft: args.speculation.draft_max,
                p_min: args.speculation.draft_p_min,
            }
        }),
        answer_draft_tokens: args.draft_answers,
        ui: !args.no_ui,
        prefix_cache_bytes: args.prefix_cache_mib << 20,
        prefix_cache_redis,
        open_admin,
        saved_schemas: Some(saved_schemas.clone()),
        admin_token: args.admin_token.clone(),
        handle_signals: true,
        cors_origins,
        max_connections: args.max_connections,
        ..ServerConfig::default()
    };
    let grace = config.shutdown_grace;
    let addr = SocketAddr::new(args.host, args.port);
    let server = pml_server::start(opened.runtime, config, addr).map_err(|error| {
        let in_use = matches!(&error, ServerError::Bind { source, .. }
            if source.kind() == std::io::ErrorKind::AddrInUse);
        let error = anyhow::Error::from(error);
        if in_use {
            Failure::Failed(anyhow::anyhow!(
                "{error:#}; another process has that port: stop it, or pick another with --port"
            ))
        } else {
            Failure::Failed(error)
        }
    })?;
    for (path, restored) in server.restored_schemas() {
        match restored {
            Ok(info) => eprintln!(
                "schema {} (uploaded before, {}): {} units, compiling",
                info.name,
                path.display(),
                info.units_total
            ),
            Err(error) => eprintln!(
                "warning: saved schema {} not loaded: {error}",
                path.display()
            ),
        }
    }
    if let Some(folder) = &args.schemas {
        load_schemas(&server, folder)?;
    }
    if open_admin {
        eprintln!(
            "warning: no --admin-token: anyone on this machine can upload and delete schemas \
             (uploads are saved in {})",
            saved_schemas.display()
        );
    } else if args.admin_token.is_none() {
        eprintln!(
            "schema upload and deletion are off: {} is not a loopback address and no \
             --admin-token was given",
            args.host
        );
    }
    eprintln!(
        "serving {} on http://{} (Ctrl-C or SIGTERM: new requests refused, running ones cut \
         off after {} s)",
        opened.id,
        server.addr(),
        grace.as_secs_f64()
    );
    if !args.no_ui {
        eprintln!(
            "playground: http://{}/ (--no-ui serves the API alone)",
            server.addr()
        );
    }
    server.join().context("serving")?;
    Ok(())
}

/// Folders below `--schemas` looked into (a schema's `src=` files sit a level or two below it).
const MAX_SCHEMA_DEPTH: usize = 4;

/// The `*.pml` files of `folder` and of its subfolders down to [`MAX_SCHEMA_DEPTH`], sorted;
/// hidden folders and those the walk cannot read are passed over.
fn schema_files(folder: &Path) -> Result<Vec<PathBuf>, Failure> {
    let mut found = Vec::new();
    let mut folders = vec![(folder.to_path_buf(), 0)];
    while let Some((dir, depth)) = folders.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if depth == 0 => {
                return Err(Failure::Usage(
                    anyhow::Error::from(error).context(format!("reading {}", dir.display())),
                ));
            }
            Err(error) => {
                eprintln!("warning: --schemas: {} not read: {error}", dir.display());
                continue;
            }
        };
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            match entry.file_type() {
                Ok(kind) if kind.is_dir() && !hidden && depth < MAX_SCHEMA_DEPTH => {
                    folders.push((path, depth + 1));
                }
                Ok(kind) if kind.is_file() && path.extension().is_some_and(|ext| ext == "pml") => {
                    found.push(path);
                }
                _ => {}
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Loads every schema file under `folder` ([`schema_files`]); prompt files are skipped. Saying
/// none was found when there was none to load, so an empty server is never a surprise.
fn load_schemas(server: &ServerHandle, folder: &Path) -> Result<(), Failure> {
    let paths = schema_files(folder)?;
    let mut loaded = 0;
    for path in paths {
        let source = pml_commands::source_file::read_source(&path)
            .with_context(|| format!("reading {}", path.display()))
            .map_err(Failure::Usage)?;
        if !pml_syntax::root_tag::is_schema(&source) {
            continue;
        }
        let sources_root = path.parent().unwrap_or(folder).to_path_buf();
        match server.load_schema(source, sources_root) {
            Ok(info) => {
                loaded += 1;
                eprintln!(
                    "schema {} from {}: {} units, compiling",
                    info.name,
                    path.display(),
                    info.units_total
                );
            }
            Err(error) => {
                return Err(Failure::Failed(anyhow::anyhow!(
                    "{}: {error} (run `pmlc check {}` for details)",
                    path.display(),
                    path.display()
                )));
            }
        }
    }
    if loaded == 0 {
        eprintln!(
            "warning: --schemas {}: no schema found in it or its subfolders (files `*.pml` whose \
             root is <schema>)",
            folder.display()
        );
    }
    Ok(())
}
