//! Model configuration: the architecture family and every hyper-parameter the forward pass
//! needs, read from GGUF metadata (`<arch>.*` keys, as llama.cpp writes them) or built by hand
//! for the tiny test models.

use candle_core::quantized::gguf_file::Value;

use super::EngineError;
use crate::gguf::GgufFile;

/// The model families the engine implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Qwen2 / Qwen2.5: SwiGLU, RMSNorm, q/k/v biases, one RoPE base for every layer.
    Qwen2,
    /// Gemma 3: GELU-tanh MLP, q/k norms, sandwich norms, scaled embeddings, and local
    /// sliding-window layers interleaved with global ones, each with its own RoPE base.
    Gemma3,
    /// Llama 2/3.x, Mistral, SmolLM, TinyLlama: SwiGLU, RMSNorm, no biases; the GGUF's Q/K rows
    /// are in GGML's adjacent-pair RoPE layout, and Llama 3.1+ scales RoPE frequencies by
    /// `rope_freqs.weight`.
    Llama,
    /// Qwen3: Qwen2 without q/k/v biases, with an RMSNorm of each query and key head.
    Qwen3,
    /// Phi-3 (files without LongRoPE factors): Llama's layer with fused QKV and gate-up matrices
    /// (split at load) and NEOX RoPE. Like llama.cpp, the file's sliding window is not applied.
    Phi3,
}

impl Arch {
    /// Every family, for tests that run on each.
    pub const ALL: [Arch; 5] = [
        Arch::Qwen2,
        Arch::Gemma3,
        Arch::Llama,
        Arch::Qwen3,
        Arch::Phi3,
    ];

    /// The `general.architecture` string of a GGUF file.
    pub fn gguf_name(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Gemma3 => "gemma3",
            Arch::Llama => "llama",
            Arch::Qwen3 => "qwen3",
            Arch::Phi3 => "phi3",
        }
    }

    pub fn from_gguf_name(name: &str) -> Result<Self, EngineError> {
        match name {
            "qwen2" => Ok(Arch::Qwen2),
            "gemma3" => Ok(Arch::Gemma3),
            "llama" => Ok(Arch::Llama),
            "qwen3" => Ok(Arch::Qwen3),
            "phi3" => Ok(Arch::Phi3),
            other => Err(EngineError::UnsupportedArch(other.to_string())),
        }
    }
}

/// The MLP's gate activation (defined beside its kernel).
pub use pml_kernels::Activation;

/// What differs between the layers of one model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerAttention {
    /// A query at position `p` sees keys at positions `p - window + 1 ..= p` only.
    pub sliding_window: Option<usize>,
    pub rope_base: f64,
    /// RoPE rotates by `position * rope_position_scale` (linear scaling: `1 / factor`).
    pub rope_position_scale: f64,
}

/// Every hyper-parameter of the forward pass.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub n_layers: usize,
    pub d_model: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub ffn_dim: usize,
    pub vocab_size: usize,
    pub rms_norm_eps: f64,
    /// Multiplier of the attention logits (`1 / sqrt(query_pre_attn_scalar)`).
    pub attention_scale: f64,
    /// Multiplier of the token embeddings (Gemma: `sqrt(d_model)`).
    pub embedding_scale: Option<f64>,
    /// Final logits become `cap * tanh(logits / cap)`.
    pub final_logit_softcap: Option<f64>,
    pub activation: Activation,
    pub qkv_bias: bool,
    /// RMSNorm of each query and key head before RoPE.
    pub qk_norm: bool,
    /// RMSNorm of the attention and MLP outputs before their residual additions.
    pub sandwich_norms: bool,
    /// The file's `attn_q` / `attn_k` rows pair RoPE dimensions `2i, 2i + 1` (GGML's "normal"
    /// RoPE, as llama.cpp's converter permutes Llama's checkpoints); the loader reorders them to
    /// the NEOX pairing (`i, i + head_dim / 2`) the forward pass applies, so keys, cached states
    /// and RoPE re-rotation are the same for every family.
    pub rope_pairs_adjacent: bool,
    /// Divisors of each RoPE frequency (`head_dim / 2` of them: Llama 3.1's `rope_freqs.weight`,
    /// read with the weights), or `None`.
    pub rope_frequency_factors: Option<Vec<f64>>,
    /// One entry per layer.
    pub layers: Vec<LayerAttention>,
}

