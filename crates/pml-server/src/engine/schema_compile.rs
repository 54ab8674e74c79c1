//! Uploaded schemas on the engine's side. An upload is laid out at once, so its client hears of
//! errors in the answer; encoding its modules into the store can take minutes, so it waits in a
//! queue and the engine loop encodes a bounded piece of one schema per step — while it serves
//! completions, a few of a module's tokens in their step's pass (as it prefills their prompts in
//! chunks) — reporting progress to the [`SchemaRegistry`] the HTTP layer reads.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;

use pml_compiler::plan::SchemaLayout;
use pml_compiler::{FsSourceLoader, RefuseSources};
use pml_runtime::encode::{EncodeError, EncodeEvent, EncodeReport, EncodeRun, UnitChunk};
use pml_runtime::inference::{LaidOutSchema, Runtime};

use super::JobError;
use super::encode_pace::{IDLE_STEP, JoinedPace};
use super::schemas::{SchemaInfo, SchemaLayoutView, SchemaRegistry, SchemaStatus};
use super::sequence::runtime_error;
use crate::incident::{Incident, error_chain};

/// Laid-out schemas by name, the one being encoded and the ones still to encode.
pub struct SchemaCompiler {
    registry: Arc<SchemaRegistry>,
    laid_out: HashMap<String, LaidOutSchema>,
    encoding: Option<(String, EncodeRun)>,
    to_encode: VecDeque<String>,
    /// `ServerConfig::max_schema_units`.
    max_units: usize,
    pace: JoinedPace,
}

impl SchemaCompiler {
    pub fn new(registry: Arc<SchemaRegistry>, max_units: usize) -> Self {
        Self {
            max_units,
            registry,
            laid_out: HashMap::new(),
            encoding: None,
            to_encode: VecDeque::new(),
            pace: JoinedPace::default(),
        }
    }

    /// Every loaded schema, for binding prompts to (encoded or not: what is missing from the
    /// store is computed).
    pub fn laid_out(&self) -> &HashMap<String, LaidOutSchema> {
        &self.laid_out
    }

    pub fn is_idle(&self) -> bool {
        self.encoding.is_none() && self.to_encode.is_empty()
    }

