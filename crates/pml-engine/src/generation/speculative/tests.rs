//! Speculation against decoding without it, on a seeded tiny model: the same greedy and seeded
//! answers, the same cache left behind, and the same next-token distribution when sampling.

use candle_core::Device;

use super::Speculation;
use crate::generation::test_tokenizer::{letter_tokenizer, tiny_model};
use crate::generation::{
    DecodeState, Generation, Generator, PromptInput, SamplingParams, logits_to_vec,
};
use crate::kv_cache::KvCache;
use crate::model::tiny::random_model;
use crate::model::{Arch, Model, WeightFormat};
use crate::tokenizer::Tokenizer;

const DRAFTS: Speculation = Speculation::Ngram {
    max_draft: 6,
    min_match: 1,
};

/// Prompts whose answers the tiny model partly repeats from them (and from themselves).
fn prompts() -> Vec<Vec<u32>> {
    let phrase = [17u32, 200, 31, 64, 9, 128, 77, 5];
    let mut repeated = phrase.repeat(4);
    repeated.extend_from_slice(&phrase[..3]);
    vec![
        vec![3, 141, 59, 26, 53, 58],
        repeated,
        (0..40u32).map(|i| (i * 37) % 251).collect(),
    ]
}

fn generate(
    model: &Model,
    prompt: &[u32],
    params: &SamplingParams,
    speculation: Speculation,
) -> (Generation, KvCache) {
    let tokenizer = letter_tokenizer();
    let mut kv = model.new_kv_cache().unwrap();
    let params = SamplingParams {
        speculation,
        ..params.clone()
    };
    let generation = Generator::new(model, &tokenizer)
        .generate(
            &mut kv,
            &PromptInput::uncached(prompt.to_vec()),
            &params,
            &mut |_| {},
        )
        .unwrap();
    (generation, kv)
}

#[test]
fn greedy_answers_and_their_caches_are_the_same_with_drafts() {
    let model = tiny_model();
    let params = SamplingParams {
        max_tokens: 48,
        ..SamplingParams::default()
    };
    let mut accepted = 0;
    for prompt in prompts() {
        let (plain, plain_kv) = generate(&model, &prompt, &params, Speculation::Off);
        let (drafted, drafted_kv) = generate(&model, &prompt, &params, DRAFTS);
        assert_eq!(drafted.token_ids, plain.token_ids, "prompt {prompt:?}");
        assert_eq!(drafted.text, plain.text);
        assert_eq!(drafted.finish_reason, plain.finish_reason);
        assert_eq!(plain.speculation.drafted, 0);
        // Rejected drafts leave nothing behind: the cache holds what plain decoding ran.
        assert_eq!(drafted_kv.positions(), plain_kv.positions());
        let last = drafted_kv.len() - 1;
        for layer in 0..2 {
            let keys = |kv: &KvCache| {
                let keys = kv.layer(layer).unwrap().keys().unwrap();
                keys.narrow(0, last, 1).unwrap().flatten_all().unwrap()
            };
            let gap = (keys(&drafted_kv) - keys(&plain_kv))
                .unwrap()
                .abs()
                .unwrap()
                .max(0)
                .unwrap()
                .to_dtype(candle_core::DType::F32)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(gap < 1e-2, "layer {layer}: the last key differs by {gap}");
        }
        // Every token after the first is timed, drafted or not.
        assert_eq!(
            drafted.timings.decode_steps.len(),
            plain.timings.decode_steps.len()
        );
        accepted += drafted.speculation.accepted;
    }
    assert!(
        accepted > 0,
        "no draft was ever accepted: the test proves nothing"
    );
}

#[test]
fn seeded_sampled_answers_are_the_same_with_drafts() {
    let model = tiny_model();
    let prompt = &prompts()[1];
    let mut accepted = 0;
    for seed in 0..6 {
        let params = SamplingParams {
            temperature: 0.8,
            top_k: 0,
            top_p: 1.0,
            seed,
            max_tokens: 32,
            ..SamplingParams::default()
        };
        let (plain, _) = generate(&model, prompt, &params, Speculation::Off);
        let (drafted, _) = generate(&model, prompt, &params, DRAFTS);
        assert_eq!(drafted.token_ids, plain.token_ids, "seed {seed}");
        accepted += drafted.speculation.accepted;
    }
    assert!(
        accepted > 0,
        "no draft was ever accepted: the test proves nothing"
    );
}

#[test]
fn a_stop_string_inside_a_drafted_run_ends_the_answer_where_it_would() {
    let model = tiny_model();
    let tokenizer = letter_tokenizer();
    let prompt = &prompts()[1];
    let greedy = SamplingParams {
        max_tokens: 40,
        ..SamplingParams::default()
    };
    let (plain, _) = generate(&model, prompt, &greedy, Speculation::Off);
    // A stop string that the plain answer reaches late, after drafts were accepted.
    let ids = &plain.token_ids[20..23];
    let stop = tokenizer.decode(ids).unwrap();
    let params = SamplingParams {
        stop: vec![stop],
        ..greedy
    };
    let (plain, _) = generate(&model, prompt, &params, Speculation::Off);
    let (drafted, _) = generate(&model, prompt, &params, DRAFTS);
    assert_eq!(drafted.text, plain.text);
    assert_eq!(drafted.token_ids, plain.token_ids);
    assert_eq!(drafted.finish_reason, plain.finish_reason);
}

