//! Which tiers a store stacks and how each is bounded ([`StoreConfig`], [`TierConfig`]), and the
//! one parser of store specifications that `--store` and `PML_STORE` take ([`StoreConfig::parse`]):
//! a comma-separated list of
//! - `device[:SIZE]` — the model's device memory (a GPU's; on the CPU, host memory), a byte
//!   budget (default [`DEFAULT_DEVICE_BUDGET_BYTES`]): states moved there once, spliced from there
//!   with a copy inside the device;
//! - `ram[:SIZE]` — host RAM with a byte budget (`ram:0` turns it off);
//! - `disk[:PATH][?max=SIZE]` — the disk tier (default `$PML_HOME/store`), optionally bounded;
//! - `redis://HOST:PORT[/DB][?max=SIZE&timeout_ms=N&chunk=SIZE&cluster=1]` — a shared Redis
//!   server, or (`cluster=1`) a Redis Cluster reached through that seed node;
//! - a bare path — a disk tier there (what `--store DIR` always meant);
//! - `dtype:f16` (the default) or `dtype:f32` — the dtype every tier stores states in, not a tier:
//!   f32 keeps cached KV bit-exact at twice the bytes (see [`super::state`]).
//!
//! The device tier, where named, comes first; RAM next whether named or not (default budget [`DEFAULT_RAM_BUDGET_BYTES`]), then disk,
//! then Redis: tiers are ordered fastest first whatever order the list uses. Sizes are bytes with
//! an optional `KB`/`MB`/`GB` (powers of 1000) or `KiB`/`MiB`/`GiB` (powers of 1024) suffix.

use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::DType;

use super::StoreError;
use super::disk::DiskTier;
use super::redis::RedisConfig;
use super::state::DEFAULT_STATE_DTYPE;

/// Default RAM budget: 2 GiB holds about 170k tokens of the default model's KV in f16 (85k in f32).
pub const DEFAULT_RAM_BUDGET_BYTES: u64 = 2 << 30;

/// Default device budget: 1 GiB, a small part of a GPU's memory beside the model and its caches.
pub const DEFAULT_DEVICE_BUDGET_BYTES: u64 = 1 << 30;

/// Environment variable holding a store specification (overridden by `--store`).
pub const STORE_ENV: &str = "PML_STORE";

/// One tier of a store.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TierConfig {
    /// The model's device memory ([`super::MemoryTier::on_device`]).
    Device {
        budget_bytes: u64,
    },
    Ram {
        budget_bytes: u64,
    },
    Disk {
        root: PathBuf,
        budget_bytes: Option<u64>,
    },
    Redis(RedisConfig),
}

impl TierConfig {
    /// Position in the stack: faster tiers first.
    fn rank(&self) -> u8 {
        match self {
            TierConfig::Device { .. } => 0,
            TierConfig::Ram { .. } => 1,
            TierConfig::Disk { .. } => 2,
            TierConfig::Redis(_) => 3,
        }
    }

    fn kind(&self) -> &'static str {
        ["device", "ram", "disk", "redis"][usize::from(self.rank())]
    }
}

/// The tiers of a store, fastest first, and where its manifests live.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreConfig {
    /// Folder of the manifests: the disk tier's root when there is one.
    pub root: PathBuf,
    pub tiers: Vec<TierConfig>,
    /// The dtype states are stored in ([`super::StateSpec::state_dtype`]).
    pub state_dtype: DType,
}

impl StoreConfig {
    /// RAM (`ram_budget_bytes`) over disk at `root`: the default layout.
    pub fn local(root: impl Into<PathBuf>, ram_budget_bytes: u64) -> Self {
        let root = root.into();
        Self {
            tiers: vec![
                TierConfig::Ram {
                    budget_bytes: ram_budget_bytes,
                },
                TierConfig::Disk {
                    root: root.clone(),
                    budget_bytes: None,
                },
            ],
            root,
            state_dtype: DEFAULT_STATE_DTYPE,
        }
    }

