//! Support for tests of the engine and of the layers above it. Test-only: it panics.

use candle_core::Tensor;

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
