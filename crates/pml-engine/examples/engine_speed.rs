//! Rough engine speed on a real model: prefill tokens/s and decode ms/token per weight format,
//! plus resident memory. Not a benchmark harness, just figures to compare configurations.
//!
//! `cargo run --release -p pml-engine --example engine_speed -- [MODEL_ID] [FORMAT] [N_PREFILL]`
//! with FORMAT one of `quantized` (default), `f32`, `f16`, `bf16`, `quantized-and-f16`,
//! `quantized-and-f32`.
//!
//! Besides wall time it prints the process's CPU time: on a loaded machine candle's worker
//! threads spin at barriers and wall time says little, while with `RAYON_NUM_THREADS=1` the CPU
//! time is close to what one idle core would take.
// An example's output is its report.
#![allow(clippy::print_stdout)]

use std::error::Error;
use std::time::Instant;

use pml_engine::device::default_device;
use pml_engine::model::{Model, WeightFormat};
use pml_models::{DEFAULT_MODEL_ID, model_path};

const N_DECODE: usize = 32;

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let model_id = args.next().unwrap_or_else(|| DEFAULT_MODEL_ID.to_string());
    let format = match args.next().as_deref() {
        Some("quantized-and-f32") => WeightFormat::QuantizedAndF32,
        Some("quantized-and-f16") => WeightFormat::QuantizedAndF16,
        None | Some("quantized") => WeightFormat::Quantized,
        Some("f32") => WeightFormat::F32,
        Some("f16") => WeightFormat::F16,
        Some("bf16") => WeightFormat::Bf16,
        Some(other) => return Err(format!("unknown weight format `{other}`").into()),
    };
    let n_prefill: usize = args.next().map_or(Ok(512), |n| n.parse())?;

    let path = model_path(&model_id)?;
    let started = Instant::now();
    let model = Model::load(&path, format, &default_device())?;
    println!(
        "{model_id} {format:?}: loaded in {:.1} s, weights {:.0} MiB, resident {}",
        started.elapsed().as_secs_f64(),
        model.weights_size_in_bytes() as f64 / (1024.0 * 1024.0),
        resident_memory()
    );

    // Ordinary-text token ids (away from control tokens at either end of the vocabulary).
    let tokens: Vec<u32> = (0..n_prefill as u32)
        .map(|i| 1000 + (i * 7919) % 20_000)
        .collect();
    let positions: Vec<u32> = (0..n_prefill as u32).collect();
    let mut kv = model.new_kv_cache()?;
    let (started, cpu_started) = (Instant::now(), cpu_seconds());
    let mut logits = model.forward(&tokens, &positions, &mut kv)?;
    let prefill_seconds = started.elapsed().as_secs_f64();
    let prefill_cpu = cpu_seconds() - cpu_started;
    println!(
        "prefill {n_prefill} tokens: {prefill_seconds:.2} s wall ({:.1} tok/s), {prefill_cpu:.2} s \
         CPU ({:.1} tok/s per CPU-second)",
        n_prefill as f64 / prefill_seconds,
        n_prefill as f64 / prefill_cpu
    );

    let (started, cpu_started) = (Instant::now(), cpu_seconds());
    for step in 0..N_DECODE {
        let next = logits.argmax(0)?.to_scalar::<u32>()?;
        let position = (n_prefill + step) as u32;
        logits = model.forward(&[next], &[position], &mut kv)?;
    }
    let decode_seconds = started.elapsed().as_secs_f64();
    let decode_cpu = cpu_seconds() - cpu_started;
    println!(
        "decode {N_DECODE} tokens after {n_prefill}: {:.1} ms/token wall, {:.1} ms/token CPU; \
         resident {}",
        1000.0 * decode_seconds / N_DECODE as f64,
        1000.0 * decode_cpu / N_DECODE as f64,
        resident_memory()
    );
    Ok(())
}

/// User + system CPU time of this process so far (Linux; 0 where unavailable).
fn cpu_seconds() -> f64 {
    // Fields 14 and 15 of /proc/self/stat, after the parenthesised command name, in clock ticks
    // (100 per second on Linux).
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let ticks = |index: usize| {
        fields
            .get(index)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// `VmRSS` of this process as Linux reports it.
fn resident_memory() -> String {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|line| line.starts_with("VmRSS:"))
                .map(|line| line.trim_start_matches("VmRSS:").trim().to_string())
        })
        .unwrap_or_else(|| "unknown".to_string())
}
