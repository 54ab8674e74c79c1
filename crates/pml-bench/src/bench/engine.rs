//! `pml bench engine`: prefill throughput, time to first token, decode time per token and peak
//! resident memory of PML's engine at several prompt sizes, side by side with llama.cpp on the
//! same GGUF and the same token ids when its venv is installed (scripts/setup-llama-cpp.sh).
//!
//! PML's decode is timed twice from the same prefill: first through `pml run`'s generation loop
//! ([`Generator::generate_after`] with the default sampling, detokenizer and stop matcher), as
//! the first decode of the process like `pml run`'s, then by the bare engine (a forward pass and
//! an argmax per token, what llama.cpp's side does) on a copy of the prompt's rows. A cost that
//! only the real run pays (per-token work in the loop, or one-time work landing in the first
//! decode step, which a short answer divides by few tokens) shows up as a gap between the two.
//!
//! Every measurement is a fresh process (this binary with a hidden `--child-tokens` argument, or
//! scripts/llama_engine_bench.py in the venv), so each size's peak memory (VmHWM) is its own and
//! neither engine inherits the other's warm caches. Rounds alternate which engine goes first.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use pml_commands::failure::Failure;
use pml_commands::model_fetch::{model_file, resolve_model};
use pml_commands::pipeline::{BackendArgs, WeightsArg};
use pml_engine::device::Backend;
use pml_engine::generation::{Generator, SamplingParams};
use pml_engine::gguf::GgufFile;
use pml_engine::kv_cache::KvCache;
use pml_engine::model::{Model, ModelConfig, WeightFormat};
use pml_engine::tokenizer::GgufTokenizer;
use pml_engine::{TokenizeError, Tokenizer};
use pml_models::PmlHome;

use super::engine_report::EngineReport;
use super::engine_rounds::{Measurement, SizeResult};
use super::report::print_report;

/// The llama.cpp side, embedded so the binary needs no checkout to find it.
const LLAMA_SCRIPT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../scripts/llama_engine_bench.py"
));

#[derive(Args, Debug)]
pub struct EngineArgs {
    /// Model: an id or alias, or a path to a GGUF file; the default model when absent.
    #[arg(long, short = 'm', value_name = "MODEL")]
    model: Option<String>,
    /// Prompt sizes, in tokens.
    #[arg(long, value_delimiter = ',', default_value = "512,2048,4096")]
    sizes: Vec<usize>,
    /// Rounds; each round measures every size once per engine.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    rounds: u16,
    /// Tokens decoded (greedily) after each prefill, by the bare engine and again by `pml run`'s
    /// generation loop.
    #[arg(long, default_value_t = 32)]
    decode: usize,
    /// How PML holds the weights.
    #[arg(long, value_enum, default_value_t = WeightsArg::default())]
    weights: WeightsArg,
    #[command(flatten)]
    backend: BackendArgs,
    /// Threads llama.cpp uses (default: the cores candle uses).
    #[arg(long)]
    llama_threads: Option<usize>,
    /// Measure PML only, even when llama.cpp is installed.
    #[arg(long)]
    no_llama: bool,
    /// Print the results as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Internal: measure PML once on the token ids in this JSON file and print the result.
    #[arg(long, hide = true, value_name = "FILE")]
    child_tokens: Option<PathBuf>,
}

