//! Bounded load test of `pml serve` on loopback: starts a server in this process on the default
//! model, uploads a small schema, then runs the same streamed PML completions first from one
//! client, then from `--clients` concurrent clients, and prints failures, aggregate decode
//! throughput of both phases and their ratio, and time-to-first-token percentiles (measured by
//! the clients: request sent → first streamed token).
//!
//! With `--long-tokens N` (a bounded load test) it then measures what a long plain
//! prompt does to everyone else: the long prompt's TTFT alone; `--clients` clients at once, one
//! sending another long prompt and the others short PML prompts (their TTFT p95 against the long
//! prompt's alone); a prompt past the context (status and time); and a client that abandons a
//! long prompt after a second (the next short request's TTFT). Each long prompt is a different
//! slice of the benchmark document, so the prefix cache cannot serve one from another.
//!
//! `cargo run --release -p pml-server --example load_test -- [--clients 16] [--requests 4]
//!  [--max-tokens 32] [--max-batch 16] [--long-tokens 3000]`
//! (`--requests` is per client; the single-client phase runs `--requests * 2` requests.)
// An example's output is its report.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use pml_models::{DEFAULT_MODEL_ID, model_path};
use pml_runtime::inference::{Runtime, RuntimeOptions};
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
    /// Tokens (about) of the long prompts of the bounded phases; 0 skips them.
    long_tokens: usize,
}

/// Text the long prompts are cut from.
const DOCUMENT: &str = include_str!("../../pml-bench/data/bench-document.txt");
/// Characters per token of the document, about (for sizing the long prompts).
const CHARS_PER_TOKEN: usize = 4;

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        clients: 16,
        requests: 4,
        max_tokens: 32,
        max_batch: 16,
        long_tokens: 0,
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
            "--long-tokens" => options.long_tokens = number,
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
    let bounded_failures = if options.long_tokens > 0 {
        bounded_phases(&base, &options)?
    } else {
        0
    };
    server.shutdown()?;
    let failures = single.failures + many.failures + bounded_failures;
    if failures > 0 {
        return Err(format!("{failures} requests failed").into());
    }
    Ok(())
}

/// Slice `index` of the document, about `tokens` tokens long, as a chat prompt's body.
fn long_text(index: usize, tokens: usize) -> Result<String, String> {
    let chars = tokens * CHARS_PER_TOKEN;
    let text: String = DOCUMENT.chars().skip(index * chars).take(chars).collect();
    if text.len() < chars * 9 / 10 {
        return Err(format!(
            "the document is too short for slice {index} of {tokens} tokens"
        ));
    }
    Ok(format!("{text}\n\nIn one word: what is this text about?"))
}

