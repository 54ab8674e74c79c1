//! `pml bench store`: how long restoring a unit's state takes from each store tier (RAM, disk,
//! Redis) when it is kept as KV, as input hidden states, not at all (recompute), or in the
//! restore planner's per-layer mix, for the default model (GQA) and for a random-weight MHA
//! model of the same shape (K/V twice as wide as the hidden states); and the bytes stored per
//! token in each format.
//!
//! For each model and tier: the planner's costs (overlap efficiency included) are measured on
//! that tier (a probe), a unit of `--tokens` tokens is saved once per strategy into a store of
//! that tier alone, and restored `--runs` times into an empty cache (pipelined, layer by layer),
//! the strategies alternating within each run; the planner's row restores the plan the planner
//! chose, marked when it is a pure strategy's. Recompute touches no tier, so it is timed with the
//! first tier's runs only.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use pml_commands::failure::Failure;
use pml_commands::pipeline::{RuntimeArgs, WeightsArg, open_runtime};
use pml_engine::model::Model;
use pml_engine::model::tiny::{mha_variant, random_model_with};
use pml_runtime::restore::{
    ComputedUnit, DEFAULT_PROBE_TOKENS, LayerForm, RestoreCosts, RestorePlan, SavedUnit,
    compute_unit, measure_costs, plan_restore, restore_unit, save_unit,
};
use pml_runtime::store::{
    ContextHash, DiskTier, ManifestStore, MemoryTier, ModuleStore, RedisConfig, RedisTier,
    StateSpec, Tier,
};
use pml_testkit::redis_server::{RedisServer, try_start_redis};
use serde::Serialize;

use super::report::Spread;

/// Vocabulary of the random MHA model: restore never touches the output layer, so a small one
/// saves generating weights nobody reads.
const MHA_VOCAB: usize = 32_000;

#[derive(Args, Debug)]
pub struct StoreArgs {
    /// Model: an id or alias, or a path to a GGUF file; the default model when absent.
    #[arg(long, short = 'm', value_name = "MODEL")]
    model: Option<String>,
    /// Tokens of the restored unit.
    #[arg(long, default_value_t = 512)]
    tokens: usize,
    /// Restores timed per strategy and tier.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..))]
    runs: u16,
    /// Redis server of the Redis tier (default: a `redis-server` started for the run, if
    /// installed; else the tier is skipped).
    #[arg(long, value_name = "URL")]
    redis: Option<String>,
    /// Skip the random-weight MHA model.
    #[arg(long)]
    no_mha: bool,
    /// How the weights are held in memory.
    #[arg(long, value_enum, default_value_t = WeightsArg::QuantizedAndF16)]
    weights: WeightsArg,
    /// Print the results as JSON on stdout instead of a table.
    #[arg(long)]
    json: bool,
}

/// One timed strategy on one tier.
#[derive(Clone, Debug, Serialize)]
struct Row {
    model: String,
    tier: String,
    strategy: String,
    plan: String,
    /// For the planner's row: the pure strategy its plan is identical to, if any.
    same_as: Option<String>,
    restore: Spread,
    bytes_per_token: usize,
}

/// One model's rows and format sizes.
#[derive(Clone, Debug, Serialize)]
struct ModelResult {
    model: String,
    n_tokens: usize,
    kv_bytes_per_token: usize,
    hidden_bytes_per_token: usize,
    costs: Vec<(String, RestoreCosts)>,
    rows: Vec<Row>,
}

pub fn run(args: StoreArgs) -> Result<(), Failure> {
    let scratch = tempfile::Builder::new()
        .prefix("pml-bench-store-")
        .tempdir()
        .context("creating a temporary folder")?;
    let (redis_url, _server) = redis_for_bench(args.redis.clone());
    let opened = open_runtime(&RuntimeArgs {
        model: args.model.clone(),
        store: Some(scratch.path().join("runtime").display().to_string()),
        weights: args.weights,
        ..RuntimeArgs::default()
    })?;
    let mut results = Vec::new();
    let runtime_model = opened.runtime.model();
    let fingerprint = opened.runtime.store().spec().model_fingerprint.clone();
    results.push(bench_model(
        &format!("{} (GQA)", opened.id),
        runtime_model,
        &fingerprint,
        &args,
        scratch.path(),
        redis_url.as_deref(),
    )?);
    if !args.no_mha {
        eprintln!("building a random-weight MHA model of the same shape…");
        let config = mha_variant(runtime_model.config(), MHA_VOCAB);
        let mha = random_model_with(
            config,
            7,
            args.weights.format(runtime_model.device().is_cpu()),
            runtime_model.device(),
        )
        .context("building the MHA model")?;
        results.push(bench_model(
            "random MHA (same shape)",
            &mha,
            "random-mha-7",
            &args,
            scratch.path(),
            redis_url.as_deref(),
        )?);
    }
    if args.json {
        let json = serde_json::to_string_pretty(&results).context("serialising the results")?;
        println!("{json}");
    } else {
        print!("{}", table(&results));
    }
    Ok(())
}

