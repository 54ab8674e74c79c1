//! Time to first token of a prompt that imports one large module, in mode `reuse` (spliced module
//! KV, only the question computed) and mode `full` (the same tokens prefilled from scratch), on a
//! real model with its default weight format. Compiles the schema first (reporting how long
//! encoding took), then alternates the two modes and prints each run and the minimum of each.
//!
//! `cargo run --release -p pml-runtime --example cached_ttft -- [MODEL_ID] [N_SENTENCES] [REPS]
//! [STORE_DIR]` — about 23 tokens per sentence with the default model; with STORE_DIR the store
//! persists, so a second invocation reuses the compiled module and its first `reuse` run reads it
//! from disk.
// An example's output is its report.
#![allow(clippy::print_stdout)]

use std::error::Error;
use std::time::Instant;

use pml_compiler::MemorySourceLoader;
use pml_engine::generation::SamplingParams;
use pml_models::{DEFAULT_MODEL_ID, model_path};
use pml_runtime::inference::{InferenceMode, Runtime, RuntimeOptions};
use pml_runtime::store::{DEFAULT_RAM_BUDGET_BYTES, StoreConfig};

const PLACES: [&str; 6] = [
    "Aldmoor",
    "Brenton Quay",
    "Cask Hollow",
    "Dunmere",
    "Elsby",
    "Fenwick",
];
const QUESTION: &str = "Which station logged the most rain, and on which day?";

fn main() -> Result<(), Box<dyn Error>> {
    let mut args = std::env::args().skip(1);
    let model_id = args.next().unwrap_or_else(|| DEFAULT_MODEL_ID.to_string());
    let n_sentences: usize = args.next().map_or(Ok(44), |n| n.parse())?;
    let reps: usize = args.next().map_or(Ok(3), |n| n.parse())?;
    let temporary = tempfile::TempDir::new()?;
    let store_root = args
        .next()
        .map_or_else(|| temporary.path().to_path_buf(), Into::into);

    let mut options = RuntimeOptions::from_env()?;
    options.store = StoreConfig::local(store_root, DEFAULT_RAM_BUDGET_BYTES);
    let started = Instant::now();
    let runtime = Runtime::load(&model_path(&model_id)?, &options)?;
    println!(
        "{model_id} {:?}: loaded in {:.1} s",
        options.weight_format,
        started.elapsed().as_secs_f64()
    );

    let document: String = (0..n_sentences)
        .map(|i| {
            format!(
                "Record {i}: the weather station at {} logged {} millimetres of rain on day {}. ",
                PLACES[i % PLACES.len()],
                (i * 37) % 91 + 3,
                (i * 11) % 28 + 1
            )
        })
        .collect();
    let schema_source = format!(
        "<schema name=\"rainfall\">\n<system>You answer questions about weather records.</system>\n\
         <user>\n<module name=\"records\">{document}</module>\n</user>\n</schema>"
    );
    let prompt_source =
        format!("<prompt schema=\"rainfall\"><records/><user>{QUESTION}</user></prompt>");

    let (schema, report) =
        runtime.compile(&schema_source, &MemorySourceLoader::new(), &mut |_| {})?;
    println!(
        "compile: {} units ({} encoded, {} reused), {} tokens encoded in {:.2} s",
        report.units.len(),
        report.n_encoded(),
        report.n_reused(),
        report.tokens_encoded(),
        report.elapsed.as_secs_f64()
    );

    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: 1,
        ..SamplingParams::default()
    };
    let mut best = [f64::INFINITY; 2];
    for rep in 0..reps {
        for (slot, mode) in [InferenceMode::Reuse, InferenceMode::Full]
            .into_iter()
            .enumerate()
        {
            let (_, stats) = runtime.run(&schema, &prompt_source, mode, &params, &mut |_| {})?;
            let ttft_ms = stats.time_to_first_token.as_secs_f64() * 1e3;
            best[slot] = best[slot].min(ttft_ms);
            println!("run {rep}: {stats}");
        }
    }
    println!(
        "min TTFT: reuse {:.0} ms, full {:.0} ms, speed-up {:.1}x",
        best[0],
        best[1],
        best[1] / best[0]
    );
    Ok(())
}