/// Gemma 3 alternates five local layers with one global layer unless the file says otherwise.
const GEMMA3_DEFAULT_SLIDING_PERIOD: usize = 6;
const GEMMA3_DEFAULT_LOCAL_ROPE_BASE: f64 = 10_000.0;

impl ModelConfig {
    /// Reads the configuration from a GGUF file's metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, EngineError> {
        let arch = Arch::from_gguf_name(gguf.architecture()?)?;
        let n_layers = gguf.block_count()?;
        let d_model = gguf.embedding_length()?;
        let head_dim = gguf.head_dim()?;
        let rope_base = gguf.rope_freq_base()?;
        let rope_position_scale = rope_position_scale(gguf)?;
        let vocab_size = gguf
            .tensor_info("token_embd.weight")
            .ok_or_else(|| EngineError::MissingTensor("token_embd.weight".to_string()))?
            .shape
            .dims()
            .first()
            .copied()
            .ok_or_else(|| EngineError::InvalidWeights("token_embd.weight has no rows".into()))?;
        let attention_scale = gguf
            .optional(&gguf.arch_key("attention.scale")?, GgufFile::get_f64)?
            .unwrap_or(1.0 / (head_dim as f64).sqrt());
        let final_logit_softcap = gguf
            .optional(
                &gguf.arch_key("final_logit_softcapping")?,
                GgufFile::get_f64,
            )?
            .filter(|&cap| cap > 0.0);
        let global_layer = LayerAttention {
            sliding_window: None,
            rope_base,
            rope_position_scale,
        };
        let common = ModelConfig {
            arch,
            n_layers,
            d_model,
            n_heads: gguf.head_count()?,
            n_kv_heads: gguf.head_count_kv()?,
            head_dim,
            ffn_dim: gguf.feed_forward_length()?,
            vocab_size,
            rms_norm_eps: gguf.rms_eps()?,
            attention_scale,
            embedding_scale: None,
            final_logit_softcap,
            activation: Activation::Silu,
            qkv_bias: false,
            qk_norm: false,
            sandwich_norms: false,
            rope_pairs_adjacent: false,
            rope_frequency_factors: None,
            layers: vec![global_layer; n_layers],
        };
        let config = match arch {
            Arch::Qwen2 => ModelConfig {
                qkv_bias: true,
                ..common
            },
            Arch::Qwen3 => ModelConfig {
                qk_norm: true,
                ..common
            },
            Arch::Llama => ModelConfig {
                rope_pairs_adjacent: true,
                ..common
            },
            Arch::Phi3 => common,
            Arch::Gemma3 => {
                let window_key = gguf.arch_key("attention.sliding_window")?;
                let window = gguf
                    .sliding_window()?
                    .ok_or(EngineError::MissingMetadata(window_key))?;
                // Rope scaling applies to the global layers only (HF and llama.cpp).
                let local_layer = LayerAttention {
                    sliding_window: Some(window),
                    rope_base: gguf
                        .rope_freq_base_swa()?
                        .unwrap_or(GEMMA3_DEFAULT_LOCAL_ROPE_BASE),
                    rope_position_scale: 1.0,
                };
                let layers = gemma3_local_layers(gguf, n_layers)?
                    .into_iter()
                    .map(|local| if local { local_layer } else { global_layer })
                    .collect();
                ModelConfig {
                    embedding_scale: Some((d_model as f64).sqrt()),
                    activation: Activation::GeluTanh,
                    qk_norm: true,
                    sandwich_norms: true,
                    layers,
                    ..common
                }
            }
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the relations the forward pass relies on.
    pub fn validate(&self) -> Result<(), EngineError> {
        let problem = if self.n_heads == 0 || self.n_kv_heads == 0 {
            Some("head counts must be positive".to_string())
        } else if !self.n_heads.is_multiple_of(self.n_kv_heads) {
            Some(format!(
                "{} query heads cannot share {} KV heads evenly",
                self.n_heads, self.n_kv_heads
            ))
        } else if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            Some(format!("head_dim {} must be even for RoPE", self.head_dim))
        } else if self.layers.len() != self.n_layers {
            Some(format!(
                "{} layer descriptions for {} layers",
                self.layers.len(),
                self.n_layers
            ))
        } else if self
            .layers
            .iter()
            .any(|layer| layer.sliding_window == Some(0))
        {
            Some("a sliding window of 0 would hide every token".to_string())
        } else if let Some(factors) = &self.rope_frequency_factors
            && (factors.len() != self.head_dim / 2
                || factors.iter().any(|f| f.is_nan() || *f <= 0.0))
        {
            Some(format!(
                "{} RoPE frequency factors for head_dim {} (want {} positive ones)",
                factors.len(),
                self.head_dim,
                self.head_dim / 2
            ))
        } else {
            None
        };
        match problem {
            Some(problem) => Err(EngineError::InvalidConfig(problem)),
            None => Ok(()),
        }
    }
}

