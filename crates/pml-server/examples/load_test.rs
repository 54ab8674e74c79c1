//! Bounded load test of `pml serve` on loopback: starts a server in this process on the default
//! model, uploads a small schema, then runs the same streamed PML completions first from one
//! client, then from `--clients` concurrent clients, and prints failures, aggregate decode
//! throughput of both phases and their ratio, and time-to-first-token percentiles (measured by
//! the clients: request sent → first streamed token).
//!
//! `cargo run --release -p pml-server --example load_test -- [--clients 16] [--requests 4]
//!  [--max-tokens 32] [--max-batch 16] [--weights quantized-and-f16]`
//! (`--requests` is per client; the single-client phase runs `--requests * 2` requests.)

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pml_runtime::inference::{Runtime, RuntimeOptions};
use pml_runtime::models::{DEFAULT_MODEL_ID, model_path};
use pml_runtime::store::{DEFAULT_RAM_BUDGET_BYTES, StoreConfig};
use pml_server::ServerConfig;
use serde_json::{Value, json};

const SCHEMA: &str = r#"<schema name="notes">
  <system>You answer questions about the notes below in one short sentence.</system>
  <user>
    <module name="notes">Meeting notes: the launch moved from Monday to Thursday because the
    load tests failed twice. Ana owns the rollback plan; Ben books the room; slides are due
    Wednesday noon. Budget is unchanged.</module>
  </user>
</schema>"#;

const QUESTIONS: [&str; 4] = [
    "When is the launch?",
    "Who owns the rollback plan?",
    "When are the slides due?",
    "Why did the launch move?",
];

struct Options {
    clients: usize,
    requests: usize,
    max_tokens: usize,
    max_batch: usize,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        clients: 16,
        requests: 4,
        max_tokens: 32,
        max_batch: 16,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let [flag, value] = pair else {
            return Err(format!("{pair:?}: expected `--flag value` pairs"));
        };
        let number: usize = value
            .parse()
            .map_err(|_| format!("{flag} {value}: not a number"))?;
        match flag.as_str() {
            "--clients" => options.clients = number,
            "--requests" => options.requests = number,
            "--max-tokens" => options.max_tokens = number,
            "--max-batch" => options.max_batch = number,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    Ok(options)
}

/// One streamed completion as its client saw it.
struct Sample {
    ttft: Duration,
    tokens: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let options = parse_options()?;
    let path = model_path(DEFAULT_MODEL_ID)?;
    let store = tempfile::TempDir::new()?;
    let mut runtime_options = RuntimeOptions::from_env()?;
    runtime_options.store = StoreConfig::local(store.path(), DEFAULT_RAM_BUDGET_BYTES);
    let runtime = Runtime::load(&path, &runtime_options)?;
    let config = ServerConfig {
        model_name: DEFAULT_MODEL_ID.to_string(),
        max_batch: options.max_batch,
        queue_capacity: 4 * options.clients,
        ..ServerConfig::default()
    };
    let server = pml_server::start(runtime, config, SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let base = format!("http://{}", server.addr());
    upload(&base)?;

    let single = run_phase(&base, 1, 2 * options.requests, options.max_tokens);
    let many = run_phase(&base, options.clients, options.requests, options.max_tokens);
    report("1 client", &single);
    report(&format!("{} clients", options.clients), &many);
    if let (Some(one), Some(all)) = (single.throughput(), many.throughput()) {
        println!("aggregate decode throughput ratio: {:.2}x", all / one);
    }
    server.shutdown()?;
    let failures = single.failures + many.failures;
    if failures > 0 {
        return Err(format!("{failures} requests failed").into());
    }
    Ok(())
}

fn upload(base: &str) -> Result<(), Box<dyn std::error::Error>> {
    ureq::post(&format!("{base}/v1/schemas")).send_string(SCHEMA)?;
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let info: Value = ureq::get(&format!("{base}/v1/schemas/notes"))
            .call()?
            .into_json()?;
        match info["status"].as_str() {
            Some("ready") => return Ok(()),
            Some("failed") => return Err(format!("compilation failed: {info}").into()),
            _ if Instant::now() > deadline => return Err("compilation timed out".into()),
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// What one phase measured.
struct Phase {
    samples: Vec<Sample>,
    failures: usize,
    wall: Duration,
}

impl Phase {
    /// Generated tokens per second of wall time, over all clients.
    fn throughput(&self) -> Option<f64> {
        let tokens: usize = self.samples.iter().map(|sample| sample.tokens).sum();
        (self.wall.as_secs_f64() > 0.0).then(|| tokens as f64 / self.wall.as_secs_f64())
    }
}

fn run_phase(base: &str, clients: usize, requests: usize, max_tokens: usize) -> Phase {
    let start = Instant::now();
    let results: Vec<Result<Sample, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..clients)
            .map(|client| {
                scope.spawn(move || {
                    (0..requests)
                        .map(|i| {
                            let question = QUESTIONS[(client + i) % QUESTIONS.len()];
                            let prompt =
                                format!(r#"<prompt schema="notes"><notes/>{question}</prompt>"#);
                            stream_completion(base, &prompt, max_tokens)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| vec![Err("client panicked".to_string())])
            })
            .collect()
    });
    let wall = start.elapsed();
    let failures = results.iter().filter(|result| result.is_err()).count();
    for error in results.iter().filter_map(|result| result.as_ref().err()) {
        eprintln!("failed: {error}");
    }
    Phase {
        samples: results.into_iter().filter_map(Result::ok).collect(),
        failures,
        wall,
    }
}

fn stream_completion(base: &str, prompt: &str, max_tokens: usize) -> Result<Sample, String> {
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "stream": true}).to_string();
    let sent = Instant::now();
    let response = ureq::post(&format!("{base}/v1/completions"))
        .send_string(&body)
        .map_err(|error| error.to_string())?;
    let mut ttft = None;
    let mut tokens = None;
    let mut done = false;
    for line in BufReader::new(response.into_reader()).lines() {
        let line = line.map_err(|error| error.to_string())?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            done = true;
            break;
        }
        let chunk: Value = serde_json::from_str(data).map_err(|error| error.to_string())?;
        if chunk.get("error").is_some() {
            return Err(chunk.to_string());
        }
        ttft.get_or_insert_with(|| sent.elapsed());
        if let Some(count) = chunk["usage"]["completion_tokens"].as_u64() {
            tokens = Some(count as usize);
        }
    }
    match (done, ttft, tokens) {
        (true, Some(ttft), Some(tokens)) => Ok(Sample { ttft, tokens }),
        _ => Err("the stream ended without a final chunk and [DONE]".to_string()),
    }
}

fn report(name: &str, phase: &Phase) {
    let mut ttfts: Vec<f64> = phase
        .samples
        .iter()
        .map(|sample| sample.ttft.as_secs_f64() * 1e3)
        .collect();
    ttfts.sort_by(f64::total_cmp);
    let percentile = |p: f64| -> f64 {
        if ttfts.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * ttfts.len() as f64).ceil() as usize;
        ttfts[rank.clamp(1, ttfts.len()) - 1]
    };
    let tokens: usize = phase.samples.iter().map(|sample| sample.tokens).sum();
    println!(
        "{name}: {} requests ok, {} failed, {tokens} tokens in {:.1} s = {:.1} tok/s aggregate; \
         TTFT p50 {:.0} ms, p95 {:.0} ms",
        phase.samples.len(),
        phase.failures,
        phase.wall.as_secs_f64(),
        phase.throughput().unwrap_or(f64::NAN),
        percentile(50.0),
        percentile(95.0),
    );
}
