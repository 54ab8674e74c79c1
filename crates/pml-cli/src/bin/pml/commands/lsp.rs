//! `pml lsp`: the language server on stdin/stdout (see `docs/editors.md`). Hovers show token
//! counts and positions laid out for the default model (or `--model`) when it is already fetched,
//! and the stored KV of compiled schemas (`lsp_store`); the server never downloads a model, and
//! says in hovers why the figures are missing.

use std::io::BufReader;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use pml_engine::gguf::GgufFile;
use pml_engine::kv_cache::KvLayout;
use pml_engine::model::{KV_CACHE_DTYPE, ModelConfig};
use pml_engine::tokenizer::GgufTokenizer;
use pml_lsp::{DEFAULT_DEBOUNCE, LayoutModel, ModelAvailability, ServerOptions, serve};
use pml_models::{Fetcher, ModelState, PmlHome};
use pml_runtime::chat::model_chat_template;
use pml_runtime::store::{StateSpec, StoreConfig};
use pml_runtime::tokenizer::PmlTokenizer;

use super::lsp_store::StoreManifests;
use pml_commands::failure::Failure;
use pml_commands::model_fetch::{ModelChoice, resolve_model};

#[derive(Args, Debug)]
pub struct LspArgs {
    /// Model whose tokenizer lays schemas out for hovers (default: the default model).
    #[arg(long, short = 'm', value_name = "MODEL")]
    model: Option<String>,
    /// Do not load a model: hovers show no token counts or positions.
    #[arg(long, conflicts_with = "model")]
    no_model: bool,
    /// Milliseconds after the last edit before diagnostics are computed.
    #[arg(long, value_name = "MS", default_value_t = DEFAULT_DEBOUNCE.as_millis() as u64)]
    debounce_ms: u64,
    /// Accepted for clients that pass it (VS Code's generic clients do); stdio is the only
    /// transport.
    #[arg(long, hide = true)]
    stdio: bool,
}

pub fn run(args: LspArgs) -> Result<(), Failure> {
    let model = if args.no_model {
        ModelAvailability::Unavailable {
            reason: "the server was started with `--no-model`".to_string(),
        }
    } else {
        load_model(args.model.as_deref())
    };
    let options = ServerOptions {
        model,
        debounce: Duration::from_millis(args.debounce_ms),
    };
    serve(BufReader::new(std::io::stdin()), std::io::stdout(), options)
        .context("language server")?;
    Ok(())
}

/// The model's tokenizer and chat template, if the model is fetched; never downloads.
fn load_model(name: Option<&str>) -> ModelAvailability {
    let unavailable = |reason: String| ModelAvailability::Unavailable { reason };
    let choice = match resolve_model(name) {
        Ok(choice) => choice,
        Err(error) => return unavailable(format!("{error:#}")),
    };
    let id = choice.id();
    let path = match &choice {
        ModelChoice::File(path) => path.clone(),
        ModelChoice::Registered(spec) => {
            let state = PmlHome::from_env()
                .map(Fetcher::new)
                .and_then(|fetcher| fetcher.check(spec));
            match state {
                Ok(ModelState::Verified(path)) => path,
                Ok(_) => {
                    return unavailable(format!(
                        "model `{id}` is not fetched; run `pml models fetch {id}` and restart \
                         the server"
                    ));
                }
                Err(error) => return unavailable(format!("model `{id}`: {error}")),
            }
        }
    };
    match layout_model(&id, &path) {
        Ok(model) => ModelAvailability::Loaded(Box::new(model)),
        Err(error) => unavailable(format!("model `{id}` cannot be loaded: {error:#}")),
    }
}

fn layout_model(id: &str, path: &std::path::Path) -> anyhow::Result<LayoutModel> {
    let gguf = GgufFile::open(path)?;
    let tokenizer = GgufTokenizer::from_gguf(&gguf)?;
    let template = model_chat_template(&gguf, &tokenizer)?;
    let max_positions = u32::try_from(gguf.context_length()?).unwrap_or(u32::MAX);
    // The store's key of a module depends on the model's fingerprint and KV shape, both in the
    // GGUF's metadata: no weights are read.
    let config = ModelConfig::from_gguf(&gguf)?;
    let layout = KvLayout {
        n_layers: config.n_layers,
        n_kv_heads: config.n_kv_heads,
        head_dim: config.head_dim,
        dtype: KV_CACHE_DTYPE,
    };
    let compiled = StoreConfig::from_env().ok().map(|store| {
        let spec = StateSpec::new(gguf.fingerprint(), layout).with_state_dtype(store.state_dtype);
        Box::new(StoreManifests::new(store, spec)) as Box<dyn pml_lsp::CompiledStates>
    });
    Ok(LayoutModel {
        name: id.to_string(),
        tokenizer: std::sync::Arc::new(PmlTokenizer::from(tokenizer)),
        template,
        max_positions,
        compiled,
    })
}
