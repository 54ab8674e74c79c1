//! Qwen3 and Phi-3 against an independent implementation: the tiny random model of each family
//! is written as a GGUF file with llama.cpp's metadata keys and tensor names (Phi-3's fused
//! `attn_qkv` and gate-up `ffn_up` as its converter writes them); candle-transformers'
//! `quantized_qwen3` / `quantized_phi3` and PML's loader read the same file, and their full
//! prefill logits must agree. No fetched model needed: these run in every CI.
//!
//! Qwen3's q/k norms, Phi-3's row splits, the untied LM head and RoPE's pairing are what a wrong
//! loader would get wrong; each of those moves the logits by far more than the tolerance.
// Reports each family's deviation from candle on stderr, beside the bound it is held to.
#![allow(clippy::print_stderr)]

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use pml_engine::model::{Arch, Model, WeightFormat};
use pml_engine::testing::{argmax, last_position_logits, write_tiny_gguf};

/// With the weights as stored (GGML blocks), candle quantizes activations for each product its
/// own way, PML its way: the two roundings move the logits apart by 0.5–2.2% of their largest
/// magnitude (Qwen3 0.23 of 42, Phi-3 0.06 of 2.8). Swapping Phi-3's gate and up halves moves
/// them by 68% (1.9 of 2.8).
const MAX_RELATIVE_DIFF_QUANTIZED: f32 = 0.03;
/// With the weights dequantized to F32 in the file, both compute in f32 throughout.
const MAX_RELATIVE_DIFF_F32: f32 = 1e-4;

const PROMPT: [u32; 12] = [1, 17, 200, 45, 45, 3, 99, 128, 7, 255, 64, 12];

fn candle_logits(arch: Arch, path: &std::path::Path) -> Vec<f32> {
    let device = Device::Cpu;
    let mut file = std::fs::File::open(path).expect("open");
    let content = gguf_file::Content::read(&mut file).expect("GGUF parses");
    let input = Tensor::new(&PROMPT, &device)
        .and_then(|input| input.unsqueeze(0))
        .expect("input");
    let logits = match arch {
        Arch::Qwen3 => {
            use candle_transformers::models::quantized_qwen3::ModelWeights;
            let mut model = ModelWeights::from_gguf(content, &mut file, &device).expect("loads");
            model.forward(&input, 0)
        }
        Arch::Phi3 => {
            use candle_transformers::models::quantized_phi3::ModelWeights;
            let mut model =
                ModelWeights::from_gguf(false, content, &mut file, &device).expect("loads");
            model.forward(&input, 0)
        }
        other => panic!("no candle oracle wired for {other:?}"),
    };
    logits
        .and_then(|logits| logits.flatten_all())
        .and_then(|logits| logits.to_vec1::<f32>())
        .expect("candle's logits")
}

fn pml_logits(path: &std::path::Path) -> Vec<f32> {
    let model = Model::load(path, WeightFormat::default(), &Device::Cpu).expect("PML loads it");
    last_position_logits(&model, &PROMPT)
}

fn agrees_with_candle(arch: Arch) {
    let dir = tempfile::tempdir().expect("temp dir");
    for (f32, tolerance) in [
        (true, MAX_RELATIVE_DIFF_F32),
        (false, MAX_RELATIVE_DIFF_QUANTIZED),
    ] {
        let path = dir
            .path()
            .join(format!("tiny-{}-{f32}.gguf", arch.gguf_name()));
        write_tiny_gguf(arch, &path, f32);
        let ours = pml_logits(&path);
        let theirs = candle_logits(arch, &path);
        assert_eq!(ours.len(), theirs.len(), "vocabulary sizes");
        let diff = ours
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        let spread = theirs.iter().fold(0f32, |m, v| m.max(v.abs()));
        eprintln!("{arch:?} (f32 weights: {f32}): max |Δlogit| {diff:.5} of {spread:.2}");
        assert!(spread > 1.0, "logits too flat to tell");
        assert!(
            diff < tolerance * spread,
            "{arch:?} (f32 weights: {f32}): logits differ by up to {diff} of {spread}"
        );
        if f32 {
            assert_eq!(
                argmax(&ours),
                argmax(&theirs),
                "{arch:?}: best tokens differ"
            );
        }
    }
}

#[test]
fn qwen3_matches_candle_transformers_quantized_qwen3() {
    agrees_with_candle(Arch::Qwen3);
}

#[test]
fn phi3_matches_candle_transformers_quantized_phi3() {
    agrees_with_candle(Arch::Phi3);
}

#[test]
fn a_phi3_file_with_long_rope_is_refused_by_name() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("tiny-phi3.gguf");
    write_tiny_gguf(Arch::Phi3, &path, false);
    // Append LongRoPE's factor tensor by rewriting the file with it.
    let mut file = std::fs::File::open(&path).expect("open");
    let content = gguf_file::Content::read(&mut file).expect("parses");
    let mut tensors = Vec::new();
    for name in content.tensor_infos.keys() {
        let tensor = content
            .tensor(&mut file, name, &Device::Cpu)
            .expect("tensor");
        tensors.push((name.clone(), tensor));
    }
    let factors = Tensor::ones(8, candle_core::DType::F32, &Device::Cpu).expect("factors");
    let factors = QTensor::quantize(&factors, GgmlDType::F32).expect("f32");
    tensors.push(("rope_factors_long.weight".to_string(), factors));
    let metadata: Vec<(&str, &Value)> = content
        .metadata
        .iter()
        .map(|(key, value)| (key.as_str(), value))
        .collect();
    let tensors: Vec<(&str, &_)> = tensors
        .iter()
        .map(|(name, tensor)| (name.as_str(), tensor))
        .collect();
    let long = dir.path().join("long.gguf");
    let mut out = std::fs::File::create(&long).expect("create");
    gguf_file::write(&mut out, &metadata, &tensors).expect("written");
    drop(out);
    let Err(error) = Model::load(&long, WeightFormat::default(), &Device::Cpu) else {
        panic!("a file with LongRoPE factors loaded");
    };
    assert!(
        error
            .to_string()
            .contains("LongRoPE (`rope_factors_long.weight`"),
        "{error}"
    );
}
