//! Uploaded schemas on the engine's side. An upload is laid out at once, so its client hears of
//! errors in the answer; encoding its modules into the store can take minutes, so it waits in a
//! queue and the engine loop encodes one schema per step, reporting progress to the
//! [`SchemaRegistry`] the HTTP layer reads.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use pml_compiler::{FsSourceLoader, RefuseSources};
use pml_runtime::encode::EncodeEvent;
use pml_runtime::inference::{LaidOutSchema, Runtime};

use super::JobError;
use super::schemas::{SchemaInfo, SchemaRegistry, SchemaStatus};
use super::sequence::runtime_error;
use crate::incident::{Incident, error_chain};

/// Laid-out schemas by name, and the ones still to encode.
pub struct SchemaCompiler {
    registry: Arc<SchemaRegistry>,
    laid_out: HashMap<String, LaidOutSchema>,
    to_encode: VecDeque<String>,
}

impl SchemaCompiler {
    pub fn new(registry: Arc<SchemaRegistry>) -> Self {
        Self {
            registry,
            laid_out: HashMap::new(),
            to_encode: VecDeque::new(),
        }
    }

    /// Every loaded schema, for binding prompts to (encoded or not: what is missing from the
    /// store is computed).
    pub fn laid_out(&self) -> &HashMap<String, LaidOutSchema> {
        &self.laid_out
    }

    pub fn is_idle(&self) -> bool {
        self.to_encode.is_empty()
    }

    /// Checks and lays out an uploaded schema and queues its encoding. `src=` includes are
    /// refused unless `sources_root` names the operator's folder: an upload must not read the
    /// server's files.
    pub fn lay_out(
        &mut self,
        runtime: &Runtime,
        source: &str,
        sources_root: Option<PathBuf>,
    ) -> Result<SchemaInfo, JobError> {
        let laid_out = match sources_root {
            Some(root) => runtime.lay_out(source, &FsSourceLoader::new(root)),
            None => runtime.lay_out(source, &RefuseSources),
        }
        .map_err(|error| runtime_error(error, source))?;
        let name = laid_out
            .schema
            .name
            .as_ref()
            .map(|name| name.text.clone())
            .ok_or_else(|| {
                JobError::BadRequest("the schema has no name (`<schema name=\"…\">`)".to_string())
            })?;
        let info = SchemaInfo {
            name: name.clone(),
            status: SchemaStatus::Queued,
            units_total: laid_out.layout.units.len(),
            units_done: 0,
            units_encoded: 0,
            error: None,
        };
        tracing::info!(
            "schema `{name}` laid out: {} units, queued for encoding",
            info.units_total
        );
        self.registry.insert(info.clone());
        self.laid_out.insert(name.clone(), laid_out);
        self.to_encode.retain(|queued| *queued != name);
        self.to_encode.push_back(name);
        Ok(info)
    }

    /// Forgets schema `name`; whether it was loaded.
    pub fn remove(&mut self, name: &str) -> bool {
        let known = self.laid_out.remove(name).is_some();
        self.registry.remove(name);
        if known {
            tracing::info!("schema `{name}` removed");
        }
        known
    }

    /// A shutdown encodes nothing more: what is not in the store yet is computed when asked.
    pub fn cancel_queued(&mut self) {
        self.to_encode.clear();
    }

    /// Encodes every unit of the next queued schema that the store lacks, reporting progress.
    /// Whether it encoded one (the store's counters moved).
    pub fn encode_next(&mut self, runtime: &Runtime) -> bool {
        let Some(name) = self.to_encode.pop_front() else {
            return false;
        };
        let Some(schema) = self.laid_out.get(&name) else {
            return false; // deleted while queued
        };
        let registry = &self.registry;
        registry.update(&name, |info| info.status = SchemaStatus::Compiling);
        let result = runtime.encode(&schema.layout, &mut |event| match event {
            EncodeEvent::Start { n_units, .. } => {
                registry.update(&name, |info| info.units_total = n_units);
            }
            EncodeEvent::Unit { index, .. } => {
                registry.update(&name, |info| info.units_done = index + 1);
            }
            EncodeEvent::Waiting { .. } => {}
        });
        match result {
            Ok(report) => {
                registry.update(&name, |info| {
                    info.status = SchemaStatus::Ready;
                    info.units_done = info.units_total;
                    info.units_encoded = report.n_encoded();
                });
                tracing::info!(
                    "schema `{name}` ready: {} units encoded, the others were stored",
                    report.n_encoded()
                );
            }
            Err(error) => {
                // The record is public: the detail goes to the log, the incident to the record.
                let incident = Incident::report(format_args!(
                    "encoding schema `{name}` failed: {}",
                    error_chain(&error)
                ));
                registry.update(&name, |info| {
                    info.status = SchemaStatus::Failed;
                    info.error = Some(incident.public_message());
                });
            }
        }
        true
    }
}