/// The chi-square statistic of two samples' counts (of any sizes) drawn from one distribution,
/// over the bins where they have any, and its degrees of freedom.
fn two_sample_chi_square(a: &[usize], b: &[usize]) -> (f64, usize) {
    let (n_a, n_b) = (
        a.iter().sum::<usize>() as f64,
        b.iter().sum::<usize>() as f64,
    );
    let (k_a, k_b) = ((n_b / n_a).sqrt(), (n_a / n_b).sqrt());
    let mut statistic = 0.0;
    let mut bins = 0usize;
    for (&a, &b) in a.iter().zip(b) {
        if a + b > 0 {
            let (a, b) = (a as f64, b as f64);
            statistic += (k_a * a - k_b * b).powi(2) / (a + b);
            bins += 1;
        }
    }
    (statistic, bins.saturating_sub(1))
}

/// The chi-square value a statistic of `df` degrees of freedom exceeds with probability 0.01
/// (Wilson–Hilferty).
fn chi_square_critical_1_percent(df: usize) -> f64 {
    let df = df as f64;
    let z = 2.326_348;
    df * (1.0 - 2.0 / (9.0 * df) + z * (2.0 / (9.0 * df)).sqrt()).powi(3)
}

/// Sampling at temperature 0.8 from a pass of a step's token and one draft after it, 10,000
/// times with and without the draft: the first token's distribution, and the second's given
/// that the first was the draft, are the model's either way.
#[test]
fn drafted_sampling_keeps_the_models_distribution() {
    const SAMPLES: u64 = 10_000;
    // The tiny Gemma-3's capped logits spread its next-token distribution (the top token ~14%
    // at this seed); the tiny Qwen2's put nearly all of it on one token.
    let model = random_model(Arch::Gemma3, 7, WeightFormat::default(), &Device::Cpu).unwrap();
    let tokenizer = letter_tokenizer();
    let prompt = [3u32, 141, 59, 26, 53, 58];
    let mut kv = model.new_kv_cache().unwrap();
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    let first = logits_to_vec(&model.forward(&prompt, &positions, &mut kv).unwrap()).unwrap();
    // The draft: the most likely next token, so it is accepted often and refused often.
    let draft = first
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(token, _)| token as u32)
        .unwrap();
    let after_draft = logits_to_vec(
        &model
            .forward(&[draft], &[prompt.len() as u32], &mut kv)
            .unwrap(),
    )
    .unwrap();
    let rows = [first.clone(), after_draft.clone()];

    let vocab = first.len();
    let mut counts = [vec![0usize; vocab], vec![0; vocab]];
    let mut second = [vec![0usize; vocab], vec![0; vocab]];
    for sample in 0..SAMPLES {
        for (arm, drafts) in [(0, &[][..]), (1, &[draft][..])] {
            let params = SamplingParams {
                temperature: 0.8,
                top_k: 0,
                top_p: 1.0,
                // Each arm draws its own random numbers.
                seed: sample + arm as u64 * SAMPLES,
                max_tokens: 2,
                speculation: Speculation::Off,
                ..SamplingParams::default()
            };
            let mut state =
                DecodeState::new(&tokenizer, &prompt, &params, prompt.len() as u32).unwrap();
            let tokens = if drafts.is_empty() {
                // Plain decoding: a pass per token.
                state.accept(&first, &mut |_| {}).unwrap();
                if state.token_ids()[0] == draft {
                    state.accept(&after_draft, &mut |_| {}).unwrap();
                }
                state.token_ids().to_vec()
            } else {
                state.accept_drafted(&rows, drafts, &mut |_| {}).unwrap();
                state.token_ids().to_vec()
            };
            counts[arm][tokens[0] as usize] += 1;
            if let Some(&next) = tokens.get(1).filter(|_| tokens[0] == draft) {
                second[arm][next as usize] += 1;
            }
        }
    }
    let (statistic, df) = two_sample_chi_square(&counts[0], &counts[1]);
    let critical = chi_square_critical_1_percent(df);
    assert!(
        statistic < critical,
        "first tokens: chi-square {statistic:.1} over {df} degrees of freedom (1% critical {critical:.1})"
    );
    // The second token is only decided when the first was the draft: a distribution of its own.
    let (n0, n1) = (
        second[0].iter().sum::<usize>(),
        second[1].iter().sum::<usize>(),
    );
    assert!(
        n0 > 100 && n1 > 100,
        "the draft was drawn too rarely: {n0}, {n1}"
    );
    let (statistic, df) = two_sample_chi_square(&second[0], &second[1]);
    let critical = chi_square_critical_1_percent(df);
    assert!(
        statistic < critical,
        "second tokens: chi-square {statistic:.1} over {df} degrees of freedom (1% critical {critical:.1})"
    );
}
