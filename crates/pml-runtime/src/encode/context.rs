//! Which already-encoded rows a unit attends to when it is encoded (its *context*), and row
//! selection on [`KvBlock`]s, shared by encoding and cached inference.
//!
//! Scaffolded: the rows of its scaffold units (root, then ancestors) at positions below its start —
//! everything always present before it in any prompt that imports it. Because a causal model's KV
//! of a token depends only on the tokens before it, splicing those rows' cached KV as the past
//! equals a full prefill of the scaffold context. Isolated: BOS only, when the root begins with it.

use candle_core::Tensor;
use pml_compiler::plan::{EncodeMode, LayoutUnit, SchemaLayout, UnitId, UnitKind};

use pml_engine::kv_cache::{KvBlock, KvCacheError};

use super::EncodeError;

/// Rows `rows` of unit `unit`'s tokens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct UnitRows {
    pub unit: UnitId,
    pub rows: Vec<usize>,
}

/// The rows unit `unit_id` attends to when encoded in `mode`, outermost unit first.
/// `bos` is the model's BOS token, if it uses one.
pub fn context_rows(
    layout: &SchemaLayout,
    unit_id: UnitId,
    mode: EncodeMode,
    bos: Option<u32>,
) -> Result<Vec<UnitRows>, EncodeError> {
    let unit = unit(layout, unit_id)?;
    if unit_id == UnitId::ROOT {
        return Ok(Vec::new());
    }
    let context = match mode {
        EncodeMode::Scaffolded => unit
            .scaffold
            .iter()
            .map(|&scaffold_id| {
                let scaffold = self::unit(layout, scaffold_id)?;
                let rows = scaffold
                    .positions
                    .iter()
                    .take_while(|&&position| position < unit.start)
                    .count();
                Ok(UnitRows {
                    unit: scaffold_id,
                    rows: (0..rows).collect(),
                })
            })
            .filter(|rows| rows.as_ref().map_or(true, |rows| !rows.rows.is_empty()))
            .collect::<Result<_, EncodeError>>()?,
        EncodeMode::Isolated => {
            let root = self::unit(layout, UnitId::ROOT)?;
            let starts_with_bos = bos.is_some()
                && root.tokens.first() == bos.as_ref()
                && root.positions.first() == Some(&0);
            if starts_with_bos {
                vec![UnitRows {
                    unit: UnitId::ROOT,
                    rows: vec![0],
                }]
            } else {
                Vec::new()
            }
        }
    };
    Ok(context)
}

/// The tokens and positions of `context`, in order: what the unit's key hashes.
pub fn context_tokens(
    layout: &SchemaLayout,
    context: &[UnitRows],
) -> Result<(Vec<u32>, Vec<u32>), EncodeError> {
    let mut tokens = Vec::new();
    let mut positions = Vec::new();
    for part in context {
        let unit = unit(layout, part.unit)?;
        for &row in &part.rows {
            tokens.push(unit.tokens[row]);
            positions.push(unit.positions[row]);
        }
    }
    Ok((tokens, positions))
}

/// Rows `rows` of `block`, all layers (the block itself when every row is kept).
pub fn select_rows(block: &KvBlock, rows: &[usize]) -> Result<KvBlock, KvCacheError> {
    if let Some(&row) = rows.iter().find(|&&row| row >= block.len()) {
        return Err(KvCacheError::SlotOutOfRange {
            slot: row,
            len: block.len(),
        });
    }
    if rows.iter().copied().eq(0..block.len()) {
        return Ok(block.clone());
    }
    let Some((first_keys, _)) = block.layers()?.first() else {
        return KvBlock::new(Vec::new(), select(block.positions(), rows));
    };
    let row_ids: Vec<u32> = rows.iter().map(|&row| row as u32).collect();
    let index = Tensor::new(row_ids.as_slice(), first_keys.device())?;
    let layers = block
        .layers()?
        .iter()
        .map(|(keys, values)| {
            Ok((
                keys.index_select(&index, 0)?,
                values.index_select(&index, 0)?,
            ))
        })
        .collect::<Result<_, KvCacheError>>()?;
    KvBlock::new(layers, select(block.positions(), rows))
}

