//! The resolved model of a schema: its module tree with naming scopes, each module's parameters,
//! union membership (which modules are mutually exclusive), collection membership, parent links
//! and the span of every name. Built from the AST without judging it — a broken schema still
//! gives an index (unnamed modules are kept, and a duplicate name resolves to the first
//! declaration) — so the checker, layout, binding and the language server all build on it.
//!
//! A *scope* is the nearest enclosing module, or the schema root. Unions, collections and role
//! blocks are transparent for naming: their members are named in the enclosing scope.
//! Module ids are assigned in document (pre-)order, so comparing two ids compares their places
//! in the schema.

use pml_syntax::Span;
use pml_syntax::ast::{Attribute, Name, Role, Schema, SchemaItem, TextRun};
use std::collections::HashMap;

/// The largest `len` a parameter may reserve.
pub const MAX_PARAM_LEN: u32 = 32_768;

/// The longest schema name, in characters. A schema's name goes into file names (its manifest in
/// the module store, a server's saved copy of an upload), which file systems cap at 255 bytes;
/// those file names are bounded whatever the name, but a name that has to be hashed to fit is
/// no longer readable in a directory listing. 128 is far more than a readable name needs, and it
/// keeps valid every name a server could save before names were bounded (up to 125 bytes).
pub const MAX_SCHEMA_NAME_CHARS: usize = 128;

/// A module, numbered in schema order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(u32);

/// A union, numbered in schema order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UnionId(u32);

/// A collection, numbered in schema order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CollectionId(u32);

macro_rules! id_index {
    ($($id:ident),*) => {$(
        impl $id {
            /// Position in the index's list (and in schema order).
            pub fn index(self) -> usize {
                self.0 as usize
            }

            fn from_len(len: usize) -> Self {
                // Spans are `usize` byte offsets and every element takes several bytes, so a
                // schema with more than u32::MAX elements would be larger than 4 GiB of text.
                $id(u32::try_from(len).unwrap_or(u32::MAX))
            }
        }
    )*};
}
id_index!(ModuleId, UnionId, CollectionId);

/// Where names are looked up: the schema root or a module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scope {
    Root,
    Module(ModuleId),
}

/// One `<module>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleInfo {
    pub name: Option<Name>,
    /// The scope the module is named in; `Scope::Module(parent)` for a nested module.
    pub scope: Scope,
    /// The union this module is a direct member of.
    pub union: Option<UnionId>,
    /// The collection this module is a direct member of.
    pub collection: Option<CollectionId>,
    /// Modules whose scope is this module, in schema order.
    pub children: Vec<ModuleId>,
    /// Parameters of this module (not of its nested modules), in schema order.
    pub params: Vec<ParamInfo>,
    /// The `src="file"` attribute, when the module's text comes from a file.
    pub src: Option<Attribute>,
    /// Whether the module holds anything besides whitespace (text, params or elements).
    pub has_inline_content: bool,
    pub span: Span,
    pub open_tag: Span,
}

impl ModuleInfo {
    /// The module's name, or `""` when it has none.
    pub fn name_text(&self) -> &str {
        self.name.as_ref().map_or("", |name| name.text.as_str())
    }

    /// The parameter with this name (the first, if declared twice).
    pub fn param(&self, name: &str) -> Option<&ParamInfo> {
        self.params
            .iter()
            .find(|param| param.name.as_ref().is_some_and(|n| n.text == name))
    }
}

/// One `<param>` (or `<parameter>`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamInfo {
    pub name: Option<Name>,
    /// The number of positions reserved, when `len` is a whole number in `1..=MAX_PARAM_LEN`.
    pub len: Option<u32>,
    /// The `len`/`length` attribute as written.
    pub len_attribute: Option<Attribute>,
    pub scaffold: Option<TextRun>,
    pub span: Span,
}

/// One `<union>`: its members are mutually exclusive and share one start position.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnionInfo {
    pub scope: Scope,
    /// Direct member modules, in schema order.
    pub members: Vec<ModuleId>,
    /// `default` or `scaffold`, as written.
    pub default: Option<Attribute>,
    pub span: Span,
    pub open_tag: Span,
}

impl UnionInfo {
    /// The member the `default` attribute names, if it names one.
    pub fn default_member(&self, index: &SchemaIndex) -> Option<ModuleId> {
        let default = self.default.as_ref()?;
        self.members
            .iter()
            .copied()
            .find(|&member| index.module(member).name_text() == default.value)
    }
}

/// One `<collection>`: members a prompt may import any number of times, in any order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectionInfo {
    pub name: Option<Name>,
    pub scope: Scope,
    /// Direct member modules, in schema order.
    pub members: Vec<ModuleId>,
    pub span: Span,
    pub open_tag: Span,
}

