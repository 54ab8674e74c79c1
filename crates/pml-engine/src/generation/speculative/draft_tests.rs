//! Drafting with a second model against decoding without it, on seeded tiny models: the same
//! greedy and seeded answers and the same cache left behind, whatever the draft model.

use candle_core::Device;

use super::draft_model::check_vocabularies;
use super::{DEFAULT_DRAFT_P_MIN, Speculation};
use crate::generation::test_tokenizer::{ByteTokenizer, letter_tokenizer, tiny_model};
use crate::generation::{GenerateError, Generation, Generator, PromptInput, SamplingParams};
use crate::kv_cache::KvCache;
use crate::model::tiny::random_model;
use crate::model::{Arch, Model, WeightFormat};

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
    let stats = drafted.speculation;
    assert!(stats.drafted > 10, "{stats}");
    // Its own greedy tokens, computed bit for bit as the verification rows are.
    assert_eq!(stats.accepted, stats.drafted, "{stats}");
    assert!(stats.passes < plain.token_ids.len() / 2, "{stats}");
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
