//! Support for tests of the engine and of the layers above it. Test-only: it panics.

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, IndexOp, Tensor};

use crate::model::Arch;
use crate::model::tiny::{tiny_config, tiny_weights};

use crate::model::{ForwardContext, ForwardOptions, LogitRows, Model};

/// Largest absolute difference between two tensors of the same shape, element by element, in
/// f32 (so a stored f16 state compares with the engine's f32 rows).
///
/// # Panics
/// When the shapes differ or the difference cannot be computed.
pub fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
    assert_eq!(a.dims(), b.dims(), "shapes differ");
    let widen = |t: &Tensor| t.to_dtype(candle_core::DType::F32);
    widen(a)
        .and_then(|a| widen(b).and_then(|b| a - b))
        .and_then(|d| d.abs())
        .and_then(|d| d.flatten_all())
        .and_then(|d| d.max(0))
        .and_then(|d| d.to_scalar::<f32>())
        .expect("difference computes")
}

/// The last position's logits of a full prefill of `ids` on a fresh cache, as f32.
///
/// # Panics
/// When the forward pass fails.
pub fn last_position_logits(model: &Model, ids: &[u32]) -> Vec<f32> {
    let mut kv = model.new_kv_cache().expect("cache");
    let context = ForwardContext::appending((0..ids.len() as u32).collect(), &kv);
    let options = ForwardOptions {
        logits: LogitRows::Last,
        keep_layer_inputs: false,
    };
    let logits = model
        .forward_with(ids, &context, &mut kv, &options)
        .expect("forward")
        .logits
        .expect("logits");
    let logits = match logits.rank() {
        2 => logits
            .i(logits.dim(0).expect("rows") - 1)
            .expect("last row"),
        _ => logits,
    };
    logits.to_vec1::<f32>().expect("logits")
}

/// Logits of every row of a prefill of `tokens` on a fresh cache, then of one decode step per
/// token of `chosen` (fed whatever the model's own logits say, so two models compared see the
/// same input), stacked on the host.
///
/// # Panics
/// When a forward pass fails.
pub fn prefill_then_decode(model: &Model, tokens: &[u32], chosen: &[u32]) -> Tensor {
    let mut kv = model.new_kv_cache().expect("cache");
    let context = ForwardContext::appending((0..tokens.len() as u32).collect(), &kv);
    let options = ForwardOptions {
        logits: LogitRows::All,
        keep_layer_inputs: false,
    };
    let mut rows = vec![
        model
            .forward_with(tokens, &context, &mut kv, &options)
            .expect("prefill")
            .logits
            .expect("logits")
            .to_device(&candle_core::Device::Cpu)
            .expect("to host"),
    ];
    for (step, &token) in chosen.iter().enumerate() {
        let position = (tokens.len() + step) as u32;
        let logits = model
            .forward(&[token], &[position], &mut kv)
            .expect("decode step")
            .to_device(&candle_core::Device::Cpu)
            .expect("to host");
        rows.push(logits.reshape((1, ())).expect("one row"));
    }
    Tensor::cat(&rows, 0).expect("rows stack")
}

/// Index of the largest of `values` (the greedy token of a row of logits).
///
/// # Panics
/// When `values` is empty.
pub fn argmax(values: &[f32]) -> usize {
    values
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(b.1))
        .map(|(index, _)| index)
        .expect("non-empty")
}

/// Writes the tiny model of `arch` (weights from seed 7) as a GGUF file with llama.cpp's
/// metadata keys and tensor names, its matrices as GGML blocks or (`f32`) dequantized.
pub fn write_tiny_gguf(arch: Arch, path: &std::path::Path, f32: bool) {
    write_tiny(arch, path, f32, 256, Vec::new());
}

/// Writes the tiny Qwen2 model (as [`write_tiny_gguf`]) with what a command needs to run it end
/// to end: a byte-level BPE tokenizer of one token per byte (token id = byte, GPT-2's printable
/// stand-ins, no merges; the longest token covers one byte), byte 0 as its end-of-sequence
/// token, a ChatML chat template, and a context of `context_length` positions.
pub fn write_tiny_chat_gguf(path: &std::path::Path, context_length: usize) {
    write_tiny_chat_gguf_ending_on(path, context_length, 0);
}

