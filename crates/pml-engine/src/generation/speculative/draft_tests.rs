//! Drafting with a second model against decoding without it, on seeded tiny models: the same
//! greedy and seeded answers and the same cache left behind, whatever the draft model.

use candle_core::Device;

use super::draft_model::check_vocabularies;
use super::draft_model::{DraftModel, ModelDrafter, ModelPace};
use super::pace::PassCosts;
use super::{DEFAULT_DRAFT_P_MIN, Proposer, Speculation};
use crate::generation::test_tokenizer::{ByteTokenizer, letter_tokenizer, tiny_model};
use crate::generation::{GenerateError, Generation, Generator, PromptInput, SamplingParams};
use crate::kv_cache::KvCache;
use crate::model::tiny::random_model;
use crate::model::{Arch, Model, WeightFormat};
use crate::tokenizer::Tokenizer;

fn drafting(p_min: f32) -> Speculation {
    Speculation::Draft {
        max_draft: 5,
        p_min,
    }
}

fn prompt() -> Vec<u32> {
    (0..40u32).map(|i| (i * 37) % 251).collect()
}

fn generate(
    model: &Model,
    draft: Option<&Model>,
    params: &SamplingParams,
    speculation: Speculation,
) -> (Generation, KvCache) {
    let tokenizer = letter_tokenizer();
    let mut kv = model.new_kv_cache().unwrap();
    let params = SamplingParams {
        speculation,
        ..params.clone()
    };
    let prompt = PromptInput::uncached(prompt());
    let generator = Generator::new(model, &tokenizer);
    let generation = match draft {
        Some(draft) => {
            generator.generate_with_draft_model(&mut kv, &prompt, &params, &mut |_| {}, draft)
        }
        None => generator.generate(&mut kv, &prompt, &params, &mut |_| {}),
    }
    .unwrap();
    (generation, kv)
}

fn greedy() -> SamplingParams {
    SamplingParams {
        max_tokens: 40,
        ..SamplingParams::default()
    }
}

#[test]
fn the_model_drafting_for_itself_has_every_draft_accepted() {
    let model = tiny_model();
    let (plain, plain_kv) = generate(&model, None, &greedy(), Speculation::Off);
    let (drafted, drafted_kv) = generate(&model, Some(&model), &greedy(), drafting(0.0));
    assert_eq!(drafted.token_ids, plain.token_ids);
    assert_eq!(drafted_kv.positions(), plain_kv.positions());
    // How often the draft model is asked depends on this machine's pass times (see the next
    // test for that, on given times); that it drafts, and what, does not.
    let stats = drafted.speculation;
    assert!(stats.drafted > 0, "{stats}");
    // Its own greedy tokens, computed bit for bit as the verification rows are.
    assert_eq!(stats.accepted, stats.drafted, "{stats}");
}

/// What [`propose_along`] saw: its passes, and the tokens the draft model drafted and of
/// those the answer kept.
struct Proposed {
    passes: usize,
    model_drafted: usize,
    model_accepted: usize,
}

/// Drives a proposer drafting with `model` for itself over its greedy `answer`, as the decode
/// loop would, every pass of `rows` rows taking `seconds(rows)`: a draft's accepted prefix is
/// its common prefix with the answer.
fn propose_along(model: &Model, answer: &[u32], seconds: impl Fn(usize) -> f64) -> Proposed {
    let prompt = prompt();
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    let prefill_tokens = prompt.clone();
    let draft = DraftModel {
        model,
        prefill: Box::new(move |_| {
            let mut kv = model.new_kv_cache()?;
            model.forward(&prefill_tokens, &positions, &mut kv)?;
            Ok(kv)
        }),
        kept: None,
    };
    let vocab = letter_tokenizer().vocab_size();
    let mut proposer = Proposer::new(drafting(0.0), &prompt, Some(draft), vocab)
        .unwrap()
        .unwrap();
    let mut proposed = Proposed {
        passes: 0,
        model_drafted: 0,
        model_accepted: 0,
    };
    let mut at = 0;
    while at < answer.len() {
        let room = answer.len() - at - 1;
        proposer.push(answer[at], (prompt.len() + at) as u32);
        let drafts = proposer.draft(room).unwrap();
        let accepted = drafts
            .iter()
            .zip(&answer[at + 1..])
            .take_while(|(draft, token)| draft == token)
            .count();
        proposer.record_pass(drafts.len() + 1, seconds(drafts.len() + 1));
        if proposer.modelled() {
            proposed.model_drafted += drafts.len();
            proposed.model_accepted += accepted;
        }
        proposer.verdict(&drafts, accepted, accepted < drafts.len());
        proposed.passes += 1;
        at += accepted + 1;
    }
    proposed
}

