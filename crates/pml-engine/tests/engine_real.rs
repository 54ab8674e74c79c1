//! The engine on the real models (skipped when they are not fetched, unless
//! `PML_REQUIRE_MODELS=1`): configuration read from the GGUF, greedy answers to a chat prompt,
//! and logits against llama.cpp's reference fixtures.
// The test reports what it measured or skipped.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::path::PathBuf;

use candle_core::{Device, IndexOp, Tensor};
use pml_engine::Tokenizer;
use pml_engine::device::default_device;
use pml_engine::gguf::GgufFile;
use pml_engine::model::{
    Arch, ForwardContext, ForwardOptions, LogitRows, Model, ModelConfig, WeightFormat,
};
use pml_engine::testing::prefill_then_decode;
use pml_engine::tokenizer::GgufTokenizer;
use pml_testkit::fetched_model;
use serde::Deserialize;

const QWEN: &str = "qwen2.5-0.5b";
const GEMMA: &str = "gemma3-270m";
const SMOLLM: &str = "smollm2-135m";

fn load(id: &str) -> Option<(Model, GgufTokenizer, GgufFile)> {
    let path = fetched_model(id)?;
    let gguf = GgufFile::open(&path).expect("GGUF opens");
    let tokenizer = GgufTokenizer::from_gguf(&gguf).expect("tokenizer builds");
    let model =
        Model::load(&path, WeightFormat::default(), &default_device()).expect("model loads");
    Some((model, tokenizer, gguf))
}

fn greedy(model: &Model, prompt: &[u32], n_new: usize) -> Vec<u32> {
    let mut kv = model.new_kv_cache().unwrap();
    let positions: Vec<u32> = (0..prompt.len() as u32).collect();
    let mut logits = model.forward(prompt, &positions, &mut kv).unwrap();
    let mut generated = Vec::new();
    for step in 0..n_new {
        let next = logits.argmax(0).unwrap().to_scalar::<u32>().unwrap();
        generated.push(next);
        let position = (prompt.len() + step) as u32;
        logits = model.forward(&[next], &[position], &mut kv).unwrap();
    }
    generated
}

/// The configuration of a fetched model whose every layer is global with one RoPE base,
/// checked against its model card: family, (layers, d_model, heads, KV heads, head_dim), base.
fn check_uniform_config(
    id: &str,
    arch: Arch,
    shape: (usize, usize, usize, usize, usize),
    rope_base: f64,
) -> Option<ModelConfig> {
    let path = fetched_model(id)?;
    let config = ModelConfig::from_gguf(&GgufFile::open(path).unwrap()).unwrap();
    assert_eq!(config.arch, arch);
    let dims = (
        config.n_layers,
        config.d_model,
        config.n_heads,
        config.n_kv_heads,
        config.head_dim,
    );
    assert_eq!(dims, shape, "{id}");
    assert!(config.layers.iter().all(|layer| {
        layer.rope_base == rope_base
            && layer.sliding_window.is_none()
            && layer.rope_position_scale == 1.0
    }));
    Some(config)
}

#[test]
fn qwen_config_matches_the_model_card() {
    if let Some(config) = check_uniform_config(QWEN, Arch::Qwen2, (24, 896, 14, 2, 64), 1e6) {
        assert!(config.qkv_bias);
    }
}

#[test]
fn smollm_config_matches_the_model_card() {
    if let Some(config) = check_uniform_config(SMOLLM, Arch::Llama, (30, 576, 9, 3, 64), 1e5) {
        assert!(!config.qkv_bias && !config.qk_norm && config.rope_pairs_adjacent);
    }
}

#[test]
fn gemma_config_matches_the_model_card() {
    let Some(path) = fetched_model(GEMMA) else {
        return;
    };
    let gguf = GgufFile::open(path).unwrap();
    let config = ModelConfig::from_gguf(&gguf).unwrap();
    assert_eq!(config.arch, Arch::Gemma3);
    assert_eq!(
        (
            config.n_layers,
            config.d_model,
            config.n_heads,
            config.n_kv_heads,
            config.head_dim
        ),
        (18, 640, 4, 1, 256)
    );
    let global: Vec<usize> = (0..config.n_layers)
        .filter(|&il| config.layers[il].sliding_window.is_none())
        .collect();
    assert_eq!(
        global,
        vec![5, 11, 17],
        "five local layers, then a global one"
    );
    for (il, layer) in config.layers.iter().enumerate() {
        let expected_base = if global.contains(&il) { 1e6 } else { 1e4 };
        assert_eq!(layer.rope_base, expected_base, "layer {il}");
        if !global.contains(&il) {
            assert_eq!(layer.sliding_window, Some(512));
        }
    }
    assert_eq!(config.attention_scale, 1.0 / 16.0);
    assert_eq!(config.embedding_scale, Some(640f64.sqrt()));

    // Gemma's RMSNorm multiplies by (1 + w): the converter folded the 1 in, so stored norm
    // weights sit around 1 and above rather than around 0.
    let norm = gguf
        .tensor("blk.0.ffn_norm.weight", &Device::Cpu)
        .unwrap()
        .dequantize(&Device::Cpu)
        .unwrap();
    let mean = norm.mean_all().unwrap().to_scalar::<f32>().unwrap();
    assert!(mean > 0.5, "mean of blk.0.ffn_norm.weight is {mean}");
}