pub fn run(args: EngineArgs) -> Result<(), Failure> {
    let choice = resolve_model(args.model.as_deref()).map_err(Failure::Usage)?;
    let model_path = model_file(&choice)?;
    if let Some(tokens_file) = &args.child_tokens {
        let backend = args.backend.select()?;
        let measurement = measure_pml(
            &model_path,
            args.weights.format(backend.device.is_cpu()),
            &backend,
            tokens_file,
            args.decode,
        )?;
        println!(
            "{}",
            serde_json::to_string(&measurement).context("writing JSON")?
        );
        return Ok(());
    }
    if args.sizes.is_empty() || args.sizes.contains(&0) {
        return Err(Failure::usage("`--sizes` needs positive prompt sizes"));
    }
    let llama = if args.no_llama {
        None
    } else {
        let llama = find_llama()?;
        if llama.is_none() {
            eprintln!(
                "llama.cpp is not installed (no venv with llama_cpp at {}): measuring PML only. \
                 Install it with scripts/setup-llama-cpp.sh for the side-by-side comparison.",
                llama_venv_python()?.display()
            );
        }
        llama
    };
    let llama_threads = args.llama_threads.unwrap_or_else(default_threads);
    let work = tempfile::Builder::new()
        .prefix("pml-bench-engine-")
        .tempdir()
        .context("creating a temporary folder for the token ids")?;
    let rounds = usize::from(args.rounds);
    let mut results: Vec<SizeResult> = args
        .sizes
        .iter()
        .map(|&size| SizeResult::new(size))
        .collect();
    for round in 0..rounds {
        for result in &mut results {
            let size = result.tokens;
            let tokens_file = work.path().join(format!("tokens-{size}.json"));
            write_tokens(&tokens_file, &bench_tokens(size))?;
            let llama_first = round % 2 == 1;
            let run_llama = |result: &mut SizeResult| -> Result<(), Failure> {
                if let Some(python) = &llama {
                    let measured = measure_llama(
                        python,
                        &model_path,
                        &tokens_file,
                        args.decode,
                        llama_threads,
                    )?;
                    progress(round, rounds, size, "llama.cpp", &measured);
                    result.llama.push(measured);
                }
                Ok(())
            };
            if llama_first {
                run_llama(result)?;
            }
            let measured = measure_pml_in_child(&args, &choice.argument(), &tokens_file)?;
            progress(round, rounds, size, "pml", &measured);
            result.pml.push(measured);
            if !llama_first {
                run_llama(result)?;
            }
        }
    }
    let report = EngineReport::new(
        &choice.id(),
        args.weights.format_for(&args.backend.choice()?),
        rounds,
        args.decode,
        llama.is_some().then_some(llama_threads),
        &results,
    );
    print_report(&report, args.json, EngineReport::table)?;
    Ok(())
}

fn progress(round: usize, rounds: usize, size: usize, engine: &str, measured: &Measurement) {
    let run_decode = measured
        .run_decode_ms_per_token
        .map(|ms| format!(" (run loop {ms:.1})"))
        .unwrap_or_default();
    eprintln!(
        "[round {}/{rounds}] {size} tokens, {engine}: prefill {:.1} tok/s, decode {:.1} \
         ms/token{run_decode}, peak {:.0} MiB",
        round + 1,
        size as f64 / measured.prefill_s,
        measured.decode_ms_per_token,
        measured.peak_rss_bytes as f64 / (1024.0 * 1024.0)
    );
}

/// Ordinary-text token ids valid in both models' vocabularies (away from the control tokens at
/// either end); speed does not depend on which tokens they are.
pub(super) fn bench_tokens(n: usize) -> Vec<u32> {
    (0..n as u32).map(|i| 1000 + (i * 7919) % 20_000).collect()
}

fn write_tokens(path: &Path, tokens: &[u32]) -> Result<(), Failure> {
    let json = serde_json::to_string(tokens).context("writing token ids")?;
    std::fs::write(path, json)
        .with_context(|| format!("writing token ids to {}", path.display()))?;
    Ok(())
}

fn read_tokens(path: &Path) -> Result<Vec<u32>, Failure> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading token ids from {}", path.display()))?;
    let tokens: Vec<u32> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON array of token ids", path.display()))?;
    if tokens.is_empty() {
        return Err(Failure::usage(format!(
            "{} holds no token ids",
            path.display()
        )));
    }
    Ok(tokens)
}

/// Cores candle's thread pools use, which llama.cpp gets too so the comparison is like for like.
pub(super) fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Runs this binary on one size in a fresh process.
fn measure_pml_in_child(
    args: &EngineArgs,
    model_id: &str,
    tokens_file: &Path,
) -> Result<Measurement, Failure> {
    let exe = std::env::current_exe().context("locating the pml binary")?;
    let weights = super::flag_value(&args.weights, "the weight format")?;
    let mut command = Command::new(exe);
    command
        .args([
            "bench",
            "engine",
            "--model",
            model_id,
            "--weights",
            &weights,
        ])
        .arg("--decode")
        .arg(args.decode.to_string())
        .arg("--child-tokens")
        .arg(tokens_file);
    let backend = args.backend.choice()?;
    command.arg("--device").arg(backend.device.to_string());
    if let Some(kernels) = backend.kernels {
        command.arg("--kernels").arg(kernels.name());
    }
    command.arg("--cache-type").arg(super::flag_value(
        &args.backend.cache_type,
        "the cache type",
    )?);
    run_measurement(command, "pml")
}