/// Linear RoPE scaling stretches positions by `1 / factor`; other kinds are refused rather
/// than silently ignored.
fn rope_position_scale(gguf: &GgufFile) -> Result<f64, EngineError> {
    let kind_key = gguf.arch_key("rope.scaling.type")?;
    let kind = match gguf.get(&kind_key) {
        Some(_) => gguf.get_str(&kind_key)?,
        None => "none",
    };
    let factor = gguf
        .optional(&gguf.arch_key("rope.scaling.factor")?, GgufFile::get_f64)?
        .filter(|&factor| factor > 0.0);
    match (kind, factor) {
        ("none", _) | (_, None) => Ok(1.0),
        ("linear", Some(factor)) => Ok(1.0 / factor),
        (other, Some(_)) => Err(EngineError::InvalidConfig(format!(
            "RoPE scaling `{other}` is not supported"
        ))),
    }
}

/// Which Gemma 3 layers are local: from `attention.sliding_window_pattern` (a period, or one
/// flag per layer) when present, else llama.cpp's default of five local layers then a global one.
fn gemma3_local_layers(gguf: &GgufFile, n_layers: usize) -> Result<Vec<bool>, EngineError> {
    let key = gguf.arch_key("attention.sliding_window_pattern")?;
    let by_period = |period: usize| (0..n_layers).map(|il| (il + 1) % period != 0).collect();
    match gguf.get(&key) {
        None => Ok(by_period(GEMMA3_DEFAULT_SLIDING_PERIOD)),
        Some(Value::Array(flags)) => {
            let flags = flags
                .iter()
                .map(|flag| flag.to_bool())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| EngineError::metadata(&key, err))?;
            if flags.len() != n_layers {
                return Err(EngineError::metadata(
                    &key,
                    format!("{} flags for {n_layers} layers", flags.len()),
                ));
            }
            Ok(flags)
        }
        Some(_) => match gguf.get_usize(&key)? {
            0 => Err(EngineError::metadata(&key, "period 0")),
            period => Ok(by_period(period)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_reads_back_and_an_unknown_one_lists_them_all() {
        for arch in Arch::ALL {
            assert_eq!(Arch::from_gguf_name(arch.gguf_name()).ok(), Some(arch));
        }
        let error = Arch::from_gguf_name("mamba").expect_err("not supported");
        let message = error.to_string();
        assert!(message.contains("mamba"), "{message}");
        for arch in Arch::ALL {
            assert!(message.contains(arch.gguf_name()), "{message}");
        }
    }
}