    /// The same tiers storing states in `state_dtype`.
    pub fn with_state_dtype(self, state_dtype: DType) -> Self {
        Self {
            state_dtype,
            ..self
        }
    }

    /// `$PML_STORE` if set, else RAM over disk at `$PML_HOME/store`.
    pub fn from_env() -> Result<Self, StoreError> {
        match std::env::var(STORE_ENV) {
            Ok(spec) if !spec.trim().is_empty() => Self::parse(&spec, &DiskTier::default_root()?),
            _ => Ok(Self::local(
                DiskTier::default_root()?,
                DEFAULT_RAM_BUDGET_BYTES,
            )),
        }
    }

    /// Parses a store specification (see the module documentation); `default_root` is the disk
    /// tier's folder when `disk` names none, and the manifests' folder when there is no disk tier.
    pub fn parse(spec: &str, default_root: &Path) -> Result<Self, StoreError> {
        let mut tiers: Vec<TierConfig> = Vec::new();
        let mut state_dtype = None;
        for item in spec
            .split(',')
            .map(str::trim)
            .filter(|item| !item.is_empty())
        {
            if let Some(name) = item.strip_prefix("dtype:") {
                let dtype = match name {
                    "f16" => DType::F16,
                    "f32" => DType::F32,
                    other => {
                        return Err(invalid(
                            item,
                            &format!("states are stored as `f16` or `f32`, not `{other}`"),
                        ));
                    }
                };
                if state_dtype.replace(dtype).is_some() {
                    return Err(invalid(spec, "it names two dtypes"));
                }
                continue;
            }
            let tier = parse_tier(item, default_root)?;
            if tiers.iter().any(|other| other.rank() == tier.rank()) {
                return Err(invalid(
                    spec,
                    &format!("it names two {} tiers", tier.kind()),
                ));
            }
            tiers.push(tier);
        }
        if tiers.is_empty() {
            return Err(invalid(spec, "it names no tier"));
        }
        if !tiers
            .iter()
            .any(|tier| matches!(tier, TierConfig::Ram { .. }))
        {
            tiers.push(TierConfig::Ram {
                budget_bytes: DEFAULT_RAM_BUDGET_BYTES,
            });
        }
        tiers.retain(|tier| {
            !matches!(
                tier,
                TierConfig::Ram { budget_bytes: 0 } | TierConfig::Device { budget_bytes: 0 }
            )
        });
        tiers.sort_by_key(TierConfig::rank);
        let root = tiers
            .iter()
            .find_map(|tier| match tier {
                TierConfig::Disk { root, .. } => Some(root.clone()),
                _ => None,
            })
            .unwrap_or_else(|| default_root.to_path_buf());
        Ok(Self {
            root,
            tiers,
            state_dtype: state_dtype.unwrap_or(DEFAULT_STATE_DTYPE),
        })
    }
}

fn parse_tier(item: &str, default_root: &Path) -> Result<TierConfig, StoreError> {
    if item == "device" {
        return Ok(TierConfig::Device {
            budget_bytes: DEFAULT_DEVICE_BUDGET_BYTES,
        });
    }
    if let Some(size) = item.strip_prefix("device:") {
        return Ok(TierConfig::Device {
            budget_bytes: parse_size(size).map_err(|error| invalid(item, &error.to_string()))?,
        });
    }
    if item == "ram" {
        return Ok(TierConfig::Ram {
            budget_bytes: DEFAULT_RAM_BUDGET_BYTES,
        });
    }
    if let Some(size) = item.strip_prefix("ram:") {
        return Ok(TierConfig::Ram {
            budget_bytes: parse_size(size).map_err(|error| invalid(item, &error.to_string()))?,
        });
    }
    if item.starts_with("redis://") || item.starts_with("rediss://") {
        return parse_redis(item);
    }
    if item.contains("://") {
        return Err(invalid(item, "the only remote tier is `redis://HOST:PORT`"));
    }
    let (location, query) = item.split_once('?').unwrap_or((item, ""));
    let path = match location {
        "disk" => default_root.to_path_buf(),
        _ => PathBuf::from(location.strip_prefix("disk:").unwrap_or(location)),
    };
    let mut budget_bytes = None;
    for (name, value) in query_pairs(query) {
        match name {
            "max" => {
                budget_bytes =
                    Some(parse_size(value).map_err(|error| invalid(item, &error.to_string()))?)
            }
            other => {
                return Err(invalid(
                    item,
                    &format!("unknown disk option `{other}` (expected `max`)"),
                ));
            }
        }
    }
    Ok(TierConfig::Disk {
        root: path,
        budget_bytes,
    })
}

