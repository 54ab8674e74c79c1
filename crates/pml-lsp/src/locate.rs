//! What is under the cursor: in a prompt, an import's name, an argument or the `schema`
//! attribute; in a schema, a module's open tag or a parameter. Imports resolve to schema modules
//! the way the checker resolves them (each import's children are looked up in its module's
//! scope); a misplaced import still leads to the module of that name, which is where a reader
//! wants to go. Ends of spans count as inside, so a cursor right after a word finds it.

use pml_compiler::{ModuleId, SchemaIndex, Scope};
use pml_syntax::Span;
use pml_syntax::ast::{Attribute, Import, Name, Prompt, PromptItem};

pub fn touches(span: Span, offset: usize) -> bool {
    span.start <= offset && offset <= span.end
}

pub enum PromptTarget<'a> {
    /// An import's name; `chain` runs from the outermost import down to it.
    Import { chain: Vec<&'a Import> },
    Argument {
        chain: Vec<&'a Import>,
        argument: &'a Attribute,
    },
    /// The value of `schema="..."`.
    SchemaName(&'a Name),
}

pub fn prompt_target(prompt: &Prompt, offset: usize) -> Option<PromptTarget<'_>> {
    if let Some(name) = prompt
        .schema
        .as_ref()
        .filter(|name| touches(name.span, offset))
    {
        return Some(PromptTarget::SchemaName(name));
    }
    let chain = import_chain(&prompt.items, offset);
    let innermost = *chain.last()?;
    if touches(innermost.name.span, offset) {
        return Some(PromptTarget::Import { chain });
    }
    let argument = innermost.arguments.iter().find(|argument| {
        touches(argument.name.span, offset) || touches(argument.value_span, offset)
    })?;
    Some(PromptTarget::Argument { chain, argument })
}

/// The imports whose element contains `offset`, outermost first.
pub fn import_chain(items: &[PromptItem], offset: usize) -> Vec<&Import> {
    let mut chain = Vec::new();
    let mut items = items;
    'descend: loop {
        for item in items {
            match item {
                PromptItem::Import(import) if touches(import.span, offset) => {
                    chain.push(import);
                    items = &import.items;
                    continue 'descend;
                }
                PromptItem::Role(block) if touches(block.span, offset) => {
                    items = &block.items;
                    continue 'descend;
                }
                _ => {}
            }
        }
        return chain;
    }
}

/// The module an import names in `scope`, or anywhere when it is misplaced.
pub fn resolve_import(index: &SchemaIndex, scope: Scope, name: &str) -> Option<ModuleId> {
    index
        .lookup(scope, name)
        .or_else(|| index.modules_named(name).first().copied())
}

/// The module the last import of `chain` names.
pub fn resolve_chain(index: &SchemaIndex, chain: &[&Import]) -> Option<ModuleId> {
    let mut scope = Scope::Root;
    let mut module = None;
    for import in chain {
        let id = resolve_import(index, scope, &import.name.text)?;
        scope = Scope::Module(id);
        module = Some(id);
    }
    module
}

/// Every import of a prompt with the module it resolves to, in document order.
pub fn resolved_imports<'a>(
    prompt: &'a Prompt,
    index: &SchemaIndex,
) -> Vec<(&'a Import, Option<ModuleId>)> {
    let mut found = Vec::new();
    collect_imports(&prompt.items, index, Scope::Root, &mut found);
    found
}

fn collect_imports<'a>(
    items: &'a [PromptItem],
    index: &SchemaIndex,
    scope: Scope,
    found: &mut Vec<(&'a Import, Option<ModuleId>)>,
) {
    for item in items {
        match item {
            PromptItem::Import(import) => {
                let id = resolve_import(index, scope, &import.name.text);
                found.push((import, id));
                if let Some(id) = id {
                    collect_imports(&import.items, index, Scope::Module(id), found);
                }
            }
            PromptItem::Role(block) => collect_imports(&block.items, index, scope, found),
            PromptItem::Text(_) | PromptItem::RoleClose { .. } => {}
        }
    }
}

pub enum SchemaTarget {
    Module(ModuleId),
    /// A module's parameter, by its position in the module's list.
    Param(ModuleId, usize),
}

pub fn schema_target(index: &SchemaIndex, offset: usize) -> Option<SchemaTarget> {
    for (id, module) in index.modules() {
        if let Some(position) = module
            .params
            .iter()
            .position(|param| touches(param.span, offset))
        {
            return Some(SchemaTarget::Param(id, position));
        }
    }
    index
        .modules()
        .filter(|(_, module)| touches(module.open_tag, offset))
        .last()
        .map(|(id, _)| SchemaTarget::Module(id))
}
