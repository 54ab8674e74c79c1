//! Tiny random models of every family (3 layers, d_model 64, vocabulary 256), built in
//! process from a seed so every run gets the same weights; they go through the same loader as
//! GGUF files, with Q5_0 and Q8_0 matrices like the real files so the quantized paths are
//! exercised too. Fast tests use them; nothing about them is meant to be a good language model.

use std::collections::HashMap;

use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::config::{Activation, Arch, LayerAttention, ModelConfig};
use super::weights::{TensorMap, WeightFormat};
use super::{EngineError, Model};
use crate::device::Backend;

/// Sliding window of the tiny Gemma's local layers: small, so tests can step past it.
pub const TINY_SLIDING_WINDOW: usize = 8;

/// The configuration of the tiny model of `arch`.
pub fn tiny_config(arch: Arch) -> ModelConfig {
    let n_layers = 3;
    match arch {
        Arch::Qwen2 => ModelConfig {
            arch,
            n_layers,
            d_model: 64,
            n_heads: 4,
            n_kv_heads: 2,
            head_dim: 16,
            ffn_dim: 128,
            vocab_size: 256,
            rms_norm_eps: 1e-6,
            attention_scale: 1.0 / 4.0,
            embedding_scale: None,
            final_logit_softcap: None,
            activation: Activation::Silu,
            qkv_bias: true,
            qk_norm: false,
            sandwich_norms: false,
            rope_pairs_adjacent: false,
            rope_frequency_factors: None,
            layers: vec![
                LayerAttention {
                    sliding_window: None,
                    rope_base: 10_000.0,
                    rope_position_scale: 1.0,
                };
                n_layers
            ],
        },
        Arch::Gemma3 => {
            // Two local layers, then a global one (Gemma 3's 5:1 pattern, shortened).
            let local = LayerAttention {
                sliding_window: Some(TINY_SLIDING_WINDOW),
                rope_base: 10_000.0,
                rope_position_scale: 1.0,
            };
            let global = LayerAttention {
                sliding_window: None,
                rope_base: 1_000_000.0,
                rope_position_scale: 1.0,
            };
            ModelConfig {
                arch,
                n_layers,
                d_model: 64,
                n_heads: 2,
                n_kv_heads: 1,
                head_dim: 32,
                ffn_dim: 128,
                vocab_size: 256,
                rms_norm_eps: 1e-6,
                attention_scale: 1.0 / 32f64.sqrt(),
                embedding_scale: Some(8.0),
                final_logit_softcap: Some(30.0),
                activation: Activation::GeluTanh,
                qkv_bias: false,
                qk_norm: true,
                sandwich_norms: true,
                rope_pairs_adjacent: false,
                rope_frequency_factors: None,
                layers: vec![local, local, global],
            }
        }
        // Llama 3.1's shape: adjacent-pair Q/K rows and scaled RoPE frequencies.
        Arch::Llama => ModelConfig {
            arch,
            qkv_bias: false,
            rope_pairs_adjacent: true,
            rope_frequency_factors: Some(vec![1.0, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0]),
            ..tiny_config(Arch::Qwen2)
        },
        Arch::Qwen3 => ModelConfig {
            arch,
            qkv_bias: false,
            qk_norm: true,
            ..tiny_config(Arch::Qwen2)
        },
        Arch::Phi3 => ModelConfig {
            arch,
            qkv_bias: false,
            ..tiny_config(Arch::Qwen2)
        },
    }
}

