//! Conversations and the model's context: without a KV budget a conversation ends where its
//! positions do; within one (H2O) it holds at most the budget and goes on past the context,
//! and a budget it never reaches changes no answer. Tiny random models of every family.

use pml_engine::generation::{FinishReason, SamplingParams};
use pml_engine::model::Arch;
use pml_runtime::conversation::{ChatParts, Conversation, ConversationError, TurnReport};
use pml_runtime::inference::Runtime;
use pml_runtime::kv_budget::{DEFAULT_SINKS, HeavyHitters, KvBudget};
use pml_runtime::restore::{LayerForm, RestorePlan};
use pml_runtime::testing::tiny_runtime;

fn parts(runtime: &Runtime, max_positions: u32) -> ChatParts<'_> {
    ChatParts {
        model: runtime.model(),
        tokenizer: runtime.tokenizer(),
        template: runtime.template(),
        store: runtime.store(),
        max_positions,
        draft: None,
    }
}

fn greedy(max_tokens: usize) -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        max_tokens,
        ..SamplingParams::default()
    }
}

fn budgeted(slots: usize, recent: usize, limit: u32) -> Conversation {
    let budget = KvBudget::new(slots, recent, DEFAULT_SINKS).expect("budget");
    let hitters = HeavyHitters::new(budget)
        .with_position_limit(limit)
        .expect("limit");
    Conversation::new(Some("be brief".into())).with_kv_budget(hitters)
}

fn turn(
    conversation: &mut Conversation,
    parts: &ChatParts<'_>,
    text: &str,
    params: &SamplingParams,
) -> Result<TurnReport, ConversationError> {
    conversation.turn(parts, text, params, None, &mut |_| {})
}

const TURNS: [&str; 3] = ["hello there", "and then?", "tell me more"];

#[test]
fn a_budget_never_reached_answers_as_full_kv_does() {
    for arch in Arch::ALL {
        let (runtime, _manifests) = tiny_runtime(arch, 21);
        let parts = parts(&runtime, 4096);
        let mut full = Conversation::new(Some("be brief".into()));
        let mut within = budgeted(512, 64, 4096);
        for text in TURNS {
            let expected = turn(&mut full, &parts, text, &greedy(8)).expect("full");
            let report = turn(&mut within, &parts, text, &greedy(8)).expect("budgeted");
            assert_eq!(
                report.generation.token_ids, expected.generation.token_ids,
                "{arch:?}: {text}"
            );
            assert_eq!(report.kv_slots, expected.kv_slots, "{arch:?}");
            assert_eq!(report.evicted, 0, "{arch:?}");
        }
    }
}

#[test]
fn a_conversation_past_the_context_goes_on_within_its_budget() {
    for arch in Arch::ALL {
        let (runtime, _manifests) = tiny_runtime(arch, 21);
        let parts = parts(&runtime, 96);
        let mut conversation = budgeted(48, 16, 96);
        let mut last = None;
        for round in 0..12 {
            let text = TURNS[round % TURNS.len()];
            let report = turn(&mut conversation, &parts, text, &greedy(10)).expect("turn");
            assert_eq!(
                report.generation.token_ids.len(),
                10,
                "{arch:?} turn {round}"
            );
            assert!(report.kv_slots <= 48, "{arch:?}: {} slots", report.kv_slots);
            last = Some(report);
        }
        let last = last.expect("turns");
        assert!(
            last.history_tokens > 2 * 96,
            "{arch:?}: {}",
            last.history_tokens
        );
        assert!(last.position_moves >= 1, "{arch:?}");
        assert!(last.evicted > last.history_tokens - 48, "{arch:?}");
    }
}

#[test]
fn without_a_budget_the_context_ends_the_conversation() {
    let (runtime, _manifests) = tiny_runtime(Arch::Qwen2, 21);
    let parts = parts(&runtime, 40);
    let mut conversation = Conversation::new(None);
    // 12 prompt tokens, 20 answer tokens asked for: the answer stops at the context's end.
    let first = turn(&mut conversation, &parts, "hello there", &greedy(20)).expect("turn 1");
    assert_eq!(first.generation.token_ids.len(), 20);
    let second = turn(&mut conversation, &parts, "and?", &greedy(20));
    let report = match second {
        Ok(report) => report,
        Err(error) => panic!("the second turn should start: {error}"),
    };
    assert_eq!(report.generation.finish_reason, FinishReason::Length);
    assert!(
        report.history_tokens + report.prefill_tokens + report.generation.token_ids.len() <= 41
    );
    let third = turn(&mut conversation, &parts, "and?", &greedy(20));
    assert!(
        matches!(third, Err(ConversationError::ContextFull { limit: 40, .. })),
        "{:?}",
        third.map(|report| report.history_tokens)
    );
}

#[test]
fn a_conversation_within_a_budget_is_not_saved() {
    let (runtime, _manifests) = tiny_runtime(Arch::Qwen2, 21);
    let parts = parts(&runtime, 4096);
    let plan = RestorePlan::uniform(LayerForm::Kv, runtime.model().config().n_layers);
    let mut conversation = budgeted(64, 16, 4096);
    let result = conversation.turn(&parts, "hello", &greedy(4), Some(&plan), &mut |_| {});
    assert!(matches!(result, Err(ConversationError::BudgetNotSaved)));
}
