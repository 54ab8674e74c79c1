//! Support for tests of the engine and of the layers above it. Test-only: it panics.

use candle_core::{IndexOp, Tensor};

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