/// A `redis://` item: our options are taken out of the query, the rest is the client's URL.
fn parse_redis(item: &str) -> Result<TierConfig, StoreError> {
    let (base, query) = item.split_once('?').unwrap_or((item, ""));
    let mut config = RedisConfig::new(base);
    let mut passed_on = Vec::new();
    for (name, value) in query_pairs(query) {
        let bad = |error: SizeError| invalid(item, &error.to_string());
        match name {
            "max" => config.budget_bytes = Some(parse_size(value).map_err(bad)?),
            "chunk" => {
                let bytes = parse_size(value).map_err(bad)?;
                config.chunk_bytes = usize::try_from(bytes)
                    .ok()
                    .filter(|&bytes| bytes > 0)
                    .ok_or_else(|| invalid(item, "the chunk size must be at least one byte"))?;
            }
            "cluster" => {
                config.cluster = match value {
                    "1" | "true" | "yes" => true,
                    "0" | "false" | "no" => false,
                    _ => return Err(invalid(item, &format!("`cluster={value}`: use 1 or 0"))),
                }
            }
            "timeout_ms" => {
                let millis: u64 = value
                    .parse()
                    .map_err(|_| invalid(item, &format!("`timeout_ms={value}` is not a number")))?;
                config.timeout = Duration::from_millis(millis.max(1));
            }
            _ => passed_on.push(format!("{name}={value}")),
        }
    }
    if !passed_on.is_empty() {
        config.url = format!("{base}?{}", passed_on.join("&"));
    }
    Ok(TierConfig::Redis(config))
}

fn query_pairs(query: &str) -> impl Iterator<Item = (&str, &str)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| pair.split_once('=').unwrap_or((pair, "")))
}

/// A size that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("`{0}` is not a size (e.g. `512MiB`, `2GB`, `1000000`)")]
    NotANumber(String),
    #[error("unknown size unit `{unit}` in `{text}` (use KB, MB, GB, KiB, MiB or GiB)")]
    UnknownUnit { unit: String, text: String },
}

/// `512MiB`, `2GB`, `1000`: a byte count.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(digits_end);
    let number: f64 = number
        .parse()
        .map_err(|_| SizeError::NotANumber(text.to_string()))?;
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1_000,
        "m" | "mb" => 1_000_000,
        "g" | "gb" => 1_000_000_000,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        other => {
            return Err(SizeError::UnknownUnit {
                unit: other.to_string(),
                text: text.to_string(),
            });
        }
    };
    Ok((number * scale as f64).round() as u64)
}