#[test]
fn qwen_answers_paris() {
    let Some((model, tokenizer, _)) = load(QWEN) else {
        return;
    };
    let prompt = tokenizer
        .encode(
            "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
            true,
        )
        .unwrap();
    let answer = tokenizer.decode(&greedy(&model, &prompt, 8)).unwrap();
    eprintln!("qwen answered {answer:?}");
    assert!(answer.contains("Paris"), "answer {answer:?}");
}

/// The fetched Gemma is the pretrained 270M model (its GGUF has no chat template): at the end of
/// a chat-formatted question it repeats the question, as llama.cpp does too, so it is asked in
/// plain text.
#[test]
fn gemma_answers_paris() {
    let Some((model, tokenizer, _)) = load(GEMMA) else {
        return;
    };
    let mut prompt: Vec<u32> = tokenizer.bos_token().into_iter().collect();
    prompt.extend(
        tokenizer
            .encode("Question: What is the capital of France?\nAnswer:", false)
            .unwrap(),
    );
    let answer = tokenizer.decode(&greedy(&model, &prompt, 4)).unwrap();
    eprintln!("gemma answered {answer:?}");
    assert!(answer.contains("Paris"), "answer {answer:?}");
}

/// `tests/fixtures/reference/logits-<id>.json`, written by `scripts/llama_reference.py`.
#[derive(Deserialize)]
struct ReferenceLogits {
    model: String,
    cases: Vec<ReferenceCase>,
}

#[derive(Deserialize)]
struct ReferenceCase {
    name: String,
    ids: Vec<u32>,
    positions: Vec<ReferencePosition>,
}

#[derive(Deserialize)]
struct ReferencePosition {
    /// `[token id, logit]`, best first.
    top: Vec<(u32, f32)>,
}

/// llama.cpp quantizes activations to 8 bits in its matmuls and keeps K/V in f16, so where its
/// best token leads the next by less than this, either may come out on top. A wrong detail of
/// the forward pass (e.g. the RoPE base of Gemma's local layers) moves logits by several units
/// and flips about a third of the positions instead.
const NEAR_TIE: f32 = 0.5;

fn compare_with_llama_cpp(id: &str) {
    let fixture = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/reference")
        .join(format!("logits-{id}.json"));
    let Some((model, _, _)) = load(id) else {
        return;
    };
    // The fixture is committed: a missing one is a broken checkout, never a pass.
    let text = std::fs::read_to_string(&fixture)
        .unwrap_or_else(|error| panic!("reference fixture {}: {error}", fixture.display()));
    let reference: ReferenceLogits = serde_json::from_str(&text).expect("fixture parses");
    assert_eq!(reference.model, id);

    let (mut max_abs_diff, mut sum_abs_diff, mut n_compared) = (0f32, 0f64, 0usize);
    let (mut n_positions, mut n_same_top1) = (0usize, 0usize);
    for case in &reference.cases {
        assert_eq!(case.ids.len(), case.positions.len(), "{}", case.name);
        let mut kv = model.new_kv_cache().unwrap();
        let context = ForwardContext::appending((0..case.ids.len() as u32).collect(), &kv);
        let options = ForwardOptions {
            logits: LogitRows::All,
            keep_layer_inputs: false,
        };
        let logits = model
            .forward_with(&case.ids, &context, &mut kv, &options)
            .unwrap()
            .logits
            .unwrap();
        for (row, expected) in case.positions.iter().enumerate() {
            let row_logits: Tensor = logits.i(row).unwrap();
            let row_values = row_logits.to_vec1::<f32>().unwrap();
            let ours = row_logits.argmax(0).unwrap().to_scalar::<u32>().unwrap();
            let (best, best_logit) = expected.top[0];
            n_positions += 1;
            if ours == best {
                n_same_top1 += 1;
            } else {
                let theirs_for_ours = expected.top.iter().find(|(token, _)| *token == ours);
                assert!(
                    theirs_for_ours.is_some_and(|&(_, logit)| best_logit - logit < NEAR_TIE),
                    "{id} {} position {row}: our top-1 {ours} is not a near-tie of llama.cpp's \
                     {best} ({:?})",
                    case.name,
                    &expected.top[..3]
                );
            }
            for &(token, logit) in &expected.top {
                let diff = (row_values[token as usize] - logit).abs();
                max_abs_diff = max_abs_diff.max(diff);
                sum_abs_diff += f64::from(diff);
                n_compared += 1;
            }
        }
    }
    eprintln!(
        "{id}: top-1 equals llama.cpp's at {n_same_top1} of {n_positions} positions (the rest \
         are near-ties); top-10 logits differ by {:.3} on average, {max_abs_diff:.3} at most",
        sum_abs_diff / n_compared as f64
    );
    assert!(
        n_same_top1 as f64 >= 0.95 * n_positions as f64,
        "{id}: top-1 agrees at only {n_same_top1} of {n_positions} positions"
    );
    assert!(
        max_abs_diff < 4.0,
        "{id}: logits differ by up to {max_abs_diff}"
    );
}