/// A role block the schema opens and leaves unclosed, for the prompt to close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpenRole {
    pub role: Role,
    pub scope: Scope,
    pub open_tag: Span,
}

/// The resolved schema. See the module documentation.
#[derive(Clone, Debug, Default)]
pub struct SchemaIndex {
    name: Option<Name>,
    modules: Vec<ModuleInfo>,
    unions: Vec<UnionInfo>,
    collections: Vec<CollectionInfo>,
    root_modules: Vec<ModuleId>,
    open_roles: Vec<OpenRole>,
    by_name: HashMap<String, Vec<ModuleId>>,
}

impl SchemaIndex {
    /// Indexes `schema`, however broken.
    pub fn build(schema: &Schema) -> SchemaIndex {
        let mut index = SchemaIndex {
            name: schema.name.clone(),
            ..SchemaIndex::default()
        };
        let root = Context {
            scope: Scope::Root,
            union: None,
            collection: None,
        };
        index.visit(&schema.items, root);
        for (position, module) in index.modules.iter().enumerate() {
            if let Some(name) = &module.name {
                index
                    .by_name
                    .entry(name.text.clone())
                    .or_default()
                    .push(ModuleId::from_len(position));
            }
        }
        index
    }

    /// The schema's `name`.
    pub fn name(&self) -> Option<&Name> {
        self.name.as_ref()
    }

    pub fn module(&self, id: ModuleId) -> &ModuleInfo {
        &self.modules[id.index()]
    }

    /// Every module in schema order.
    pub fn modules(&self) -> impl ExactSizeIterator<Item = (ModuleId, &ModuleInfo)> {
        self.modules
            .iter()
            .enumerate()
            .map(|(position, module)| (ModuleId::from_len(position), module))
    }

    pub fn union(&self, id: UnionId) -> &UnionInfo {
        &self.unions[id.index()]
    }

    /// Every union in schema order.
    pub fn unions(&self) -> impl ExactSizeIterator<Item = (UnionId, &UnionInfo)> {
        self.unions
            .iter()
            .enumerate()
            .map(|(position, union)| (UnionId::from_len(position), union))
    }

    pub fn collection(&self, id: CollectionId) -> &CollectionInfo {
        &self.collections[id.index()]
    }

    /// Every collection in schema order.
    pub fn collections(&self) -> impl ExactSizeIterator<Item = (CollectionId, &CollectionInfo)> {
        self.collections
            .iter()
            .enumerate()
            .map(|(position, collection)| (CollectionId::from_len(position), collection))
    }

    /// Role blocks the schema leaves open for a prompt to close.
    pub fn open_roles(&self) -> &[OpenRole] {
        &self.open_roles
    }

    /// Modules named in `scope`, in schema order.
    pub fn children(&self, scope: Scope) -> &[ModuleId] {
        match scope {
            Scope::Root => &self.root_modules,
            Scope::Module(id) => &self.module(id).children,
        }
    }

    /// The module a tag `name` refers to in `scope` (the first declared, if the name is
    /// duplicated there).
    pub fn lookup(&self, scope: Scope, name: &str) -> Option<ModuleId> {
        self.modules_named(name)
            .iter()
            .copied()
            .find(|&id| self.module(id).scope == scope)
    }

    /// Every module called `name`, in any scope, in schema order.
    pub fn modules_named(&self, name: &str) -> &[ModuleId] {
        self.by_name.get(name).map_or(&[], Vec::as_slice)
    }

    /// The module `id` is nested in, if any.
    pub fn parent(&self, id: ModuleId) -> Option<ModuleId> {
        match self.module(id).scope {
            Scope::Root => None,
            Scope::Module(parent) => Some(parent),
        }
    }

