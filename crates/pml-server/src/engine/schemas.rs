//! Uploaded schemas as the HTTP layer sees them: name, compile status and progress. The engine
//! writes; handlers read without waiting for the engine.

use std::collections::BTreeMap;
use std::sync::Mutex;

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