/// For each of `wanted` (ascending positions), the index of the row at that position in `held`
/// (a state's ascending positions: every row of its unit, or a compressed state's subset), if
/// the state holds it.
pub fn held_rows(held: &[u32], wanted: impl IntoIterator<Item = u32>) -> Vec<Option<usize>> {
    let mut next = 0;
    wanted
        .into_iter()
        .map(|position| {
            while next < held.len() && held[next] < position {
                next += 1;
            }
            (next < held.len() && held[next] == position).then_some(next)
        })
        .collect()
}

/// Rows `rows` of unit `unit` that its state `block` holds (all of them, unless the state is
/// compressed): selected by position, the rows it dropped left out.
pub fn unit_rows(
    block: &KvBlock,
    unit: &LayoutUnit,
    rows: &[usize],
) -> Result<KvBlock, KvCacheError> {
    if let Some(&row) = rows.iter().find(|&&row| row >= unit.positions.len()) {
        return Err(KvCacheError::SlotOutOfRange {
            slot: row,
            len: unit.positions.len(),
        });
    }
    let held: Vec<usize> = held_rows(
        block.positions(),
        rows.iter().map(|&row| unit.positions[row]),
    )
    .into_iter()
    .flatten()
    .collect();
    select_rows(block, &held)
}

fn select(values: &[u32], rows: &[usize]) -> Vec<u32> {
    rows.iter().map(|&row| values[row]).collect()
}

/// The unit `unit_id` of `layout`.
pub fn unit(layout: &SchemaLayout, unit_id: UnitId) -> Result<&LayoutUnit, EncodeError> {
    layout.units.get(unit_id.index()).ok_or_else(|| {
        EncodeError::InvalidLayout(format!(
            "unit {} of a layout of {} units",
            unit_id.0,
            layout.units.len()
        ))
    })
}

/// Checks what encoding and splicing rely on: ids are indices, the root comes first, tokens
/// and positions pair up and increase, scaffold units come before the units they scaffold,
/// parameter slots lie inside their unit.
pub fn validate_layout(layout: &SchemaLayout) -> Result<(), EncodeError> {
    let invalid = |message: String| Err(EncodeError::InvalidLayout(message));
    match layout.units.first() {
        Some(root) if root.kind == UnitKind::Root && root.scaffold.is_empty() => {}
        _ => return invalid("the first unit must be the root, with no scaffold".into()),
    }
    for (index, unit) in layout.units.iter().enumerate() {
        let name = if unit.name.is_empty() {
            "<root>"
        } else {
            &unit.name
        };
        if unit.id.index() != index {
            return invalid(format!(
                "unit `{name}` has id {} at index {index}",
                unit.id.0
            ));
        }
        if index > 0 && unit.kind == UnitKind::Root {
            return invalid(format!("unit `{name}` at index {index} is a second root"));
        }
        if unit.tokens.len() != unit.positions.len() {
            return invalid(format!(
                "unit `{name}` has {} tokens and {} positions",
                unit.tokens.len(),
                unit.positions.len()
            ));
        }
        if unit.positions.windows(2).any(|pair| pair[0] >= pair[1]) {
            return invalid(format!("positions of unit `{name}` do not increase"));
        }
        if let Some(scaffold) = unit
            .scaffold
            .iter()
            .find(|scaffold| scaffold.index() >= index)
        {
            return invalid(format!(
                "unit `{name}` ({index}) is scaffolded by unit {}, which does not precede it",
                scaffold.0
            ));
        }
        for param in &unit.params {
            let fits = param
                .token_offset
                .checked_add(param.len as usize)
                .is_some_and(|end| end <= unit.tokens.len());
            if !fits {
                return invalid(format!(
                    "parameter `{}` of unit `{name}` reaches past its {} tokens",
                    param.name,
                    unit.tokens.len()
                ));
            }
        }
    }
    Ok(())
}