fn invalid(item: &str, reason: &str) -> StoreError {
    StoreError::InvalidSpec(format!("`{item}`: {reason}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(spec: &str) -> Result<StoreConfig, StoreError> {
        StoreConfig::parse(spec, Path::new("/home/store"))
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("1.5KiB"), Ok(1536));
        assert_eq!(parse_size("1000"), Ok(1000));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5 parsecs").is_err());
    }

    #[test]
    fn tiers_are_ordered_fastest_first_with_ram_by_default() {
        let config =
            parse("redis://127.0.0.1:6390?max=1GiB&timeout_ms=250, disk:/data/pml?max=10GB")
                .unwrap();
        assert_eq!(config.root, PathBuf::from("/data/pml"));
        let mut redis = RedisConfig::new("redis://127.0.0.1:6390");
        redis.budget_bytes = Some(1 << 30);
        redis.timeout = Duration::from_millis(250);
        assert_eq!(
            config.tiers,
            vec![
                TierConfig::Ram {
                    budget_bytes: DEFAULT_RAM_BUDGET_BYTES
                },
                TierConfig::Disk {
                    root: PathBuf::from("/data/pml"),
                    budget_bytes: Some(10_000_000_000)
                },
                TierConfig::Redis(redis),
            ]
        );
    }

    #[test]
    fn the_device_tier_comes_first() {
        let config = parse("disk, device:256MiB").unwrap();
        assert_eq!(
            config.tiers,
            vec![
                TierConfig::Device {
                    budget_bytes: 256 << 20
                },
                TierConfig::Ram {
                    budget_bytes: DEFAULT_RAM_BUDGET_BYTES
                },
                TierConfig::Disk {
                    root: PathBuf::from("/home/store"),
                    budget_bytes: None
                },
            ]
        );
        assert_eq!(
            parse("device,ram:0").unwrap().tiers,
            vec![TierConfig::Device {
                budget_bytes: DEFAULT_DEVICE_BUDGET_BYTES
            }]
        );
        assert_eq!(
            parse("device:0,ram:0,disk").unwrap().tiers.len(),
            1,
            "device:0 turns it off"
        );
        for spec in ["device:lots", "device,device:1MB"] {
            let error = parse(spec).expect_err(spec).to_string();
            assert!(error.contains("store"), "{spec}: {error}");
        }
    }

    #[test]
    fn cluster_is_our_option_not_the_clients() {
        let config = parse("ram:0,redis://h:7000?cluster=1&max=1MB").unwrap();
        let [TierConfig::Redis(redis)] = &config.tiers[..] else {
            panic!("{config:?}");
        };
        assert!(redis.cluster);
        assert_eq!(redis.url, "redis://h:7000");
        let error = parse("redis://h:7000?cluster=maybe").expect_err("bad flag");
        assert!(error.to_string().contains("cluster=maybe"), "{error}");
    }

    #[test]
    fn bare_path_is_a_disk_tier_and_ram_can_be_off() {
        assert_eq!(
            parse("/tmp/s").unwrap(),
            StoreConfig::local("/tmp/s", DEFAULT_RAM_BUDGET_BYTES)
        );
        let config = parse("ram:0,redis://h:1/2?protocol=resp3").unwrap();
        assert_eq!(config.root, PathBuf::from("/home/store"));
        assert!(
            matches!(&config.tiers[..], [TierConfig::Redis(redis)] if redis.url == "redis://h:1/2?protocol=resp3")
        );
        assert_eq!(
            parse("disk,ram:64MiB").unwrap(),
            StoreConfig::local("/home/store", 64 << 20)
        );
    }

    #[test]
    fn the_state_dtype_is_an_option_of_the_whole_store() {
        assert_eq!(parse("/tmp/s").unwrap().state_dtype, DType::F16);
        let exact = parse("dtype:f32, /tmp/s").unwrap();
        assert_eq!(
            exact,
            StoreConfig::local("/tmp/s", DEFAULT_RAM_BUDGET_BYTES).with_state_dtype(DType::F32)
        );
        assert_eq!(parse("ram,dtype:f16").unwrap().state_dtype, DType::F16);
        for spec in ["dtype:bf16,disk", "dtype:f32,dtype:f16,disk", "dtype:f32"] {
            let error = parse(spec).expect_err(spec).to_string();
            assert!(error.contains("store"), "{spec}: {error}");
        }
    }

    #[test]
    fn bad_specs_say_why() {
        for spec in [
            "",
            "ram:lots",
            "ram,ram:1MB",
            "s3://bucket",
            "disk:/x?size=1",
            "redis://h?chunk=0",
        ] {
            let error = parse(spec).expect_err(spec).to_string();
            assert!(error.contains("store"), "{spec}: {error}");
        }
    }
}