/// The long-prompt phases; returns how many requests failed.
fn bounded_phases(base: &str, options: &Options) -> Result<usize, Box<dyn std::error::Error>> {
    let long = |index| long_text(index, options.long_tokens);
    let alone = stream_text(base, &long(0)?, 4)?;
    println!(
        "long prompt alone: {} prompt tokens, TTFT {:.0} ms",
        alone.prompt_tokens,
        alone.ttft.as_secs_f64() * 1e3
    );

    let second_long = long(1)?;
    let start = Instant::now();
    let (long_result, short_results) = std::thread::scope(|scope| {
        let long = scope.spawn(|| stream_text(base, &second_long, 4));
        // The short ones come just after the long one, as they would behind it in a queue.
        std::thread::sleep(Duration::from_millis(200));
        let shorts: Vec<_> = (1..options.clients)
            .map(|client| {
                scope.spawn(move || {
                    let question = QUESTIONS[client % QUESTIONS.len()];
                    let prompt = format!(r#"<prompt schema="notes"><notes/>{question}</prompt>"#);
                    stream_completion(base, &prompt, options.max_tokens)
                })
            })
            .collect();
        let shorts: Vec<Result<Sample, String>> = shorts
            .into_iter()
            .map(|handle| {
                handle
                    .join()
                    .unwrap_or_else(|_| Err("client panicked".into()))
            })
            .collect();
        (long.join(), shorts)
    });
    let wall = start.elapsed();
    let mut failures = short_results
        .iter()
        .filter(|result| result.is_err())
        .count();
    let phase = Phase {
        samples: short_results.into_iter().filter_map(Result::ok).collect(),
        failures,
        wall,
    };
    report(
        &format!("{} short clients beside a long prompt", options.clients - 1),
        &phase,
    );
    match long_result {
        Ok(Ok(sample)) => println!(
            "the long prompt among them: TTFT {:.0} ms",
            sample.ttft.as_secs_f64() * 1e3
        ),
        _ => {
            failures += 1;
            println!("the long prompt among them failed");
        }
    }
    if let Some(p95) = phase.percentile_ms(95.0) {
        println!(
            "short TTFT p95 / long prompt's TTFT alone: {:.3}x (target <= 0.25x)",
            p95 / (alone.ttft.as_secs_f64() * 1e3)
        );
    }

    let too_long = "word ".repeat(40_000);
    let sent = Instant::now();
    let status = match ureq::post(&format!("{base}/v1/completions"))
        .send_string(&json!({"prompt": too_long, "max_tokens": 4}).to_string())
    {
        Ok(response) => response.status(),
        Err(ureq::Error::Status(status, _)) => status,
        Err(error) => return Err(error.into()),
    };
    println!(
        "a prompt past the context: status {status} in {:.0} ms (target: 4xx in < 2000 ms)",
        sent.elapsed().as_secs_f64() * 1e3
    );

    let abandoned = long(2)?;
    abandon_after(base, &abandoned, Duration::from_secs(1))?;
    let next = stream_completion(
        base,
        r#"<prompt schema="notes"><notes/>When is the launch?</prompt>"#,
        4,
    )?;
    println!(
        "after a client abandoned a long prompt 1 s in: the next request's TTFT {:.0} ms",
        next.ttft.as_secs_f64() * 1e3
    );
    Ok(failures)
}

/// Sends a streamed chat for `text` on a raw connection and closes it after `after`, before
/// any answer: a client that gave up during the prefill.
fn abandon_after(
    base: &str,
    text: &str,
    after: Duration,
) -> Result<(), Box<dyn std::error::Error>> {
    use std::io::Write;
    let addr = base.trim_start_matches("http://");
    let body = json!({"max_tokens": 4, "stream": true,
        "messages": [{"role": "user", "content": text}]})
    .to_string();
    let mut stream = std::net::TcpStream::connect(addr)?;
    write!(
        stream,
        "POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    std::thread::sleep(after);
    stream.shutdown(std::net::Shutdown::Both)?;
    Ok(())
}

/// A streamed chat's TTFT and prompt size.
struct LongSample {
    ttft: Duration,
    prompt_tokens: usize,
}

fn stream_text(base: &str, text: &str, max_tokens: usize) -> Result<LongSample, String> {
    let body = json!({"max_tokens": max_tokens, "stream": true,
        "stream_options": {"include_usage": true},
        "messages": [{"role": "user", "content": text}]})
    .to_string();
    let (ttft, usage) = stream_events(base, "/v1/chat/completions", &body)?;
    Ok(LongSample {
        ttft,
        prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0) as usize,
    })
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
    /// The `p`th percentile of the clients' TTFTs, in milliseconds.
    fn percentile_ms(&self, p: f64) -> Option<f64> {
        let mut ttfts: Vec<f64> = self
            .samples
            .iter()
            .map(|sample| sample.ttft.as_secs_f64() * 1e3)
            .collect();
        ttfts.sort_by(f64::total_cmp);
        let rank = ((p / 100.0) * ttfts.len() as f64).ceil() as usize;
        ttfts.get(rank.clamp(1, ttfts.len().max(1)) - 1).copied()
    }

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
    let body = json!({"prompt": prompt, "max_tokens": max_tokens, "stream": true,
        "stream_options": {"include_usage": true}})
    .to_string();
    let (ttft, usage) = stream_events(base, "/v1/completions", &body)?;
    let tokens = usage["completion_tokens"]
        .as_u64()
        .ok_or("the usage chunk has no completion_tokens")?;
    Ok(Sample {
        ttft,
        tokens: tokens as usize,
    })
}

/// Posts a streamed request; the time to its first chunk and the usage of its last.
fn stream_events(base: &str, path: &str, body: &str) -> Result<(Duration, Value), String> {
    let sent = Instant::now();
    let response = ureq::post(&format!("{base}{path}"))
        .send_string(body)
        .map_err(|error| error.to_string())?;
    let mut ttft = None;
    let mut usage = None;
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
        if chunk["usage"].is_object() {
            usage = Some(chunk["usage"].clone());
        }
    }
    match (done, ttft, usage) {
        (true, Some(ttft), Some(usage)) => Ok((ttft, usage)),
        _ => Err("the stream ended without a usage chunk and [DONE]".to_string()),
    }
}

fn report(name: &str, phase: &Phase) {
    let tokens: usize = phase.samples.iter().map(|sample| sample.tokens).sum();
    println!(
        "{name}: {} requests ok, {} failed, {tokens} tokens in {:.1} s = {:.1} tok/s aggregate; \
         TTFT p50 {:.0} ms, p95 {:.0} ms",
        phase.samples.len(),
        phase.failures,
        phase.wall.as_secs_f64(),
        phase.throughput().unwrap_or(f64::NAN),
        phase.percentile_ms(50.0).unwrap_or(f64::NAN),
        phase.percentile_ms(95.0).unwrap_or(f64::NAN),
    );
}