#[test]
fn the_draft_model_is_asked_while_its_passes_beat_plain_steps() {
    // A tiny Gemma-3's answer breaks its runs of one token now and then, where the n-gram
    // lookup has nothing and the draft model is asked.
    let model = random_model(Arch::Gemma3, 7, WeightFormat::default(), &Device::Cpu).unwrap();
    let (plain, _) = generate(&model, None, &greedy(), Speculation::Off);
    let answer = plain.token_ids;
    // Passes of a few rows cost little more than one, as on a model whose weights dominate;
    // the tiny model's drafting takes microseconds beside these.
    let fast = propose_along(&model, &answer, |rows| 0.100 + 0.005 * rows as f64);
    assert!(fast.model_drafted > 0);
    assert_eq!(fast.model_accepted, fast.model_drafted);
    let length = answer.len();
    assert!(
        fast.passes < length / 3,
        "{} passes for {length}",
        fast.passes
    );
    // Every pass that verifies drafts costing ten plain steps: none pays, from the lookup or
    // the draft model.
    let slow = propose_along(&model, &answer, |rows| match rows {
        1 => 0.100,
        _ => 1.000,
    });
    assert_eq!(slow.model_drafted, 0);
    assert!(
        slow.passes > length - 3,
        "{} passes for {length}",
        slow.passes
    );
}

#[test]
fn another_model_drafting_leaves_greedy_and_seeded_answers_unchanged() {
    // Tiny Gemma-3s: their capped logits spread the next-token distribution, so two seeds
    // disagree often and rejected drafts' rows are rolled back (the tiny Qwen2s put nearly
    // everything on one token and agree).
    let model = random_model(Arch::Gemma3, 7, WeightFormat::default(), &Device::Cpu).unwrap();
    let draft = random_model(Arch::Gemma3, 8, WeightFormat::default(), &Device::Cpu).unwrap();
    let (plain, plain_kv) = generate(&model, None, &greedy(), Speculation::Off);
    for p_min in [0.0, DEFAULT_DRAFT_P_MIN] {
        let (drafted, drafted_kv) = generate(&model, Some(&draft), &greedy(), drafting(p_min));
        assert_eq!(drafted.token_ids, plain.token_ids, "p_min {p_min}");
        assert_eq!(drafted_kv.positions(), plain_kv.positions());
        assert_eq!(
            drafted.timings.decode_steps.len(),
            plain.timings.decode_steps.len()
        );
    }
    let (drafted, _) = generate(&model, Some(&draft), &greedy(), drafting(0.0));
    assert!(drafted.speculation.drafted > 0);
    assert!(drafted.speculation.accepted < drafted.speculation.drafted);
    for seed in 0..4 {
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
            seed,
            max_tokens: 32,
            ..SamplingParams::default()
        };
        let (plain, _) = generate(&model, None, &params, Speculation::Off);
        let (drafted, _) = generate(&model, Some(&model), &params, drafting(0.0));
        assert_eq!(drafted.token_ids, plain.token_ids, "seed {seed}");
        let (drafted, _) = generate(&model, Some(&draft), &params, drafting(0.0));
        assert_eq!(drafted.token_ids, plain.token_ids, "seed {seed}");
    }
}

#[test]
fn drafting_without_a_draft_model_is_refused() {
    let model = tiny_model();
    let tokenizer = letter_tokenizer();
    let mut kv = model.new_kv_cache().unwrap();
    let params = SamplingParams {
        speculation: drafting(0.5),
        ..greedy()
    };
    let result = Generator::new(&model, &tokenizer).generate(
        &mut kv,
        &PromptInput::uncached(prompt()),
        &params,
        &mut |_| {},
    );
    assert!(
        matches!(&result, Err(GenerateError::InvalidPrompt(message)) if message.contains("draft model")),
        "{result:?}"
    );
}

