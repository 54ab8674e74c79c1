//! One projection of the default model (`blk.0.ffn_up`, 4864×896) multiplied by `M` rows of
//! activations in each way the engine could hold it: dense f32, dense f16 (converted on the fly
//! by the gemm crate on CPUs without f16 arithmetic) and candle's Q8_0 / Q4_0 kernels. Prints
//! milliseconds and GFLOP/s per call; the figures behind the choice of
//! `WeightFormat::QuantizedAndF32`.
//!
//! `cargo run --release -p pml-runtime --example kernel_probe -- [M]` (default 512); set
//! `RAYON_NUM_THREADS=1` for one core.

use std::error::Error;
use std::time::Instant;

use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor};
use pml_runtime::gguf::GgufFile;
use pml_runtime::models::{DEFAULT_MODEL_ID, model_path};

const REPEATS: u32 = 5;

fn main() -> Result<(), Box<dyn Error>> {
    let m: usize = std::env::args().nth(1).map_or(Ok(512), |m| m.parse())?;
    let device = Device::Cpu;
    let gguf = GgufFile::open(model_path(DEFAULT_MODEL_ID)?)?;
    let stored = gguf.tensor("blk.0.ffn_up.weight", &device)?;
    let dense = stored.dequantize(&device)?;
    let (n, k) = dense.dims2()?;
    let x = Tensor::randn(0f32, 1.0, (m, k), &device)?;
    let flops = 2.0 * (m * n * k) as f64;
    println!("{m}×{k} by {k}×{n} (stored as {:?})", stored.dtype());
    let time = |label: &str, call: &dyn Fn() -> candle_core::Result<Tensor>| {
        call()?;
        let started = Instant::now();
        for _ in 0..REPEATS {
            call()?;
        }
        let seconds = started.elapsed().as_secs_f64() / f64::from(REPEATS);
        println!(
            "{label:>5}: {:8.2} ms, {:6.1} GFLOP/s",
            seconds * 1e3,
            flops / seconds / 1e9
        );
        candle_core::Result::Ok(())
    };
    let f32_t = dense.t()?;
    time("f32", &|| x.matmul(&f32_t))?;
    let f16_t = dense.to_dtype(DType::F16)?.t()?;
    time("f16", &|| {
        x.to_dtype(DType::F16)?.matmul(&f16_t)?.to_dtype(DType::F32)
    })?;
    for dtype in [GgmlDType::Q8_0, GgmlDType::Q4_0] {
        let quantized = QMatMul::from_qtensor(QTensor::quantize(&dense, dtype)?)?;
        time(&format!("{dtype:?}"), &|| quantized.forward(&x))?;
    }
    Ok(())
}
