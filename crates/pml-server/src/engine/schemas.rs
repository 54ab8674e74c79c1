//! Uploaded schemas as the HTTP layer sees them: name, compile status and progress. The engine
//! writes; handlers read without waiting for the engine.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use pml_compiler::plan::SchemaLayout;
use serde::Serialize;

/// Where a schema's compilation stands.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SchemaStatus {
    /// Laid out, waiting for the engine to encode it.
    Queued,
    Compiling,
    Ready,
    Failed,
}

/// A schema's public record.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SchemaInfo {
    pub name: String,
    pub status: SchemaStatus,
    pub units_total: usize,
    pub units_done: usize,
    /// Units encoded by this compilation (the others were already in the store).
    pub units_encoded: usize,
    /// Why compilation failed.
    pub error: Option<String>,
    /// The text uploaded (`GET /v1/schemas/{name}/source`), shared rather than copied per listing.
    #[serde(skip)]
    pub source: Arc<str>,
}

/// Every loaded schema's record, by name.
#[derive(Debug, Default)]
pub struct SchemaRegistry {
    entries: Mutex<BTreeMap<String, SchemaInfo>>,
}

impl SchemaRegistry {
    pub fn list(&self) -> Vec<SchemaInfo> {
        self.entries
            .lock()
            .map(|entries| entries.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn get(&self, name: &str) -> Option<SchemaInfo> {
        self.entries
            .lock()
            .ok()
            .and_then(|entries| entries.get(name).cloned())
    }

    pub fn insert(&self, info: SchemaInfo) {
        if let Ok(mut entries) = self.entries.lock() {
            entries.insert(info.name.clone(), info);
        }
    }

    pub fn remove(&self, name: &str) -> bool {
        self.entries
            .lock()
            .is_ok_and(|mut entries| entries.remove(name).is_some())
    }

    /// Applies `change` to the record of `name`, if it is still loaded.
    pub fn update(&self, name: &str, change: impl FnOnce(&mut SchemaInfo)) {
        if let Ok(mut entries) = self.entries.lock()
            && let Some(info) = entries.get_mut(name)
        {
            change(info);
        }
    }
}

/// A schema's units as `GET /v1/schemas/{name}/layout` shows them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SchemaLayoutView {
    pub name: String,
    /// First position after the schema.
    pub positions: u32,
    pub units: Vec<UnitView>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnitView {
    /// The module's path (`overseas/tokyo`); `(root)` for the schema's own text.
    pub name: String,
    /// Extent, nested modules included: `start..end`.
    pub start: u32,
    pub end: u32,
    /// The unit's own tokens.
    pub tokens: usize,
    /// The fastest store tier holding its state, or `to-encode`.
    pub tier: &'static str,
}

impl SchemaLayoutView {
    /// `tiers` in the order of `layout.units`.
    pub fn new(layout: &SchemaLayout, tiers: &[Option<&'static str>]) -> Self {
        Self {
            name: layout.schema_name.clone(),
            positions: layout.end_position,
            units: layout
                .units
                .iter()
                .zip(tiers)
                .map(|(unit, tier)| UnitView {
                    name: match unit.path.is_empty() {
                        true => "(root)".to_string(),
                        false => unit.path.join("/"),
                    },
                    start: unit.start,
                    end: unit.end,
                    tokens: unit.tokens.len(),
                    tier: tier.unwrap_or("to-encode"),
                })
                .collect(),
        }
    }
}