    /// The enclosing modules of `id`, innermost first.
    pub fn ancestors(&self, id: ModuleId) -> impl Iterator<Item = ModuleId> + '_ {
        std::iter::successors(self.parent(id), |&module| self.parent(module))
    }

    /// The modules from the root down to `id`, `id` included.
    pub fn path(&self, id: ModuleId) -> Vec<ModuleId> {
        let mut path: Vec<ModuleId> = self.ancestors(id).collect();
        path.reverse();
        path.push(id);
        path
    }

    /// Whether `id` is nested (at any depth) in `scope`; everything is within the root.
    pub fn is_within(&self, id: ModuleId, scope: Scope) -> bool {
        match scope {
            Scope::Root => true,
            Scope::Module(outer) => self.ancestors(id).any(|ancestor| ancestor == outer),
        }
    }

    /// Whether `a` and `b` can never both be imported: they (or modules enclosing them) are
    /// different members of one union.
    pub fn are_exclusive(&self, a: ModuleId, b: ModuleId) -> bool {
        let chain_a: Vec<ModuleId> = std::iter::once(a).chain(self.ancestors(a)).collect();
        std::iter::once(b).chain(self.ancestors(b)).any(|outer_b| {
            chain_a.iter().any(|&outer_a| {
                outer_a != outer_b
                    && self.module(outer_a).union.is_some()
                    && self.module(outer_a).union == self.module(outer_b).union
            })
        })
    }

    fn visit(&mut self, items: &[SchemaItem], context: Context) {
        for item in items {
            match item {
                SchemaItem::Text(_) => {}
                SchemaItem::Module(module) => {
                    let id = ModuleId::from_len(self.modules.len());
                    self.modules.push(ModuleInfo {
                        name: module.name.clone(),
                        scope: context.scope,
                        union: context.union,
                        collection: context.collection,
                        children: Vec::new(),
                        params: Vec::new(),
                        src: module.src.clone(),
                        has_inline_content: module.items.iter().any(|item| !is_blank(item)),
                        span: module.span,
                        open_tag: module.open_tag,
                    });
                    match context.scope {
                        Scope::Root => self.root_modules.push(id),
                        Scope::Module(parent) => self.modules[parent.index()].children.push(id),
                    }
                    if let Some(union) = context.union {
                        self.unions[union.index()].members.push(id);
                    }
                    if let Some(collection) = context.collection {
                        self.collections[collection.index()].members.push(id);
                    }
                    self.visit(
                        &module.items,
                        Context {
                            scope: Scope::Module(id),
                            union: None,
                            collection: None,
                        },
                    );
                }
                SchemaItem::Union(union) => {
                    let id = UnionId::from_len(self.unions.len());
                    self.unions.push(UnionInfo {
                        scope: context.scope,
                        members: Vec::new(),
                        default: union.default.clone(),
                        span: union.span,
                        open_tag: union.open_tag,
                    });
                    self.visit(
                        &union.items,
                        Context {
                            union: Some(id),
                            collection: None,
                            ..context
                        },
                    );
                }
                SchemaItem::Collection(collection) => {
                    let id = CollectionId::from_len(self.collections.len());
                    self.collections.push(CollectionInfo {
                        name: collection.name.clone(),
                        scope: context.scope,
                        members: Vec::new(),
                        span: collection.span,
                        open_tag: collection.open_tag,
                    });
                    self.visit(
                        &collection.items,
                        Context {
                            union: None,
                            collection: Some(id),
                            ..context
                        },
                    );
                }
                SchemaItem::Param(param) => {
                    // A misplaced parameter (at the root) belongs to no module; the checker says so.
                    if let Scope::Module(owner) = context.scope {
                        self.modules[owner.index()].params.push(ParamInfo {
                            name: param.name.clone(),
                            len: param
                                .len
                                .as_ref()
                                .and_then(|len| parse_len(&len.value).ok()),
                            len_attribute: param.len.clone(),
                            scaffold: param.scaffold.clone(),
                            span: param.span,
                        });
                    }
                }
                SchemaItem::Role(block) => {
                    if block.close_tag.is_none() {
                        self.open_roles.push(OpenRole {
                            role: block.role,
                            scope: context.scope,
                            open_tag: block.open_tag,
                        });
                    }
                    self.visit(&block.items, context);
                }
            }
        }
    }
}

#[derive(Clone, Copy)]
struct Context {
    scope: Scope,
    union: Option<UnionId>,
    collection: Option<CollectionId>,
}

/// Whether an item is whitespace-only text.
pub(crate) fn is_blank(item: &SchemaItem) -> bool {
    matches!(item, SchemaItem::Text(run) if run.text.trim().is_empty())
}

/// Why a `len` value is not usable.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LenError {
    NotANumber,
    Zero,
    TooLarge,
}

/// Parses a `len`/`length` value: a whole number in `1..=MAX_PARAM_LEN`, surrounding
/// whitespace allowed.
pub fn parse_len(value: &str) -> Result<u32, LenError> {
    let digits = value.trim();
    if digits.is_empty() || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return Err(LenError::NotANumber);
    }
    match digits.parse::<u64>() {
        Ok(0) => Err(LenError::Zero),
        Ok(len) if len <= u64::from(MAX_PARAM_LEN) => {
            u32::try_from(len).map_err(|_| LenError::TooLarge)
        }
        // More digits than u64 holds is too large, not "not a number".
        _ => Err(LenError::TooLarge),
    }
}

#[cfg(test)]
mod tests;
