//! A conversation's draft model (`pml chat --draft-model`): its own cache of the conversation,
//! kept from turn to turn as the model's is, so a turn's draft prefill computes only what the
//! draft model has not seen (the last answer's tail it never drafted over, and the new turn).

use pml_engine::generation::GenerateError;
use pml_engine::generation::speculative::DraftModel;
use pml_engine::kv_cache::KvCache;
use pml_engine::model::Model;

use super::TurnInput;

/// The draft model drafting for a turn: it starts from `kept` (left there by the last turn, a
/// prefix of the history), computes the rest of the history and the turn's prompt, and leaves
/// its cache in `kept` for the next turn.
pub(super) fn turn_draft<'t>(
    model: &'t Model,
    turn: &'t TurnInput<'t>,
    kept: &'t mut Option<KvCache>,
) -> DraftModel<'t> {
    DraftModel {
        model,
        prefill: Box::new(move |earlier| prefill(model, earlier, turn)),
        kept: Some(kept),
    }
}

/// `earlier` (a prefix of the history's rows, or nothing) with the history's remaining tokens
/// and the turn's prompt computed after it.
fn prefill(
    model: &Model,
    earlier: Option<KvCache>,
    turn: &TurnInput<'_>,
) -> Result<KvCache, GenerateError> {
    let mut kv = match earlier {
        Some(kv) => kv,
        None => model.new_kv_cache()?,
    };
    let held = kv.len().min(turn.history_tokens.len());
    kv.rollback(held);
    let mut tokens = turn.history_tokens[held..].to_vec();
    tokens.extend_from_slice(turn.prompt);
    let mut positions = turn.history_positions[held..].to_vec();
    positions.extend_from_slice(turn.prompt_positions);
    model.forward(&tokens, &positions, &mut kv)?;
    Ok(kv)
}

#[cfg(test)]
mod tests {
    use pml_engine::generation::{SamplingParams, Speculation};
    use pml_engine::model::{Arch, Model};
    use pml_engine::testing::max_abs_diff;

    use super::super::{ChatParts, Conversation};
    use crate::inference::Runtime;
    use crate::testing::tiny_runtime;

    fn parts<'a>(runtime: &'a Runtime, draft: Option<&'a Model>) -> ChatParts<'a> {
        ChatParts {
            model: runtime.model(),
            tokenizer: runtime.tokenizer(),
            template: runtime.template(),
            store: runtime.store(),
            max_positions: 4096,
            draft,
        }
    }

    fn greedy(speculation: Speculation) -> SamplingParams {
        SamplingParams {
            temperature: 0.0,
            max_tokens: 24,
            speculation,
            ..SamplingParams::default()
        }
    }

    #[test]
    fn turns_drafted_by_a_draft_model_answer_as_without_it_from_a_kept_cache() {
        // A tiny Gemma-3 (its answers break their runs, where the draft model is asked)
        // drafting for itself: its cache's rows are what the model's would be.
        let (runtime, _manifests) = tiny_runtime(Arch::Gemma3, 7);
        let (draft, _draft_manifests) = tiny_runtime(Arch::Gemma3, 7);
        let drafting = Speculation::Draft {
            max_draft: 5,
            p_min: 0.0,
        };
        let mut plain = Conversation::new(Some("be brief".into()));
        let mut drafted = Conversation::new(Some("be brief".into()));
        let mut drafted_tokens = 0;
        for text in ["hello there", "and then?", "tell me more"] {
            let expected = plain
                .turn(
                    &parts(&runtime, None),
                    text,
                    &greedy(Speculation::Off),
                    None,
                    &mut |_| {},
                )
                .unwrap();
            let report = drafted
                .turn(
                    &parts(&runtime, Some(draft.model())),
                    text,
                    &greedy(drafting),
                    None,
                    &mut |_| {},
                )
                .unwrap();
            assert_eq!(report.generation.token_ids, expected.generation.token_ids);
            drafted_tokens += report.generation.speculation.drafted;
        }
        assert!(drafted_tokens > 0);
        // The kept cache is a prefix of the conversation's rows: given the rest, the draft
        // model predicts as the model does after the whole conversation.
        let kv = drafted.kv.clone().unwrap();
        let mut draft_kv = drafted
            .draft_kv
            .clone()
            .expect("the draft model's cache is kept");
        assert!(draft_kv.len() <= kv.len());
        assert_eq!(draft_kv.positions(), &kv.positions()[..draft_kv.len()]);
        let (tokens, positions) = drafted.history();
        let held = draft_kv.len();
        if held < tokens.len() {
            draft
                .model()
                .forward(&tokens[held..], &positions[held..], &mut draft_kv)
                .unwrap();
        }
        let probe = *positions.last().unwrap() + 1;
        let mut kv = kv;
        let expected = runtime.model().forward(&[3], &[probe], &mut kv).unwrap();
        let predicted = draft
            .model()
            .forward(&[3], &[probe], &mut draft_kv)
            .unwrap();
        let gap = max_abs_diff(&expected, &predicted);
        assert!(gap < 1e-3, "{gap}");
    }
}
