//! `pml generate "text"`: plain generation with a full prefill of the prompt and no module cache,
//! the baseline every cached mode is compared with. Loads (fetching if needed) the model, wraps
//! the text in the model's chat template with `--chat`, streams the answer to stdout and prints a
//! one-line summary to stderr. A text its model's context cannot hold is refused with exit 2
//! before anything is computed: by its bytes before it is tokenized (PML306), by its tokens and
//! `--max-tokens` after (PML305).

use std::cell::RefCell;

use anyhow::Context;
use clap::Args;
use pml_commands::failure::Failure;
use pml_commands::model_fetch::{model_file, resolve_model};
use pml_commands::pipeline::{BackendArgs, WeightsArg, context_failure};
use pml_compiler::chat_template::ChatTemplate;
use pml_engine::Tokenizer;
use pml_engine::device::{Backend, BackendChoice, select_backend};
use pml_engine::generation::speculative::draft_model::check_vocabularies;
use pml_engine::generation::{Generator, PromptInput};
use pml_engine::gguf::GgufFile;
use pml_engine::model::{Model, WeightFormat};
use pml_engine::tokenizer::GgufTokenizer;
use pml_runtime::chat::model_chat_template;
use pml_runtime::inference::context_limit::check_positions;
use pml_runtime::inference::{ContextError, PromptByteLimit, load_model_and_tokenizer};
use pml_runtime::kv_budget::{HeavyHitters, KvBudget};
use pml_syntax::ast::Role;

use super::answer_stream::AnswerStream;
use pml_commands::sampling_args::SamplingArgs;

#[derive(Args)]
pub struct GenerateArgs {
    /// The prompt text.
    text: String,
    /// Model: an id or alias (see `pml models list`) or a path to a GGUF file; the default
    /// model when absent.
    #[arg(long, short = 'm', value_name = "MODEL")]
    model: Option<String>,
    /// Wrap the text in the model's chat template as a user turn and start the assistant's turn.
    #[arg(long)]
    chat: bool,
    /// System message for `--chat` (else the template's default, if it has one).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    backend: BackendArgs,
    /// How weight matrices are held and multiplied.
    #[arg(long, value_enum, default_value_t = WeightsArg::default())]
    weights: WeightsArg,
    /// Print the answer once finished instead of as it is generated.
    #[arg(long)]
    no_stream: bool,
    /// Hold at most N KV slots (H2O): the first few (attention sinks), the newest
    /// (`--kv-recent`) and those that received the most attention; the others are evicted, and
    /// a prompt longer than the budget is computed in chunks.
    #[arg(long, value_name = "N")]
    kv_budget: Option<usize>,
    /// With `--kv-budget`: the newest slots always kept (default: half the budget, H2O's split).
    #[arg(long, value_name = "N", requires = "kv_budget")]
    kv_recent: Option<usize>,
}

pub fn run(args: GenerateArgs) -> Result<(), Failure> {
    generate(args).map_err(|error| match error.downcast::<ContextError>() {
        Ok(error) => context_failure(error, None),
        Err(error) => Failure::Failed(error),
    })
}

fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    // Checked before the model loads.
    args.sampling
        .speculation
        .check()
        .map_err(anyhow::Error::msg)?;
    let budget = args
        .kv_budget
        .map(|slots| KvBudget::h2o(slots, args.kv_recent))
        .transpose()?;
    let choice = resolve_model(args.model.as_deref())?;
    let path = model_file(&choice)?;
    let id = choice.id();
    let choice = BackendChoice::resolve(args.backend.device, args.backend.kernels)?
        .with_kv_dtype(args.backend.cache_type.dtype());
    let format = args.weights.format_for(&choice);
    let backend = select_backend(choice)?;
    let gguf = GgufFile::open(&path)?;
    let (model, tokenizer) = load_model_and_tokenizer(&gguf, format, &backend)
        .with_context(|| format!("loading {id} from {}", path.display()))?;
    let draft_model = match &args.sampling.speculation.draft.draft_model {
        Some(draft) => Some(load_draft_model(draft, format, &backend, &tokenizer)?),
        None => None,
    };
    let context = u32::try_from(gguf.context_length()?).unwrap_or(u32::MAX);
    PromptByteLimit {
        context,
        longest_token_bytes: tokenizer.longest_token_bytes(),
    }
    .check(args.text.len() as u64)?;

    let prompt_tokens = if args.chat {
        let template = model_chat_template(&gguf, &tokenizer)?;
        chat_prompt_tokens(&template, &tokenizer, args.system.as_deref(), &args.text)?
    } else {
        let mut tokens: Vec<u32> = tokenizer.bos_token().into_iter().collect();
        tokens.extend(tokenizer.encode(&args.text, false)?);
        tokens
    };
    let n_prompt_tokens = prompt_tokens.len();
    let params = args.sampling.params();
    check_positions(n_prompt_tokens, params.max_tokens, context)?;

    let mut answer = AnswerStream::new(!args.no_stream);
    let generator = Generator::new(&model, &tokenizer);
    let mut on_text = |piece: &str| answer.write(piece);
    let (generation, evicted) = match budget {
        None => {
            let mut kv = model.new_kv_cache()?;
            let prompt = PromptInput::uncached(prompt_tokens);
            let generation = match &draft_model {
                Some(draft) => generator.generate_with_draft_model(
                    &mut kv,
                    &prompt,
                    &params,
                    &mut on_text,
                    draft,
                )?,
                None => generator.generate(&mut kv, &prompt, &params, &mut on_text)?,
            };
            (generation, None)
        }
        Some(budget) => {
            let hitters = HeavyHitters::new(budget);
            let mut kv = hitters.new_cache(&model)?;
            let hitters = RefCell::new(hitters);
            let positions: Vec<u32> = (0..prompt_tokens.len() as u32).collect();
            let generation = generator.generate_stepped(
                &mut kv,
                &prompt_tokens,
                &params,
                &mut on_text,
                |kv| {
                    Ok(hitters
                        .borrow_mut()
                        .forward(&model, &prompt_tokens, &positions, kv)?)
                },
                |kv, token, _position| Ok(hitters.borrow_mut().step(&model, token, kv)?),
            )?;
            (generation, Some((budget, hitters.borrow().evicted())))
        }
    };
    answer
        .finish(&generation.text)
        .context("writing the answer to stdout")?;

    let timings = &generation.timings;
    let decode = match (
        timings.decode_ms_per_token(),
        timings.decode_tokens_per_second(),
    ) {
        (Some(ms), Some(tokens_per_second)) => {
            format!("{ms:.1} ms/token ({tokens_per_second:.1} tok/s)")
        }
        _ => "-".to_owned(),
    };
    let budget = match evicted {
        Some((budget, evicted)) => format!(
            " | KV budget {} slots ({} recent, {} sinks): {evicted} evicted",
            budget.slots, budget.recent, budget.sinks
        ),
        None => String::new(),
    };
    let speculation = &generation.speculation;
    let drafted = match speculation.drafted {
        0 => String::new(),
        _ => format!(" | {speculation}"),
    };
    eprintln!(
        "model {} | prompt {} tokens | generated {} tokens | TTFT {:.0} ms (prefill {:.0} ms) | \
         decode {decode}{drafted} | finish {}{budget}",
        id,
        n_prompt_tokens,
        generation.token_ids.len(),
        timings.time_to_first_token.as_secs_f64() * 1e3,
        timings.prefill.as_secs_f64() * 1e3,
        generation.finish_reason,
    );
    Ok(())
}

/// The model `--draft-model` names, loaded as the model is; refused when its vocabulary is not
/// `tokenizer`'s.
fn load_draft_model(
    name: &str,
    format: WeightFormat,
    backend: &Backend,
    tokenizer: &dyn Tokenizer,
) -> anyhow::Result<Model> {
    let choice = resolve_model(Some(name))?;
    let path = model_file(&choice)?;
    let gguf = GgufFile::open(&path)?;
    let (model, draft_tokenizer) =
        load_model_and_tokenizer(&gguf, format, backend).with_context(|| {
            format!(
                "loading the draft model {} from {}",
                choice.id(),
                path.display()
            )
        })?;
    check_vocabularies(tokenizer, &draft_tokenizer).map_err(|error| {
        anyhow::anyhow!(
            "--draft-model {}: the draft model cannot draft for this model: {error}",
            choice.id()
        )
    })?;
    Ok(model)
}

/// BOS, the system turn (or the template's default preamble), the user turn and the generation
/// prompt.
fn chat_prompt_tokens(
    template: &ChatTemplate,
    tokenizer: &GgufTokenizer,
    system: Option<&str>,
    user: &str,
) -> anyhow::Result<Vec<u32>> {
    let mut turns: Vec<(Role, &str)> = system
        .map(|system| (Role::System, system))
        .into_iter()
        .collect();
    turns.push((Role::User, user));
    Ok(pml_runtime::chat::chat_prompt_tokens(
        template, tokenizer, &turns,
    )?)
}