    /// Drops the encoding of `name` under way, if any: its layout is gone or replaced.
    fn stop_encoding(&mut self, name: &str) {
        if self
            .encoding
            .as_ref()
            .is_some_and(|(encoding, _)| encoding == name)
        {
            self.encoding = None;
        }
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
        let n_units = laid_out.layout.units.len();
        if n_units > self.max_units {
            return Err(JobError::BadRequest(format!(
                "the schema lays out {n_units} units (its root and modules), more than this \
                 server's limit of {}: split it into several schemas, or raise \
                 --max-schema-units",
                self.max_units
            )));
        }
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
            source: source.into(),
        };
        tracing::info!(
            "schema `{name}` laid out: {} units, queued for encoding",
            info.units_total
        );
        self.registry.insert(info.clone());
        self.stop_encoding(&name);
        self.laid_out.insert(name.clone(), laid_out);
        self.to_encode.retain(|queued| *queued != name);
        self.to_encode.push_back(name);
        Ok(info)
    }

    /// Schema `name`'s units at their positions, each with the store tier its state is in.
    pub fn layout_view(&self, runtime: &Runtime, name: &str) -> Result<SchemaLayoutView, JobError> {
        let laid_out = self
            .laid_out
            .get(name)
            .ok_or_else(|| JobError::UnknownSchema(name.to_string()))?;
        let layout = &laid_out.layout;
        let tiers = runtime.unit_tiers(layout).map_err(JobError::internal)?;
        Ok(SchemaLayoutView::new(layout, &tiers))
    }

    /// Forgets schema `name`; whether it was loaded.
    pub fn remove(&mut self, name: &str) -> bool {
        let known = self.laid_out.remove(name).is_some();
        self.stop_encoding(name);
        self.registry.remove(name);
        if known {
            tracing::info!("schema `{name}` removed");
        }
        known
    }

    /// A shutdown encodes nothing more: what is not in the store yet is computed when asked.
    pub fn cancel_queued(&mut self) {
        self.encoding = None;
        self.to_encode.clear();
    }

    /// The schema being encoded, or the next queued one, begun.
    fn take_encoding(&mut self, runtime: &Runtime) -> Option<(String, EncodeRun)> {
        if let Some(encoding) = self.encoding.take() {
            return Some(encoding);
        }
        let registry = &self.registry;
        while let Some(name) = self.to_encode.pop_front() {
            let Some(schema) = self.laid_out.get(&name) else {
                continue; // deleted while queued
            };
            registry.update(&name, |info| info.status = SchemaStatus::Compiling);
            let run = runtime.begin_encode(&schema.layout, &mut |event| {
                progress(registry, &name, event)
            });
            return Some((name, run));
        }
        None
    }

    /// Encodes the next piece of the schema being encoded, or of the next queued one, in passes
    /// of its own ([`IDLE_STEP`]: the engine has nothing else to do), reporting progress.
    /// Whether it did anything (the store's counters moved).
    pub fn encode_next(&mut self, runtime: &Runtime) -> bool {
        self.advance(runtime, |name, run, layout, progress| {
            let (started, first) = (std::time::Instant::now(), run.units_done());
            let step = runtime.encode_step(run, layout, IDLE_STEP, progress);
            tracing::debug!(
                "schema `{name}`: units {first}..{} encoded in {:.1} ms",
                run.units_done(),
                started.elapsed().as_secs_f64() * 1e3,
            );
            step
        })
    }

    /// Readies the encoding's rows for a step that serves completions: stores the unit the
    /// steps before computed, visits the units the store holds and begins the next one to
    /// compute, whose next chunk then joins the step's pass ([`Self::joined_chunk`]); nothing
    /// while the unit begun still has tokens to compute. Whether it did anything (the store's
    /// counters moved).
    pub fn prepare_joined(&mut self, runtime: &Runtime) -> bool {
        if let Some((name, run)) = &self.encoding
            && let Some(schema) = self.laid_out.get(name)
            && run.computing(&schema.layout)
        {
            return false;
        }
        self.advance(runtime, |_, run, layout, progress| {
            runtime.encode_to_chunk(run, layout, IDLE_STEP.max_units, progress)
        })
    }

    /// Runs `piece` on the schema being encoded, or the next queued one, with its layout and a
    /// progress reporter, and keeps or settles the run; whether there was one.
    fn advance(
        &mut self,
        runtime: &Runtime,
        piece: impl FnOnce(
            &str,
            &mut EncodeRun,
            &SchemaLayout,
            &mut dyn FnMut(EncodeEvent<'_>),
        ) -> Result<Option<EncodeReport>, EncodeError>,
    ) -> bool {
        let Some((name, mut run)) = self.take_encoding(runtime) else {
            return false;
        };
        let Some(schema) = self.laid_out.get(&name) else {
            return false;
        };
        let registry = &self.registry;
        let step = piece(&name, &mut run, &schema.layout, &mut |event| {
            progress(registry, &name, event)
        });
        self.settle(name, run, step);
        true
    }

    /// The encoding's rows for this step's pass, as many as the pace gives for a step that takes
    /// `plain_step` without them; `None` when none join it.
    pub fn joined_chunk(
        &mut self,
        plain_step: Option<std::time::Duration>,
    ) -> Option<UnitChunk<'_>> {
        let rows = self.pace.rows(plain_step)?;
        let (name, run) = self.encoding.as_mut()?;
        let layout = &self.laid_out.get(name.as_str())?.layout;
        run.pending_chunk(layout, rows)
    }

    /// The step's pass computed the rows [`Self::joined_chunk`] gave: they are in the unit's
    /// cache.
    pub fn chunk_ran(&mut self) {
        if let Some((_, run)) = self.encoding.as_mut() {
            run.chunk_computed();
        }
    }

    /// A decoding step took `elapsed` with `joined` rows of the encoding in it (`None`: without)
    /// where one without takes `plain_step`: the next steps' rows follow.
    pub fn pace(
        &mut self,
        joined: Option<usize>,
        elapsed: std::time::Duration,
        plain_step: std::time::Duration,
    ) {
        self.pace.observe(joined, elapsed, plain_step);
    }

    /// The step's pass, with the encoding's rows in it, failed: the encoding stops there.
    pub fn joined_failed(&mut self, incident: &Incident) {
        if let Some((name, _)) = self.encoding.take() {
            self.registry.update(&name, |info| {
                info.status = SchemaStatus::Failed;
                info.error = Some(incident.public_message());
            });
        }
    }

    /// Keeps `run` for the next step, or records how the schema's encoding ended.
    fn settle(
        &mut self,
        name: String,
        run: EncodeRun,
        step: Result<Option<EncodeReport>, EncodeError>,
    ) {
        let registry = &self.registry;
        match step {
            Ok(None) => self.encoding = Some((name, run)),
            Ok(Some(report)) => {
                // Worked around (a store that cannot be written, a corrupt state re-encoded):
                // the schema still answers, its missing states computed when asked.
                for warning in &report.warnings {
                    tracing::warn!("schema `{name}`: {warning}");
                }
                registry.update(&name, |info| {
                    info.status = SchemaStatus::Ready;
                    info.units_done = info.units_total;
                    info.units_encoded = report.n_encoded();
                });
                let not_stored = report.not_stored();
                if not_stored.is_empty() {
                    tracing::info!(
                        "schema `{name}` ready: {} units encoded, {} found in the store",
                        report.n_encoded(),
                        report.n_reused()
                    );
                } else {
                    tracing::warn!(
                        "schema `{name}` ready: {} units encoded, {} found in the store; not \
                         stored (computed again when a prompt needs them): {}",
                        report.n_encoded(),
                        report.n_reused(),
                        not_stored.join(", ")
                    );
                }
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
    }
}

/// A schema's encoding progress, in its public record.
fn progress(registry: &SchemaRegistry, name: &str, event: EncodeEvent<'_>) {
    match event {
        EncodeEvent::Start { n_units, .. } => {
            registry.update(name, |info| info.units_total = n_units);
        }
        EncodeEvent::Unit { index, .. } => {
            registry.update(name, |info| info.units_done = index + 1);
        }
        EncodeEvent::Waiting { .. } => {}
    }
}