/// `--redis`, else a server started for the run (kept alive by the returned guard), else none.
fn redis_for_bench(url: Option<String>) -> (Option<String>, Option<RedisServer>) {
    if url.is_some() {
        return (url, None);
    }
    match try_start_redis() {
        Ok(server) => (Some(server.url()), Some(server)),
        Err(reason) => {
            eprintln!("note: no Redis tier ({reason}); pass --redis URL to time one");
            (None, None)
        }
    }
}

fn bench_model(
    name: &str,
    model: &Model,
    fingerprint: &str,
    args: &StoreArgs,
    scratch: &std::path::Path,
    redis_url: Option<&str>,
) -> Result<ModelResult, Failure> {
    let config = model.config();
    let n_layers = config.n_layers;
    let spec = StateSpec::new(fingerprint, model.kv_layout());
    let dtype_bytes = spec.state_dtype.size_in_bytes();
    let kv_bytes = 2 * config.n_kv_heads * config.head_dim * dtype_bytes;
    let hidden_bytes = config.d_model * dtype_bytes;
    let vocab = config.vocab_size as u32;
    let unit_tokens: Vec<u32> = (0..args.tokens as u32)
        .map(|i| (i * 104_729 + 7) % vocab)
        .collect();
    let positions: Vec<u32> = (0..args.tokens as u32).collect();
    let computed = compute_unit(model, &unit_tokens, &positions).context("computing the unit")?;

    let mut result = ModelResult {
        model: name.to_string(),
        n_tokens: args.tokens,
        kv_bytes_per_token: kv_bytes * n_layers,
        hidden_bytes_per_token: hidden_bytes * n_layers,
        costs: Vec::new(),
        rows: Vec::new(),
    };
    let recompute_plan = RestorePlan::uniform(LayerForm::Recompute, n_layers);
    let mut tier_names = vec!["ram", "disk"];
    if redis_url.is_some() {
        tier_names.push("redis");
    }
    let mut recompute_times = None;
    for tier_name in tier_names {
        let open = |label: &str| -> Result<ModuleStore, Failure> {
            let dir = scratch.join(format!(
                "{}-{tier_name}-{label}",
                fingerprint_dir(fingerprint)
            ));
            let tier: Box<dyn Tier> = match tier_name {
                "ram" => Box::new(MemoryTier::new(u64::MAX)),
                "disk" => Box::new(DiskTier::open(&dir, spec.clone()).context("disk tier")?),
                _ => {
                    let url = redis_url.unwrap_or_default();
                    Box::new(
                        RedisTier::open(RedisConfig::new(url), spec.clone())
                            .context("redis tier")?,
                    )
                }
            };
            Ok(ModuleStore::with_tiers(
                spec.clone(),
                vec![tier],
                ManifestStore::new(&dir),
            ))
        };
        let probe_store = open("probe")?;
        eprintln!("{name}, {tier_name}: measuring restore costs…");
        let costs = measure_costs(
            model,
            &probe_store,
            probe_store.tiers()[0].as_ref(),
            DEFAULT_PROBE_TOKENS,
        )
        .context("measuring restore costs")?;
        result.costs.push((tier_name.to_string(), costs));
        let planned = plan_restore(&costs, n_layers);
        let pure = [
            ("kv", RestorePlan::uniform(LayerForm::Kv, n_layers)),
            ("hidden", RestorePlan::uniform(LayerForm::Hidden, n_layers)),
            ("recompute", recompute_plan.clone()),
        ];
        let same_as = pure
            .iter()
            .find(|(_, plan)| *plan == planned)
            .map(|(strategy, _)| strategy.to_string());
        let mut strategies: Vec<Timed> = Vec::with_capacity(pure.len() + 1);
        for (strategy, plan) in pure.into_iter().chain([("planner", planned)]) {
            // Recompute touches no tier: timed with the first tier's runs, reused after.
            if plan == recompute_plan && recompute_times.is_some() {
                continue;
            }
            let store = open(strategy)?;
            let unit = save(model, &store, &unit_tokens, &plan, &computed)?;
            strategies.push(Timed {
                strategy,
                store,
                unit,
                times: Vec::with_capacity(usize::from(args.runs)),
            });
        }
        // One untimed restore each first (cold page cache, first Redis connection), except
        // recompute, which touches no tier and costs seconds.
        for timed in &strategies {
            if timed.unit.plan != recompute_plan {
                restore_once(model, &timed.store, &timed.unit)?;
            }
        }
        // Strategies alternate within each run, starting one further along each time, so that
        // a burst of load on the machine, or what the previous restore left in the caches,
        // falls on all of them rather than on whichever happened to be timed then.
        let n_strategies = strategies.len();
        for run in 0..usize::from(args.runs) {
            for step in 0..n_strategies {
                let timed = &mut strategies[(run + step) % n_strategies];
                let elapsed = restore_once(model, &timed.store, &timed.unit)?;
                timed.times.push(elapsed);
            }
        }
        if let Some(timed) = strategies
            .iter()
            .find(|timed| timed.unit.plan == recompute_plan)
        {
            recompute_times = Some(timed.times.clone());
        }
        for strategy in ["kv", "hidden", "recompute", "planner"] {
            let (plan, times) = match strategies.iter().find(|timed| timed.strategy == strategy) {
                Some(timed) => (timed.unit.plan.clone(), timed.times.clone()),
                None => (
                    recompute_plan.clone(),
                    recompute_times.clone().unwrap_or_default(),
                ),
            };
            eprintln!(
                "{name}, {tier_name}, {strategy} ({plan}): {:.1} ms",
                median_ms(&times)
            );
            result.rows.push(Row {
                model: name.to_string(),
                tier: tier_name.to_string(),
                strategy: strategy.to_string(),
                plan: plan.to_string(),
                same_as: match strategy {
                    "planner" => same_as.clone(),
                    _ => None,
                },
                restore: Spread::of(&times).unwrap_or(Spread {
                    median_ms: 0.0,
                    min_ms: 0.0,
                    max_ms: 0.0,
                }),
                bytes_per_token: plan.bytes_per_token(kv_bytes, hidden_bytes),
            });
        }
    }
    Ok(result)
}

