//! `pml serve`: one long-running process that holds a model, accepts schemas and answers prompts
//! over HTTP (design §8, after mistral.rs's server / engine / model split).
//!
//! - [`engine`]: the one thread that owns the [`pml_runtime::inference::Runtime`]; requests
//!   arrive over channels, decode steps of all active requests are batched.
//! - [`api`]: the axum routes (OpenAI-compatible completions, schema upload, health, metrics);
//!   it parses and answers HTTP and never touches a tensor.
//! - [`connections`]: accepting connections and serving HTTP/1 on each (header deadline,
//!   half-closed clients, graceful shutdown).
//! - [`incident`]: internal failures, logged in full and answered with a number only.
//! - [`metrics`]: counters and histograms, rendered for Prometheus.
//! - [`playground`]: the page at `/`, its files built into the binary.
//! - [`saved_schemas`]: uploaded schemas kept as files, loaded again at start.
//! - [`server`]: binding, start, graceful shutdown.

pub mod api;
pub mod config;
pub mod connections;
pub mod engine;
pub mod incident;
pub mod metrics;
pub mod playground;
pub mod saved_schemas;
pub mod server;

pub use config::{CorsOrigins, ServerConfig};
pub use server::{ServerError, ServerHandle, start};
