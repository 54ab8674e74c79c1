//! A schema edited since it was compiled: the layout its stored states were computed under,
//! rebuilt from its last manifest and those states, so a prompt can reuse them by edit reuse
//! ([`super::edit::rebind_edited`]) instead of re-encoding the changed modules first.
//!
//! Every unit whose state the store lacks takes the tokens and positions of the state the last
//! compile stored for the unit of the same id and path (a module whose text changed, and the
//! units after it, which moved); the rebuilt layout is used only if each such unit's key in it
//! is the key the manifest recorded — so its scaffold context is the one the state was computed
//! after, and the splice reads exactly the stored states.

use pml_compiler::plan::{EncodeMode, SchemaLayout, UnitId};

use crate::encode::{EncodeError, UnitEncoder, describe};
use crate::store::ModuleStore;
use pml_engine::model::Model;

use super::InferenceError;

/// The layout a schema's stored states were computed under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreviousLayout {
    pub layout: SchemaLayout,
    /// The units whose stored state is of another text or place than `layout`'s, described.
    pub changed: Vec<String>,
}

/// The layout `layout`'s schema had when its states were stored, if the store lacks some of
/// `layout`'s units and holds, for each of them, the state of the same unit in the last manifest
/// (and the keys check out); `None` otherwise (nothing changed, no manifest, a state evicted, a
/// changed unit with parameters, or another structure).
pub fn previous_layout(
    model: &Model,
    store: &ModuleStore,
    mode: EncodeMode,
    bos: Option<u32>,
    layout: &SchemaLayout,
) -> Result<Option<PreviousLayout>, InferenceError> {
    let Some(manifest) = store.read_manifest(&layout.schema_name).found() else {
        return Ok(None);
    };
    let encoder = UnitEncoder::new(model, layout, mode, bos, store)?;
    let mut previous = layout.clone();
    let mut replaced = Vec::new();
    for unit in &layout.units {
        if unit.tokens.is_empty()
            || store
                .contains(&encoder.key(unit.id)?)
                .map_err(EncodeError::from)?
        {
            continue;
        }
        let Some(stored) = manifest
            .units
            .iter()
            .find(|stored| stored.unit_id == unit.id.0 && stored.path == unit.path)
        else {
            return Ok(None);
        };
        let Some(hit) = store.get(&stored.key).map_err(EncodeError::from)? else {
            return Ok(None);
        };
        let state = &hit.state;
        let (Some(&old_first), Some(&old_last)) =
            (state.positions().first(), state.positions().last())
        else {
            return Ok(None);
        };
        if !unit.params.is_empty() {
            return Ok(None);
        }
        // The unit's extent moves with its first and last tokens.
        let shifted = |bound: u32, from: u32, to: u32| {
            u32::try_from(i64::from(bound) + i64::from(to) - i64::from(from)).ok()
        };
        let (Some(start), Some(end)) = (
            shifted(unit.start, unit.positions[0], old_first),
            shifted(unit.end, unit.positions[unit.positions.len() - 1], old_last),
        ) else {
            return Ok(None);
        };
        let target = &mut previous.units[unit.id.index()];
        target.tokens = state.tokens().to_vec();
        target.positions = state.positions().to_vec();
        target.start = start;
        target.end = end;
        replaced.push((unit.id, stored.key.clone()));
    }
    if replaced.is_empty() {
        return Ok(None);
    }
    previous.end_position = previous
        .units
        .iter()
        .map(|unit| unit.end)
        .max()
        .unwrap_or(0);
    // Every replaced unit must read the state the manifest recorded, and every kept one its
    // own: a kept unit's context may hold a replaced one's rows.
    let previous_encoder = UnitEncoder::new(model, &previous, mode, bos, store)?;
    for unit in layout.units.iter().filter(|unit| !unit.tokens.is_empty()) {
        let expected = match replaced.iter().find(|(id, _)| *id == unit.id) {
            Some((_, key)) => key.clone(),
            None => encoder.key(unit.id)?,
        };
        if previous_encoder.key(unit.id)? != expected {
            return Ok(None);
        }
    }
    let changed = replaced
        .iter()
        .map(|(id, _)| describe(&layout.units[UnitId::index(*id)]))
        .collect();
    Ok(Some(PreviousLayout {
        layout: previous,
        changed,
    }))
}
