//! The compiler's hand-off to the runtime: a schema laid out on positions ([`SchemaLayout`]) and a
//! prompt bound to it ([`BoundPrompt`]). Plain data with token ids and position ids — the runtime
//! encodes units, looks them up in its store and splices them; it never sees PML syntax.
//!
//! A *unit* is what the runtime encodes and caches as one KV block: the schema root (all anonymous
//! text, role-template text outside modules, and BOS) or one module's *own* tokens (its text and
//! parameter placeholders, not its nested modules, which are units of their own).

use serde::Serialize;

/// The chat role of a block of text: the syntax's own type, travelling with the plan so the
/// runtime needs nothing from the parser.
pub use pml_syntax::ast::Role;

/// Index into [`SchemaLayout::units`]; `UnitId(0)` is always the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct UnitId(pub u32);

impl UnitId {
    pub const ROOT: UnitId = UnitId(0);

    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// How a unit's KV is computed at compile time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EncodeMode {
    /// In one pass after its scaffold context (design §3): exact when imported right after it.
    #[default]
    Scaffolded,
    /// Alone at its positions (the Prompt Cache paper's description); BOS is still present.
    Isolated,
}

/// What kind of unit this is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum UnitKind {
    Root,
    Module,
    /// A member of a `<collection>`: positions are assigned at bind time, the layout's are nominal.
    CollectionMember {
        collection: String,
    },
}

/// A parameter's reserved positions inside its unit.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ParamSlot {
    pub name: String,
    /// First reserved position; the parameter occupies `start..start + len`.
    pub start: u32,
    pub len: u32,
    /// Index in the unit's `tokens` of the first placeholder token (they are contiguous).
    pub token_offset: usize,
}

/// One cacheable unit laid out on positions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct LayoutUnit {
    pub id: UnitId,
    /// Module name; `""` for the root.
    pub name: String,
    /// Names from the outermost enclosing module down to this one (`["overseas", "tokyo"]`).
    pub path: Vec<String>,
    pub kind: UnitKind,
    pub parent: Option<UnitId>,
    /// Extent including nested modules: `start..end` (unions take their longest member).
    pub start: u32,
    pub end: u32,
    /// The unit's own tokens, in position order, and their positions (strictly increasing).
    pub tokens: Vec<u32>,
    pub positions: Vec<u32>,
    pub params: Vec<ParamSlot>,
    /// Units whose tokens at positions below `start` form this unit's scaffold context: the root
    /// and the ancestors, outermost first. Empty for the root.
    pub scaffold: Vec<UnitId>,
}

impl LayoutUnit {
    /// The schema root before any token is laid out: the unit every layout starts from.
    pub fn root() -> Self {
        LayoutUnit {
            id: UnitId::ROOT,
            name: String::new(),
            path: Vec::new(),
            kind: UnitKind::Root,
            parent: None,
            start: 0,
            end: 0,
            tokens: Vec::new(),
            positions: Vec::new(),
            params: Vec::new(),
            scaffold: Vec::new(),
        }
    }

    /// A module nested in `parent`, empty and starting at position `start`: its path and
    /// scaffold extend the parent's.
    pub fn child(
        parent: &LayoutUnit,
        id: UnitId,
        name: String,
        kind: UnitKind,
        start: u32,
    ) -> Self {
        let mut path = parent.path.clone();
        path.push(name.clone());
        let mut scaffold = parent.scaffold.clone();
        scaffold.push(parent.id);
        LayoutUnit {
            id,
            name,
            path,
            kind,
            parent: Some(parent.id),
            start,
            end: start,
            tokens: Vec::new(),
            positions: Vec::new(),
            params: Vec::new(),
            scaffold,
        }
    }
}

/// A schema laid out for one model (tokenizer + chat template).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SchemaLayout {
    pub schema_name: String,
    pub units: Vec<LayoutUnit>,
    /// First position after the whole schema: where a prompt's trailing text starts.
    pub end_position: u32,
}

/// A bound prompt: which cached rows to splice and which new tokens to compute, and where.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct BoundPrompt {
    pub schema_name: String,
    /// Cached units in position order, each with the rows of its `tokens` to use (all rows except
    /// placeholders that receive arguments).
    pub cached: Vec<CachedSpan>,
    /// New tokens in computation order: arguments, prompt text, role strings, generation prompt.
    pub new_tokens: Vec<u32>,
    pub new_positions: Vec<u32>,
    /// What each new token is, parallel to `new_tokens` (for stats and debugging).
    pub new_kinds: Vec<NewTokenKind>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CachedSpan {
    pub unit: UnitId,
    /// Rows of the unit's `tokens` to splice, ascending.
    pub rows: Vec<usize>,
    /// For collection members: the position of the unit's first token in this prompt (the cached
    /// K is re-rotated by the delta); `None` keeps the layout's positions.
    pub placed_at: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum NewTokenKind {
    Argument,
    Text,
    Template,
    GenerationPrompt,
}
