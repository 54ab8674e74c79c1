//! Saved conversations (`pml chat`): a conversation is the token sequence of its turns in the
//! model's chat template; after each turn, the turn's rows are saved to the module store per
//! layer in a [`RestorePlan`]'s forms, and a resumed conversation ([`session`]) restores them
//! layer by layer instead of recomputing its history (HCache's multi-round chat).
//!
//! A turn's unit is every token the turn fed through the model: the previous answer's closing
//! marker and anything the previous turn sampled but never fed, the user turn, the generation
//! prompt and the answer's tokens. Its context is every earlier turn, so its keys (and its state)
//! depend on the whole history, as its KV does.
//!
//! Within one process the KV cache stays in memory between turns; the store is read only when a
//! conversation is resumed. Without a KV budget a conversation ends at the model's context (a
//! turn that would not fit is refused, an answer stops there); within one
//! ([`Conversation::with_kv_budget`], H2O) it holds at most the budget's slots and goes on past
//! the context, its kept slots moved back to position 0 when it reaches the end (such a
//! conversation is not saved: its history is no longer held whole). Hidden states of the answer tokens are taken from one extra pass over
//! them after the answer is out (the decoding loop does not keep layer inputs); with the
//! quantized decode kernels they differ from the decoded rows by the kernels' rounding.

mod draft;
pub mod session;

use std::time::{Duration, Instant};

use candle_core::Tensor;
use pml_compiler::chat_template::ChatTemplate;
use pml_compiler::plan::Role;

use crate::kv_budget::HeavyHitters;
use crate::restore::{
    LayerForm, RestoreError, RestorePlan, RestoreReport, SaveReport, SavedUnit, restore_unit,
    save_unit,
};
use crate::store::{ContextHash, ModuleStore};
use pml_engine::generation::{
    FinishReason, GenerateError, Generation, Generator, SamplingParams, Speculation,
};
use pml_engine::kv_cache::KvCache;
use pml_engine::model::{EngineError, ForwardContext, ForwardOptions, LogitRows, Model};

pub use session::{Session, SessionEntry, SessionError, SessionStore};

/// Why a turn failed.
#[derive(Debug, thiserror::Error)]
pub enum ConversationError {
    #[error(transparent)]
    Engine(Box<EngineError>),
    #[error(transparent)]
    Generate(Box<GenerateError>),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error("cannot tokenize the turn: {0}")]
    Tokenize(String),
    #[error(
        "the conversation is full: this turn would end at position {end}, past the model's \
         context of {limit} positions; start it with a KV budget (`--kv-budget N`) to go on past \
         the context, or start a new conversation"
    )]
    ContextFull { end: usize, limit: u32 },
    #[error(
        "a conversation within a KV budget cannot be saved: its history is no longer held whole \
         (drop `--kv-budget` or `--session`)"
    )]
    BudgetNotSaved,
}

impl From<EngineError> for ConversationError {
    fn from(error: EngineError) -> Self {
        ConversationError::Engine(Box::new(error))
    }
}

impl From<candle_core::Error> for ConversationError {
    fn from(error: candle_core::Error) -> Self {
        ConversationError::Engine(Box::new(EngineError::Tensor(error)))
    }
}

impl From<pml_engine::kv_cache::KvCacheError> for ConversationError {
    fn from(error: pml_engine::kv_cache::KvCacheError) -> Self {
        ConversationError::Engine(Box::new(EngineError::KvCache(error)))
    }
}

/// What the model, its tokenizer and template, and the store a conversation runs with.
pub struct ChatParts<'a> {
    pub model: &'a Model,
    pub tokenizer: &'a dyn pml_engine::Tokenizer,
    pub template: &'a ChatTemplate,
    pub store: &'a ModuleStore,
    /// Positions the model may use (its context, or less): past it a conversation needs a KV
    /// budget.
    pub max_positions: u32,
    /// A smaller model of the same vocabulary that drafts for it where the turn's speculation
    /// asks for one (not within a KV budget, whose steps draft nothing).
    pub draft: Option<&'a Model>,
}