/// One strategy being timed on one tier: its store (holding the unit in its plan) and times.
struct Timed {
    strategy: &'static str,
    store: ModuleStore,
    unit: SavedUnit,
    times: Vec<Duration>,
}

/// Saves the unit in `plan` into `store`.
fn save(
    model: &Model,
    store: &ModuleStore,
    tokens: &[u32],
    plan: &RestorePlan,
    computed: &ComputedUnit,
) -> Result<SavedUnit, Failure> {
    let unit = SavedUnit {
        tokens: tokens.to_vec(),
        positions: (0..tokens.len() as u32).collect(),
        context: ContextHash::NONE,
        plan: plan.clone(),
    };
    save_unit(model, store, &unit, &computed.rows, &computed.layer_inputs)
        .context("saving the unit")?;
    Ok(unit)
}

/// One restore of `unit` from `store` into an empty cache.
fn restore_once(model: &Model, store: &ModuleStore, unit: &SavedUnit) -> Result<Duration, Failure> {
    let mut kv = model.new_kv_cache().context("cache")?;
    let report = restore_unit(model, store, unit, &mut kv).context("restoring the unit")?;
    if let Some(reason) = report.fallback {
        return Err(Failure::Failed(anyhow::anyhow!(
            "the {} restore fell back to recomputing: {reason}",
            unit.plan
        )));
    }
    Ok(report.elapsed)
}

fn median_ms(times: &[Duration]) -> f64 {
    Spread::of(times).map_or(0.0, |spread| spread.median_ms)
}

fn fingerprint_dir(fingerprint: &str) -> String {
    fingerprint
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(16)
        .collect()
}

/// The table for people: per model, per tier, each strategy's median (min–max) and bytes per
/// token, and how the planner compares with the better pure strategy.
fn table(results: &[ModelResult]) -> String {
    let mut out = String::new();
    for result in results {
        out.push_str(&format!(
            "\n{}: {} tokens restored; bytes per token: KV {}, hidden states {}\n",
            result.model, result.n_tokens, result.kv_bytes_per_token, result.hidden_bytes_per_token
        ));
        out.push_str(&format!(
            "{:<6} {:<10} {:>22} {:>12}  plan\n",
            "tier", "strategy", "restore ms med (min–max)", "bytes/token"
        ));
        for (tier, costs) in &result.costs {
            let rows: Vec<&Row> = result.rows.iter().filter(|row| row.tier == *tier).collect();
            out.push_str(&format!(
                "{tier:<6} costs per token-layer (µs): load KV {:.2}, load hidden {:.2}, \
                 project {:.2}, recompute {:.2}; overlap η {:.2}\n",
                costs.io_kv * 1e6,
                costs.io_hidden * 1e6,
                costs.compute_hidden * 1e6,
                costs.compute_token * 1e6,
                costs.overlap
            ));
            for row in &rows {
                out.push_str(&format!(
                    "{:<6} {:<10} {:>22} {:>12}  {}\n",
                    row.tier,
                    row.strategy,
                    format!(
                        "{:.1} ({:.1}–{:.1})",
                        row.restore.median_ms, row.restore.min_ms, row.restore.max_ms
                    ),
                    row.bytes_per_token,
                    match &row.same_as {
                        Some(pure) => format!("{} (= {pure})", row.plan),
                        None => row.plan.clone(),
                    }
                ));
            }
            let pure: Vec<&&Row> = rows
                .iter()
                .filter(|row| row.strategy != "planner")
                .collect();
            let best = |of: fn(&Spread) -> f64| {
                pure.iter()
                    .map(|row| of(&row.restore))
                    .fold(f64::INFINITY, f64::min)
            };
            if let Some(planner) = rows.iter().find(|row| row.strategy == "planner") {
                out.push_str(&format!(
                    "{:<6} planner / best pure strategy: median {:.2}, min {:.2}{}\n",
                    tier,
                    planner.restore.median_ms / best(|spread| spread.median_ms),
                    planner.restore.min_ms / best(|spread| spread.min_ms),
                    match &planner.same_as {
                        Some(pure) => format!(" (same plan as {pure}: any gap is noise)"),
                        None => String::new(),
                    }
                ));
            }
        }
    }
    out
}