#[test]
fn qwen_logits_match_llama_cpp() {
    compare_with_llama_cpp(QWEN);
}

#[test]
fn gemma_logits_match_llama_cpp() {
    compare_with_llama_cpp(GEMMA);
}

#[test]
fn smollm_logits_match_llama_cpp() {
    compare_with_llama_cpp(SMOLLM);
}

/// The f16 KV cache (`--cache-type f16`) against the default f32 one on each real model: K and
/// V rounded once as written, over a ~35-token prefill (the matrix-product attention) and 8
/// decode steps (the few-query kernel) fed the f32 cache's greedy tokens. Measured: max |Δlogit| 1.9% of the largest logit on
/// Qwen2.5-0.5B, 14.7% on Gemma-3-270M (its K reach 85 with 256-wide heads, so rounding moves
/// its sharp attention), and the f16 paths give exactly the f32 cache's logits when K and V are
/// rounded the same way before the write (checked by hand). The deviation is
/// printed; the bound is below what a wrong row, head or dtype gives (unrelated logits: order
/// 100%).
fn f16_cache_deviation(id: &str) {
    let Some((model, tokenizer, gguf)) = load(id) else {
        return;
    };
    let backend =
        pml_engine::device::Backend::on(&default_device()).with_kv_dtype(candle_core::DType::F16);
    let config = ModelConfig::from_gguf(&gguf).unwrap();
    let rounded = Model::from_source_on(config, &mut &gguf, WeightFormat::default(), &backend)
        .expect("model loads with an f16 cache");
    let prompt = tokenizer
        .encode(
            "The observatory on the ridge above Marlow was founded in 1921 by the astronomer \
             Edith Caldwell, who ground its first mirror by hand. Who founded it?",
            false,
        )
        .unwrap();
    let chosen = greedy(&model, &prompt, 8);
    let ours = prefill_then_decode(&rounded, &prompt, &chosen);
    let reference = prefill_then_decode(&model, &prompt, &chosen);
    let diff = pml_engine::testing::max_abs_diff(&ours, &reference);
    let scale = reference
        .abs()
        .and_then(|d| d.max_all())
        .and_then(|d| d.to_scalar::<f32>())
        .unwrap();
    println!(
        "{id}: f16 cache against f32, {} prefill + 8 decode rows: max |Δlogit| {diff:.3e} of \
         max |logit| {scale:.1} ({:.2e})",
        prompt.len(),
        diff / scale
    );
    assert!(diff / scale < 0.3, "{id}: f16 cache {diff} off of {scale}");
}

#[test]
fn f16_cache_stays_close_to_f32() {
    for id in [QWEN, GEMMA, SMOLLM] {
        f16_cache_deviation(id);
    }
}

/// The loader drops each tensor's mapped pages once it holds its own layout of them: the file
/// reads back the very same bytes afterwards (the pages fault in again from the file).
#[test]
fn a_loaded_files_released_tensors_read_back_the_same_bytes() {
    let Some(path) = fetched_model(QWEN) else {
        return;
    };
    let loaded = GgufFile::open(&path).expect("GGUF opens");
    let backend = pml_engine::device::Backend::on(&Device::Cpu);
    let _model =
        Model::from_gguf_on(&loaded, WeightFormat::Quantized, &backend, None).expect("model loads");
    let fresh = GgufFile::open(&path).expect("GGUF opens");
    for name in fresh.tensor_names() {
        let before = fresh.stored(name).expect("tensor reads");
        let after = loaded.stored(name).expect("tensor reads");
        assert!(before.bytes() == after.bytes(), "{name} changed");
    }
}