/// Random weights for `config`, named as in a GGUF file.
pub fn tiny_weights(
    config: &ModelConfig,
    seed: u64,
    device: &Device,
) -> Result<TensorMap, EngineError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tensors = TensorMap::default();
    let mut add = |name: String, tensor: QTensor| {
        tensors.0.insert(name, tensor);
    };
    let d_model = config.d_model;
    let q_width = config.n_heads * config.head_dim;
    let kv_width = config.n_kv_heads * config.head_dim;

    // Embeddings of unit scale after the family's embedding scale.
    let embedding_std = 1.0 / config.embedding_scale.unwrap_or(1.0);
    add(
        "token_embd.weight".into(),
        matrix(
            &mut rng,
            config.vocab_size,
            d_model,
            embedding_std,
            GgmlDType::Q8_0,
            device,
        )?,
    );
    add(
        "output_norm.weight".into(),
        norm(&mut rng, d_model, device)?,
    );
    for layer_idx in 0..config.n_layers {
        let name = |tensor: &str| format!("blk.{layer_idx}.{tensor}");
        let fan_in = |width: usize| 1.0 / (width as f64).sqrt();
        // Block types as in the real Q4_K_M files, whose narrow matrices fall back to Q5_0.
        let projections = [
            ("attn_q", q_width, d_model, GgmlDType::Q5_0),
            ("attn_k", kv_width, d_model, GgmlDType::Q5_0),
            ("attn_v", kv_width, d_model, GgmlDType::Q8_0),
            ("attn_output", d_model, q_width, GgmlDType::Q5_0),
            ("ffn_gate", config.ffn_dim, d_model, GgmlDType::Q5_0),
            ("ffn_up", config.ffn_dim, d_model, GgmlDType::Q5_0),
            ("ffn_down", d_model, config.ffn_dim, GgmlDType::Q8_0),
        ];
        let mut dense = HashMap::new();
        for (tensor, rows, columns, block_type) in projections {
            let values = uniform(&mut rng, rows, columns, fan_in(columns), device)?;
            dense.insert(tensor, (values, block_type));
        }
        // Phi-3 files fuse Q, K, V into one matrix and the gate with the up projection.
        if config.arch == Arch::Phi3 {
            for (fused, parts, block_type) in [
                (
                    "attn_qkv",
                    ["attn_q", "attn_k", "attn_v"].as_slice(),
                    GgmlDType::Q8_0,
                ),
                ("ffn_up", ["ffn_gate", "ffn_up"].as_slice(), GgmlDType::Q5_0),
            ] {
                let parts = parts
                    .iter()
                    .map(|part| dense.remove(part).map(|(values, _)| values))
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| EngineError::MissingTensor(fused.to_string()))?;
                dense.insert(fused, (Tensor::cat(&parts, 0)?, block_type));
            }
        }
        for (tensor, (values, block_type)) in dense {
            add(
                name(&format!("{tensor}.weight")),
                QTensor::quantize(&values, block_type)?,
            );
        }
        if config.qkv_bias {
            for (tensor, width) in [
                ("attn_q", q_width),
                ("attn_k", kv_width),
                ("attn_v", kv_width),
            ] {
                let bias = vector(&mut rng, width, 0.0, 0.1, device)?;
                add(name(&format!("{tensor}.bias")), bias);
            }
        }
        let mut norms = vec![("attn_norm", d_model), ("ffn_norm", d_model)];
        if config.qk_norm {
            norms.extend([
                ("attn_q_norm", config.head_dim),
                ("attn_k_norm", config.head_dim),
            ]);
        }
        if config.sandwich_norms {
            norms.extend([("post_attention_norm", d_model), ("post_ffw_norm", d_model)]);
        }
        for (tensor, width) in norms {
            add(
                name(&format!("{tensor}.weight")),
                norm(&mut rng, width, device)?,
            );
        }
    }
    // Phi-3 keeps a separate LM head, which exercises the untied path.
    if config.arch == Arch::Phi3 {
        let head = matrix(
            &mut rng,
            config.vocab_size,
            d_model,
            1.0 / (d_model as f64).sqrt(),
            GgmlDType::Q8_0,
            device,
        )?;
        add("output.weight".into(), head);
    }
    Ok(tensors)
}

/// The tiny model of `arch` with weights from `seed`.
pub fn random_model(
    arch: Arch,
    seed: u64,
    format: WeightFormat,
    device: &Device,
) -> Result<Model, EngineError> {
    random_model_with(tiny_config(arch), seed, format, device)
}

/// [`random_model`] for any backend: the weights are drawn on the CPU, so every device and
/// both kernels get the same model from the same seed.
pub fn random_model_on(
    arch: Arch,
    seed: u64,
    format: WeightFormat,
    backend: &Backend,
) -> Result<Model, EngineError> {
    let config = tiny_config(arch);
    let mut tensors = tiny_weights(&config, seed, &Device::Cpu)?;
    Model::from_source_on(config, &mut tensors, format, backend)
}

/// A model of any `config` with random weights from `seed` (benchmarks build full-size ones).
pub fn random_model_with(
    config: ModelConfig,
    seed: u64,
    format: WeightFormat,
    device: &Device,
) -> Result<Model, EngineError> {
    let mut tensors = tiny_weights(&config, seed, device)?;
    Model::from_source(config, &mut tensors, format, device)
}

/// `config` with multi-head attention (one KV head per query head) and `vocab_size` tokens: the
/// same layers and widths, so a like-for-like model where K/V are as wide as the hidden states.
pub fn mha_variant(config: &ModelConfig, vocab_size: usize) -> ModelConfig {
    ModelConfig {
        n_kv_heads: config.n_heads,
        vocab_size,
        ..config.clone()
    }
}

/// Uniform entries with standard deviation `std`, stored in GGML blocks like a checkpoint.
fn matrix(
    rng: &mut ChaCha8Rng,
    rows: usize,
    columns: usize,
    std: f64,
    block_type: GgmlDType,
    device: &Device,
) -> Result<QTensor, EngineError> {
    let tensor = uniform(rng, rows, columns, std, device)?;
    Ok(QTensor::quantize(&tensor, block_type)?)
}

/// A `(rows, columns)` f32 matrix of uniform entries with standard deviation `std`.
fn uniform(
    rng: &mut ChaCha8Rng,
    rows: usize,
    columns: usize,
    std: f64,
    device: &Device,
) -> Result<Tensor, EngineError> {
    let half_width = std * 3f64.sqrt();
    let values: Vec<f32> = (0..rows * columns)
        .map(|_| rng.random_range(-half_width..half_width) as f32)
        .collect();
    Ok(Tensor::from_vec(values, (rows, columns), device)?)
}

fn vector(
    rng: &mut ChaCha8Rng,
    len: usize,
    center: f64,
    half_width: f64,
    device: &Device,
) -> Result<QTensor, EngineError> {
    let values: Vec<f32> = (0..len)
        .map(|_| (center + rng.random_range(-half_width..half_width)) as f32)
        .collect();
    let tensor = Tensor::from_vec(values, len, device)?;
    Ok(QTensor::quantize(&tensor, GgmlDType::F32)?)
}

/// Norm weights near 1 (as stored in GGUF, where Gemma's `1 +` is already folded in).
fn norm(rng: &mut ChaCha8Rng, len: usize, device: &Device) -> Result<QTensor, EngineError> {
    vector(rng, len, 1.0, 0.2, device)
}