#[test]
fn a_draft_model_of_another_vocabulary_is_refused() {
    let target = letter_tokenizer();
    assert_eq!(check_vocabularies(&target, &letter_tokenizer()), Ok(()));
    let respelled: Vec<Vec<u8>> = (0..256u32)
        .map(|id| {
            vec![if id == 200 {
                b'!'
            } else {
                b'a' + (id % 26) as u8
            }]
        })
        .collect();
    let respelled: Vec<&[u8]> = respelled.iter().map(Vec::as_slice).collect();
    let error = check_vocabularies(&target, &ByteTokenizer::new(&respelled)).unwrap_err();
    assert!(error.contains("token 200"), "{error}");
    let larger: Vec<Vec<u8>> = (0..512u32).map(|id| vec![b'a' + (id % 26) as u8]).collect();
    let larger: Vec<&[u8]> = larger.iter().map(Vec::as_slice).collect();
    let error = check_vocabularies(&target, &ByteTokenizer::new(&larger)).unwrap_err();
    assert!(error.contains("512 tokens"), "{error}");
    let other_eos = letter_tokenizer().with_eos_tokens(&[7]);
    let error = check_vocabularies(&target, &other_eos).unwrap_err();
    assert!(error.contains("end-of-turn"), "{error}");
}

/// A server's drafter: its cache starts from a spliced prefix and is fed the rest of the
/// prompt a chunk at a time; then it drafts what the model decodes greedily, from a cache
/// holding the sequence's rows one to a position.
#[test]
fn a_drafter_filled_in_chunks_drafts_the_models_greedy_tokens() {
    let model = tiny_model();
    let (plain, _) = generate(&model, None, &greedy(), Speculation::Off);
    let prompt = prompt();
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut start = model.new_kv_cache().unwrap();
    model
        .forward(&prompt[..16], &positions[..16], &mut start)
        .unwrap();
    let vocab = letter_tokenizer().vocab_size();
    let mut drafter = ModelDrafter::filling(
        &model,
        start,
        &prompt[16..],
        &positions[16..],
        5,
        0.0,
        vocab,
    );
    assert_eq!(drafter.unfed(), prompt.len() - 16);
    while drafter.unfed() > 0 {
        drafter.feed(7).unwrap();
    }
    assert_eq!(drafter.kv().unwrap().positions(), &positions[..]);
    let first = plain.token_ids[0];
    drafter.push(first, prompt.len() as u32);
    // Passes cost the same whatever their rows: every draft the model is sure enough of pays.
    let mut costs = PassCosts::new(8);
    for rows in 1..=8 {
        costs.record(rows, 1.0);
    }
    let drafts = drafter.draft(5, &costs).unwrap();
    assert!(!drafts.is_empty());
    assert_eq!(drafts[..], plain.token_ids[1..=drafts.len()]);
    // The drafts it ran stay in its cache until the verdict keeps or drops them.
    drafter.verdict(&drafts, 0);
    let kept: Vec<u32> = (0..=prompt.len() as u32).collect();
    assert_eq!(drafter.kv().unwrap().positions(), &kept[..]);
}

/// A draft model slower than plain steps is tried again after 16 passes, then twice as long
/// after each retry that did not pay, up to 256; once a retry pays it is asked every pass.
#[test]
fn a_draft_model_that_does_not_pay_is_retried_ever_less_often() {
    let plain_rate = 10.0;
    let mut pace = ModelPace::default();
    assert!(
        pace.ask(plain_rate),
        "a draft model never measured is tried"
    );
    pace.record(1, 1.0);
    let mut waits = Vec::new();
    let mut since = 0;
    for _ in 0..2000 {
        since += 1;
        if pace.ask(plain_rate) {
            waits.push(since);
            since = 0;
            pace.record(1, 1.0);
        }
    }
    assert_eq!(waits[..5], [16, 32, 64, 128, 256]);
    assert!(waits[5..].iter().all(|&wait| wait == 256), "{waits:?}");
    while !pace.ask(plain_rate) {}
    pace.record(100, 1.0);
    assert!((0..10).all(|_| pace.ask(plain_rate)));
}