/// [`write_tiny_chat_gguf`] with byte `eos` as the end-of-sequence token: the seeded model's
/// first answer token (`\n`, byte 10) makes every answer empty.
pub fn write_tiny_chat_gguf_ending_on(path: &std::path::Path, context_length: usize, eos: u8) {
    // GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the others for the code
    // points from 256 up, in byte order.
    let printable = |byte: u8| matches!(byte, 33..=126 | 161..=172 | 174..=255);
    let mut next_stand_in = 256u32;
    let tokens: Vec<Value> = (0..=255u8)
        .map(|byte| {
            let code = if printable(byte) {
                u32::from(byte)
            } else {
                next_stand_in += 1;
                next_stand_in - 1
            };
            let stand_in = char::from_u32(code).expect("a stand-in character");
            Value::String(stand_in.to_string())
        })
        .collect();
    let template = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + \
                    message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if \
                    add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";
    let tokenizer = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".to_string(),
            Value::String("qwen2".into()),
        ),
        (
            "tokenizer.ggml.token_type".to_string(),
            Value::Array(vec![Value::I32(1); tokens.len()]),
        ),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
        (
            "tokenizer.ggml.merges".to_string(),
            Value::Array(Vec::new()),
        ),
        (
            "tokenizer.ggml.eos_token_id".to_string(),
            Value::U32(u32::from(eos)),
        ),
        (
            "tokenizer.chat_template".to_string(),
            Value::String(template.into()),
        ),
    ];
    write_tiny(Arch::Qwen2, path, false, context_length, tokenizer);
}

/// [`write_tiny_gguf`] with a context of `context_length` and `extra` metadata.
fn write_tiny(
    arch: Arch,
    path: &std::path::Path,
    f32: bool,
    context_length: usize,
    extra: Vec<(String, Value)>,
) {
    let config = tiny_config(arch);
    let mut tensors = tiny_weights(&config, 7, &Device::Cpu)
        .expect("tiny weights")
        .0;
    if f32 {
        for tensor in tensors.values_mut() {
            let dense = tensor.dequantize(&Device::Cpu).expect("dequantized");
            *tensor = QTensor::quantize(&dense, GgmlDType::F32).expect("f32");
        }
    }
    let name = arch.gguf_name();
    let key = |suffix: &str| format!("{name}.{suffix}");
    let u32_value = |value: usize| Value::U32(value as u32);
    let metadata = vec![
        (
            "general.architecture".to_string(),
            Value::String(name.into()),
        ),
        // candle's Qwen3 computes in f16 unless told f32 (0).
        ("general.dtype".to_string(), Value::U32(0)),
        (key("block_count"), u32_value(config.n_layers)),
        (key("embedding_length"), u32_value(config.d_model)),
        (key("feed_forward_length"), u32_value(config.ffn_dim)),
        (key("attention.head_count"), u32_value(config.n_heads)),
        (key("attention.head_count_kv"), u32_value(config.n_kv_heads)),
        (key("attention.key_length"), u32_value(config.head_dim)),
        (key("attention.value_length"), u32_value(config.head_dim)),
        (
            key("attention.layer_norm_rms_epsilon"),
            Value::F32(config.rms_norm_eps as f32),
        ),
        (
            key("rope.freq_base"),
            Value::F32(config.layers[0].rope_base as f32),
        ),
        (key("rope.dimension_count"), u32_value(config.head_dim)),
        (key("context_length"), u32_value(context_length)),
    ];
    let metadata: Vec<(String, Value)> = metadata.into_iter().chain(extra).collect();
    let metadata: Vec<(&str, &Value)> = metadata
        .iter()
        .map(|(key, value)| (key.as_str(), value))
        .collect();
    let mut names: Vec<&String> = tensors.keys().collect();
    names.sort();
    let tensors: Vec<(&str, &_)> = names
        .into_iter()
        .map(|name| (name.as_str(), &tensors[name]))
        .collect();
    let mut file = std::fs::File::create(path).expect("create");
    gguf_file::write(&mut file, &metadata, &tensors).expect("GGUF written");
}

/// One attention call on the candle path both ways: CUDA's flash-attention kernel (`None` where
/// it does not apply: off CUDA, an f32 cache, another head size) and the ops path (products in
/// the cache's dtype on CUDA). `queries` `(n, n_heads, head_dim)` f32, `keys`/`values`
/// `(n_keys, n_kv_heads, head_dim)` in the cache's dtype; each result `(n, n_heads * head_dim)`.
///
/// # Panics
/// When either path fails.
pub fn flash_and_ops_attention(call: pml_kernels::AttentionCall<'_>) -> (Option<Tensor>, Tensor) {
    pml_kernels::flash_and_ops(call).expect("attention computes")
}