fn measure_llama(
    python: &Path,
    model_path: &Path,
    tokens_file: &Path,
    decode: usize,
    threads: usize,
) -> Result<Measurement, Failure> {
    let mut command = llama_script(python, LLAMA_SCRIPT, model_path, tokens_file, threads);
    command.arg("--decode").arg(decode.to_string());
    run_measurement(command, "llama.cpp")
}

/// `python -c SCRIPT --model MODEL --tokens TOKENS --threads N`: how both llama.cpp sides of the
/// benchmarks start.
pub fn llama_script(
    python: &Path,
    script: &str,
    model_path: &Path,
    tokens_file: &Path,
    threads: usize,
) -> Command {
    let mut command = Command::new(python);
    command
        .arg("-c")
        .arg(script)
        .arg("--model")
        .arg(model_path)
        .arg("--tokens")
        .arg(tokens_file)
        .arg("--threads")
        .arg(threads.to_string());
    command
}

/// Runs `command`, which prints one [`Measurement`] as the last line of its stdout.
fn run_measurement(mut command: Command, engine: &str) -> Result<Measurement, Failure> {
    let output = command
        .output()
        .with_context(|| format!("starting the {engine} measurement"))?;
    if !output.status.success() {
        return Err(Failure::Failed(anyhow::anyhow!(
            "the {engine} measurement failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout.lines().last().unwrap_or_default();
    Ok(serde_json::from_str(line)
        .with_context(|| format!("reading the {engine} measurement from `{line}`"))?)
}

/// Loads the model, prefills `tokens_file`'s ids and takes the greedy first token; then decodes
/// `decode` more twice from that prefill, timing each phase: first through `pml run`'s
/// generation loop (like `pml run`, the process's first decode, on the prefill's own cache),
/// then with the bare engine loop on a copy of the prompt's rows.
fn measure_pml(
    model_path: &Path,
    format: WeightFormat,
    backend: &Backend,
    tokens_file: &Path,
    decode: usize,
) -> Result<Measurement, Failure> {
    let tokens = read_tokens(tokens_file)?;
    let started = Instant::now();
    let gguf =
        GgufFile::open(model_path).with_context(|| format!("opening {}", model_path.display()))?;
    let config = ModelConfig::from_gguf(&gguf).context("reading the model configuration")?;
    let model = Model::from_source_on(config, &mut &gguf, format, backend)
        .with_context(|| format!("loading {}", model_path.display()))?;
    let load_s = started.elapsed().as_secs_f64();
    let tokenizer = GgufTokenizer::from_gguf(&gguf).context("building the tokenizer")?;

    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    if !model.device().is_cpu() {
        // A process's first calls on a GPU load candle's kernel modules and cuBLAS's handles:
        // a one-time cost of a server's start, not of a prefill. The same shapes, untimed.
        let mut warm = KvCache::with_capacity(model.kv_layout(), model.device(), tokens.len() + 2)
            .context("making the warm-up cache")?;
        model
            .forward(&tokens, &positions, &mut warm)
            .and_then(|_| model.forward(&tokens[..1], &[tokens.len() as u32], &mut warm))
            .context("warm-up")?;
    }
    // Room for the decoded tokens, as `pml run` reserves it, so no step copies the cache.
    let mut kv = KvCache::with_capacity(model.kv_layout(), model.device(), tokens.len() + decode)
        .context("making the KV cache")?;
    let started = Instant::now();
    let prefill_logits = model
        .forward(&tokens, &positions, &mut kv)
        .context("prefill")?;
    // A GPU runs the pass asynchronously: the prefill ends when its last kernel does.
    model.device().synchronize().context("synchronising")?;
    let prefill_s = started.elapsed().as_secs_f64();
    let first = greedy(&prefill_logits)?;
    let ttft_s = started.elapsed().as_secs_f64();
    // Taken now: appending the decoded rows never changes the prompt's.
    let prompt_rows = kv.slice(0..tokens.len()).context("copying the prefill")?;

    let run_decode_ms_per_token = run_loop_decode(
        &model,
        &tokenizer,
        &tokens,
        &mut kv,
        &prefill_logits,
        decode,
    )?;
    drop(kv);
    // The engine's own peak, before the second loop's copy of the prompt's rows exists.
    let peak_rss_bytes = peak_rss_bytes();

    let mut kv = KvCache::from_blocks(model.kv_layout(), model.device(), &[&prompt_rows], decode)
        .context("copying the prefill")?;
    drop(prompt_rows);
    let mut next = first;
    let started = Instant::now();
    for step in 0..decode {
        let position = (tokens.len() + step) as u32;
        let logits = model
            .forward(&[next], &[position], &mut kv)
            .context("decode")?;
        next = greedy(&logits)?;
    }
    let decode_ms_per_token = per_token_ms(started.elapsed(), decode);
    Ok(Measurement {
        load_s,
        prefill_s,
        ttft_s,
        decode_ms_per_token,
        run_decode_ms_per_token,
        peak_rss_bytes,
    })
}

/// Decodes `decode` tokens after the prefill in `kv` (whose last token's logits are
/// `prefill_logits`) through the generation loop `pml run` uses, with its default sampling
/// parameters, and returns its decode ms/token (`None` for no decode step). The answer text is
/// discarded: writing it is not part of the loop.
fn run_loop_decode(
    model: &Model,
    tokenizer: &dyn Tokenizer,
    prompt_tokens: &[u32],
    kv: &mut KvCache,
    prefill_logits: &candle_core::Tensor,
    decode: usize,
) -> Result<Option<f64>, Failure> {
    // The first token comes from the prefill's logits, then `decode` forward passes: the same
    // steps as the engine's loop.
    let params = SamplingParams {
        max_tokens: decode + 1,
        ..SamplingParams::default()
    };
    let tokenizer = NeverEnding(tokenizer);
    let generation = Generator::new(model, &tokenizer)
        .generate_after(kv, prompt_tokens, &params, &mut |_| {}, |_| {
            Ok(prefill_logits.clone())
        })
        .context("decoding through the generation loop")?;
    Ok(generation.timings.decode_ms_per_token())
}

/// A tokenizer with no end-of-turn token, so the generation loop decodes exactly as many tokens
/// as the engine's loop, whatever the synthetic prompt makes the model say.
struct NeverEnding<'t>(&'t dyn Tokenizer);

impl Tokenizer for NeverEnding<'_> {
    fn encode(&self, text: &str, allow_special: bool) -> Result<Vec<u32>, TokenizeError> {
        self.0.encode(text, allow_special)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        self.0.decode(ids)
    }

    fn bos_token(&self) -> Option<u32> {
        self.0.bos_token()
    }

    fn eos_tokens(&self) -> Vec<u32> {
        Vec::new()
    }

    fn vocab_size(&self) -> usize {
        self.0.vocab_size()
    }

    fn token_bytes(&self, id: u32) -> Option<pml_engine::tokenizer::TokenBytes> {
        self.0.token_bytes(id)
    }
}

fn greedy(logits: &candle_core::Tensor) -> Result<u32, Failure> {
    Ok(logits
        .argmax(0)
        .and_then(|token| token.to_scalar::<u32>())
        .context("picking the next token")?)
}

fn per_token_ms(elapsed: Duration, tokens: usize) -> f64 {
    elapsed.as_secs_f64() * 1e3 / tokens.max(1) as f64
}

/// `VmHWM` (peak resident set) of this process, 0 where /proc does not say.
fn peak_rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status.lines().find_map(|line| {
                let kib = line.strip_prefix("VmHWM:")?.trim().strip_suffix("kB")?;
                kib.trim().parse::<u64>().ok()
            })
        })
        .map_or(0, |kib| kib * 1024)
}

pub(super) fn llama_venv_python() -> Result<PathBuf, Failure> {
    let home = PmlHome::from_env().context("locating PML_HOME")?;
    Ok(home
        .root()
        .join("venv-llama-cpp")
        .join("bin")
        .join("python"))
}

/// The venv's interpreter when it imports `llama_cpp`.
pub(super) fn find_llama() -> Result<Option<PathBuf>, Failure> {
    let python = llama_venv_python()?;
    if !python.exists() {
        return Ok(None);
    }
    let imports = Command::new(&python)
        .args(["-c", "import llama_cpp, numpy"])
        .output()
        .is_ok_and(|output| output.status.success());
    Ok(imports.then_some(python))
}
