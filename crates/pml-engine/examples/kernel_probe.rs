//! Projections of the default model multiplied by `M` rows of activations in each way the
//! engine can hold them: our quantized kernels on the blocks as stored (the default), a dense
//! f32 copy (gemm crate), and candle's quantized matmul on the same blocks. Prints milliseconds
//! and GFLOP/s per call for each row count: the figures behind `WeightFormat::Quantized`.
//!
//! `cargo run --release -p pml-engine --example kernel_probe -- [M,M,...] [TENSOR,...]`
//! (defaults: 1,4,16,64,512 and `blk.0.ffn_up`, `blk.0.ffn_down`, `blk.2.ffn_down`); set
//! `RAYON_NUM_THREADS=1` for one core.
// An example's output is its report.
#![allow(clippy::print_stdout)]

use std::error::Error;
use std::time::Instant;

use candle_core::quantized::QMatMul;
use candle_core::{Device, Module, Tensor};
use pml_engine::device::Backend;
use pml_engine::gguf::GgufFile;
use pml_engine::model::{Linear, MatrixRole, WeightFormat};
use pml_models::{DEFAULT_MODEL_ID, model_path};

const REPEATS: u32 = 5;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let sizes: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "1,4,16,64,512".to_string())
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let names: Vec<String> = args.next().map_or_else(
        || {
            ["blk.0.ffn_up", "blk.0.ffn_down", "blk.2.ffn_down"]
                .map(String::from)
                .to_vec()
        },
        |names| names.split(',').map(String::from).collect(),
    );
    let device = Device::Cpu;
    let gguf = GgufFile::open(model_path(DEFAULT_MODEL_ID)?)?;
    for name in names {
        let name = format!("{name}.weight");
        let stored = gguf.tensor(&name, &device)?;
        let (n, k) = stored.shape().dims2()?;
        println!("{name}: {n}×{k}, stored as {:?}", stored.dtype());
        let candle = QMatMul::from_qtensor(stored)?;
        let load = |format| {
            Linear::load(
                &mut &gguf,
                &name,
                None,
                MatrixRole::Projection,
                format,
                &Backend::on(&device),
            )
        };
        let ours = load(WeightFormat::Quantized)?;
        let dense = load(WeightFormat::F32)?;
        for &m in &sizes {
            let x = Tensor::randn(0f32, 1.0, (m, k), &device)?;
            let flops = 2.0 * (m * n * k) as f64;
            let time = |call: &dyn Fn() -> Result<Tensor, Box<dyn Error>>| {
                call()?;
                let started = Instant::now();
                for _ in 0..REPEATS {
                    call()?;
                }
                let seconds = started.elapsed().as_secs_f64() / f64::from(REPEATS);
                Ok::<_, Box<dyn Error>>(format!(
                    "{:8.2} ms {:6.1} GFLOP/s",
                    seconds * 1e3,
                    flops / seconds / 1e9
                ))
            };
            let ours_time = time(&|| Ok(ours.forward(&x)?))?;
            let dense_time = time(&|| Ok(dense.forward(&x)?))?;
            let candle_time = time(&|| Ok(candle.forward(&x)?))?;
            println!("  M={m:4}: ours {ours_time} | f32 {dense_time} | candle {candle_time}");
        }
    }
    Ok(())
}