/// One turn's account.
#[derive(Clone, Debug)]
pub struct TurnReport {
    pub generation: Generation,
    /// The restore of the history, when this turn had to read it from the store.
    pub restored: Vec<RestoreReport>,
    /// Tokens computed in this turn's prefill.
    pub prefill_tokens: usize,
    /// Tokens of history before this turn (within a KV budget, more than the cache holds).
    pub history_tokens: usize,
    /// KV slots held after the turn.
    pub kv_slots: usize,
    /// Within a KV budget: slots evicted and moves to position 0 so far in the conversation.
    pub evicted: usize,
    pub position_moves: usize,
    /// From the start of the turn (restore included) to the first answer token.
    pub time_to_first_token: Duration,
    /// What saving the turn stored (`None` when not saving).
    pub saved: Option<SaveReport>,
}

/// What a turn feeds: the history before it, the turn's prompt and where it goes, and whether
/// its layer inputs are kept (to save hidden states).
struct TurnInput<'t> {
    /// The prompt's first position, right after the history's last.
    first_position: u32,
    history_tokens: &'t [u32],
    history_positions: &'t [u32],
    prompt: &'t [u32],
    prompt_positions: &'t [u32],
    /// The history and the prompt, in order.
    all_tokens: &'t [u32],
    keep_layer_inputs: bool,
}

/// A turn's answer and what produced it: the cache after it, the history restored first (when
/// it was read from the store), the prompt's layer inputs (when kept), and when the prefill
/// began (after any restore).
struct Answered {
    kv: KvCache,
    generation: Generation,
    restored: Vec<RestoreReport>,
    prompt_inputs: Vec<Tensor>,
    prefill_start: Instant,
}

/// A conversation: its saved turns, and the KV cache once it is in memory.
pub struct Conversation {
    units: Vec<SavedUnit>,
    /// Tokens sampled by the last turn but never fed (a stop string or the length limit ended
    /// it): they open the next turn.
    pending: Vec<u32>,
    system: Option<String>,
    kv: Option<KvCache>,
    /// The draft model's cache of the conversation, a prefix of `kv`'s rows (`None` until it
    /// drafts, and after a failed turn).
    draft_kv: Option<KvCache>,
    /// Within a KV budget: its state for the cache in `kv` (`None` while `kv` is), and a fresh
    /// one to start over with.
    hitters: Option<HeavyHitters>,
    budget: Option<HeavyHitters>,
}

impl Conversation {
    /// A new conversation, with `system` text as its system turn when given.
    pub fn new(system: Option<String>) -> Self {
        Self {
            units: Vec::new(),
            pending: Vec::new(),
            system,
            kv: None,
            draft_kv: None,
            hitters: None,
            budget: None,
        }
    }

    /// The conversation held within `hitters`' budget (its position limit set to the context it
    /// may use).
    pub fn with_kv_budget(mut self, hitters: HeavyHitters) -> Self {
        self.budget = Some(hitters);
        self
    }

    /// A conversation resumed from its saved turns: the first turn restores them.
    pub fn resume(session: &Session) -> Self {
        Self {
            units: session.units.clone(),
            pending: session.pending.clone(),
            system: session.system.clone(),
            kv: None,
            draft_kv: None,
            hitters: None,
            budget: None,
        }
    }

    /// The saved form of the conversation.
    pub fn session(&self, model_fingerprint: &str) -> Session {
        Session::new(
            model_fingerprint,
            self.system.clone(),
            self.units.clone(),
            self.pending.clone(),
        )
    }

    pub fn turns(&self) -> usize {
        self.units.len()
    }

