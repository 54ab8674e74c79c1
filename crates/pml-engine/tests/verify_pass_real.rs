//! A pass over a decode step's token and drafted tokens after it computes every row exactly as
//! decode steps of one token each do, bit for bit, on the default real model (skipped when it is
//! not fetched, unless `PML_REQUIRE_MODELS=1`): so speculative decoding's answers are the same
//! tokens as plain decoding's. Attention once cut a query's keys into runs sized by how many
//! queries shared the call, and the last-bit difference grew to 0.24 in the logits by the last
//! layer (an activation's 8-bit rounding flipped).

use pml_engine::device::default_device;
use pml_engine::generation::speculative::MAX_DRAFT;
use pml_engine::kv_cache::KvCache;
use pml_engine::model::{ForwardContext, ForwardOptions, LogitRows, Model, WeightFormat};
use pml_testkit::fetched_model;

#[test]
fn every_row_of_a_verification_pass_equals_its_decode_step() {
    let Some(path) = fetched_model("qwen2.5-0.5b") else {
        return;
    };
    let model = Model::load(&path, WeightFormat::default(), &default_device()).expect("loads");
    for context in [200u32, 1000] {
        let prompt: Vec<u32> = (0..context).map(|i| 1000 + i * 37).collect();
        let positions: Vec<u32> = (0..context).collect();
        let mut prefilled =
            KvCache::with_capacity(model.kv_layout(), model.device(), prompt.len() + 16)
                .expect("cache");
        model
            .forward(&prompt, &positions, &mut prefilled)
            .expect("prefill");
        for rows in 2..=MAX_DRAFT + 1 {
            let tokens: Vec<u32> = (0..rows as u32).map(|i| 42 + i * 1000).collect();
            let mut stepped = prefilled.clone();
            let steps: Vec<Vec<f32>> = tokens
                .iter()
                .zip(context..)
                .map(|(&token, position)| {
                    model
                        .forward(&[token], &[position], &mut stepped)
                        .and_then(|logits| Ok(logits.to_vec1::<f32>()?))
                        .expect("decode step")
                })
                .collect();
            let mut kv = prefilled.clone();
            let pass = ForwardContext::appending((context..context + rows as u32).collect(), &kv);
            let options = ForwardOptions {
                logits: LogitRows::All,
                ..ForwardOptions::default()
            };
            let verified = model
                .forward_with(&tokens, &pass, &mut kv, &options)
                .expect("pass")
                .logits
                .expect("logits")
                .to_vec2::<f32>()
                .expect("f32 rows");
            assert!(
                verified == steps,
                "a pass of {rows} rows after {context} tokens differs from its decode steps"
            );
        }
    }
}