    /// Every token fed so far, in order, and their positions.
    fn history(&self) -> (Vec<u32>, Vec<u32>) {
        let tokens = self
            .units
            .iter()
            .flat_map(|unit| unit.tokens.clone())
            .collect();
        let positions = self
            .units
            .iter()
            .flat_map(|unit| unit.positions.clone())
            .collect();
        (tokens, positions)
    }

    /// Answers `text` as the next user turn, streaming the answer to `on_text`. With
    /// `save = Some(plan)` the turn's rows are saved in `plan`'s forms.
    pub fn turn(
        &mut self,
        parts: &ChatParts<'_>,
        text: &str,
        params: &SamplingParams,
        save: Option<&RestorePlan>,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<TurnReport, ConversationError> {
        if self.budget.is_some() && save.is_some() {
            return Err(ConversationError::BudgetNotSaved);
        }
        let started = Instant::now();
        let (history_tokens, history_positions) = self.history();
        let prompt = self.prompt_tokens(parts, text)?;
        let first_position = history_positions.last().map_or(0, |&last| last + 1);
        let prompt_positions: Vec<u32> = (0..prompt.len() as u32)
            .map(|offset| first_position + offset)
            .collect();
        let mut all_tokens = history_tokens.clone();
        all_tokens.extend(&prompt);
        let turn = TurnInput {
            first_position,
            history_tokens: &history_tokens,
            history_positions: &history_positions,
            prompt: &prompt,
            prompt_positions: &prompt_positions,
            all_tokens: &all_tokens,
            keep_layer_inputs: save.is_some_and(|plan| plan.count(LayerForm::Hidden) > 0),
        };
        let answered = match self.budget.clone() {
            None => self.answer_whole(parts, &turn, params, on_text)?,
            Some(fresh) => self.answer_within_budget(fresh, parts, &turn, params, on_text)?,
        };
        let time_to_first_token = answered.prefill_start.duration_since(started)
            + answered.generation.timings.time_to_first_token;
        self.record(parts, &turn, save, answered, time_to_first_token)
    }

    /// The turn answered over the whole history: the cache kept from the last turn (or the
    /// history restored from the store), the answer cut where the context ends.
    fn answer_whole(
        &mut self,
        parts: &ChatParts<'_>,
        turn: &TurnInput<'_>,
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Answered, ConversationError> {
        let model = parts.model;
        // The answer's tokens are fed at the positions after the prompt: at least one must fit,
        // and the answer stops at the context's end.
        let end = turn.first_position as usize + turn.prompt.len();
        let room = (parts.max_positions as usize).saturating_sub(end);
        if room == 0 {
            return Err(ConversationError::ContextFull {
                end,
                limit: parts.max_positions,
            });
        }
        let params = SamplingParams {
            max_tokens: params.max_tokens.min(room),
            ..params.clone()
        };
        let mut restored = Vec::new();
        let mut kv = match self.kv.take() {
            Some(kv) => kv,
            None => {
                let mut kv = model.new_kv_cache()?;
                for unit in &self.units {
                    restored.push(restore_unit(model, parts.store, unit, &mut kv)?);
                }
                kv
            }
        };
        let prefill_start = Instant::now();
        let mut prompt_inputs = Vec::new();
        let mut draft_kv = self.draft_kv.take();
        let draft = match (parts.draft, params.speculation) {
            (Some(draft), Speculation::Draft { .. }) => {
                Some(draft::turn_draft(draft, turn, &mut draft_kv))
            }
            _ => None,
        };
        let generation = Generator::new(model, parts.tokenizer)
            .generate_after_with_draft(
                &mut kv,
                turn.all_tokens,
                &params,
                on_text,
                |kv| {
                    let context = ForwardContext::appending(turn.prompt_positions.to_vec(), kv);
                    let options = ForwardOptions {
                        logits: LogitRows::Last,
                        keep_layer_inputs: turn.keep_layer_inputs,
                    };
                    let output = model.forward_with(turn.prompt, &context, kv, &options)?;
                    prompt_inputs = output.layer_inputs;
                    let logits = output.logits.ok_or_else(|| {
                        GenerateError::InvalidPrompt("the turn has no tokens".into())
                    })?;
                    Ok(logits.squeeze(0)?)
                },
                draft,
            )
            .map_err(|error| ConversationError::Generate(Box::new(error)))?;
        self.draft_kv = draft_kv;
        Ok(Answered {
            kv,
            generation,
            restored,
            prompt_inputs,
            prefill_start,
        })
    }

    /// The turn answered within the KV budget (`fresh` its empty state): the cache and its
    /// scores kept from the last turn, or both rebuilt from the history after a failed one.
    fn answer_within_budget(
        &mut self,
        fresh: HeavyHitters,
        parts: &ChatParts<'_>,
        turn: &TurnInput<'_>,
        params: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Answered, ConversationError> {
        let model = parts.model;
        let (mut kv, hitters) = match (self.kv.take(), self.hitters.take()) {
            (Some(kv), Some(hitters)) => (kv, hitters),
            _ => {
                let mut hitters = fresh;
                let mut kv = hitters.new_cache(model)?;
                if !turn.history_tokens.is_empty() {
                    hitters.forward(model, turn.history_tokens, turn.history_positions, &mut kv)?;
                }
                (kv, hitters)
            }
        };
        let prefill_start = Instant::now();
        let hitters = std::cell::RefCell::new(hitters);
        let generation = Generator::new(model, parts.tokenizer)
            .generate_stepped(
                &mut kv,
                turn.all_tokens,
                params,
                on_text,
                |kv| {
                    Ok(hitters.borrow_mut().forward(
                        model,
                        turn.prompt,
                        turn.prompt_positions,
                        kv,
                    )?)
                },
                |kv, token, _position| Ok(hitters.borrow_mut().step(model, token, kv)?),
            )
            .map_err(|error| ConversationError::Generate(Box::new(error)))?;
        self.hitters = Some(hitters.into_inner());
        Ok(Answered {
            kv,
            generation,
            restored: Vec::new(),
            prompt_inputs: Vec::new(),
            prefill_start,
        })
    }

    /// Records the answered turn as the conversation's next unit (saved in `save`'s forms when
    /// asked) and keeps its cache for the next turn.
    fn record(
        &mut self,
        parts: &ChatParts<'_>,
        turn: &TurnInput<'_>,
        save: Option<&RestorePlan>,
        answered: Answered,
        time_to_first_token: Duration,
    ) -> Result<TurnReport, ConversationError> {
        let model = parts.model;
        let Answered {
            kv,
            generation,
            restored,
            prompt_inputs,
            ..
        } = answered;
        // The answer tokens the decoding loop fed; the others open the next turn.
        let fed = match generation.finish_reason {
            FinishReason::Eos => generation.token_ids.len(),
            _ => generation.token_ids.len().saturating_sub(1),
        };
        let answer_fed = &generation.token_ids[..fed];
        let mut turn_tokens = turn.prompt.to_vec();
        turn_tokens.extend(answer_fed);
        let turn_positions: Vec<u32> = (0..turn_tokens.len() as u32)
            .map(|offset| turn.first_position + offset)
            .collect();
        let turn_start = turn.history_tokens.len();
        if self.budget.is_none() && kv.len() != turn_start + turn_tokens.len() {
            return Err(ConversationError::Tokenize(format!(
                "the cache holds {} rows after the turn, expected {}",
                kv.len(),
                turn_start + turn_tokens.len()
            )));
        }
        let unit = SavedUnit {
            tokens: turn_tokens,
            positions: turn_positions,
            context: ContextHash::of(turn.history_tokens, turn.history_positions),
            plan: save.cloned().unwrap_or_else(|| {
                RestorePlan::uniform(LayerForm::Recompute, model.config().n_layers)
            }),
        };
        let saved = match save {
            Some(_) => {
                let layer_inputs = if turn.keep_layer_inputs {
                    turn_layer_inputs(
                        model,
                        &kv,
                        turn_start + turn.prompt.len(),
                        answer_fed,
                        &unit,
                        prompt_inputs,
                    )?
                } else {
                    Vec::new()
                };
                let rows = kv.slice(turn_start..kv.len())?;
                Some(save_unit(model, parts.store, &unit, &rows, &layer_inputs)?)
            }
            None => None,
        };
        self.pending = generation.token_ids[fed..].to_vec();
        self.units.push(unit);
        let (evicted, position_moves) = self
            .hitters
            .as_ref()
            .map_or((0, 0), |hitters| (hitters.evicted(), hitters.moves()));
        let kv_slots = kv.len();
        self.kv = Some(kv);
        Ok(TurnReport {
            prefill_tokens: turn.prompt.len(),
            history_tokens: turn_start,
            kv_slots,
            evicted,
            position_moves,
            restored,
            time_to_first_token,
            saved,
            generation,
        })
    }

    /// The tokens that open this turn: the previous answer's unfed tokens and closing marker (or,
    /// first, BOS and the system turn), the user turn and the generation prompt.
    fn prompt_tokens(
        &self,
        parts: &ChatParts<'_>,
        text: &str,
    ) -> Result<Vec<u32>, ConversationError> {
        let template = parts.template;
        let mut pieces: Vec<(&str, bool)> = Vec::new();
        let mut tokens = self.pending.clone();
        if self.units.is_empty() {
            // As `pml generate --chat` starts a conversation: BOS, then the system turn or the
            // template's default preamble.
            tokens.extend(parts.tokenizer.bos_token());
            match &self.system {
                Some(system) => {
                    let markers = template.markers(Role::System);
                    pieces.extend([
                        (markers.open.as_str(), true),
                        (system.as_str(), false),
                        (markers.close.as_str(), true),
                    ]);
                }
                None => pieces.push((template.default_preamble.as_str(), true)),
            }
        } else {
            pieces.push((template.markers(Role::Assistant).close.as_str(), true));
        }
        let user = template.markers(Role::User);
        pieces.extend([
            (user.open.as_str(), true),
            (text, false),
            (user.close.as_str(), true),
            (template.generation_prompt.as_str(), true),
        ]);
        for (piece, allow_special) in pieces {
            // An empty marker adds nothing (a SentencePiece tokenizer would encode a lone space).
            if !piece.is_empty() {
                tokens.extend(
                    parts
                        .tokenizer
                        .encode(piece, allow_special)
                        .map_err(|error| ConversationError::Tokenize(error.to_string()))?,
                );
            }
        }
        Ok(tokens)
    }
}

/// Every layer's input hidden states for the whole turn: the prompt's, kept by its prefill, then
/// the fed answer tokens', from one pass over them on a copy of the cache cut before them.
fn turn_layer_inputs(
    model: &Model,
    kv: &KvCache,
    answer_start: usize,
    answer: &[u32],
    unit: &SavedUnit,
    prompt_inputs: Vec<Tensor>,
) -> Result<Vec<Tensor>, ConversationError> {
    if answer.is_empty() {
        return Ok(prompt_inputs);
    }
    let mut scratch = kv.clone();
    scratch.truncate(answer_start);
    let offset = unit.tokens.len() - answer.len();
    let context = ForwardContext::appending(unit.positions[offset..].to_vec(), &scratch);
    let options = ForwardOptions {
        logits: LogitRows::None,
        keep_layer_inputs: true,
    };
    let answer_inputs = model
        .forward_with(answer, &context, &mut scratch, &options)?
        .layer_inputs;
    Ok(prompt_inputs
        .iter()
        .zip(&answer_inputs)
        .map(|(prompt, answer)| Tensor::cat(&[prompt, answer], 0))
        .collect::<Result<_, _>>()?)
}
