//! Lowers the generic element tree to the typed AST by element name. Attributes are kept as
//! written (the checker judges them); only what the AST has no place for is reported here:
//! nested root elements and elements inside a `<param>`.

use crate::ast::{
    Attribute, Collection, Import, Module, Name, Param, Prompt, PromptItem, Role, RoleBlock,
    Schema, SchemaItem, SourceFile, TextRun, Union,
};
use crate::diagnostic::Diagnostic;
use crate::rules;
use crate::tree::{Document, Element, Node};

pub(crate) fn lower(document: Document, diagnostics: &mut Vec<Diagnostic>) -> SourceFile {
    let Some(root) = document.root else {
        return SourceFile::Empty;
    };
    let mut lowerer = Lowerer { diagnostics };
    if root.name.text == "schema" {
        SourceFile::Schema(lowerer.schema(root))
    } else {
        SourceFile::Prompt(lowerer.prompt(root))
    }
}

struct Lowerer<'d> {
    diagnostics: &'d mut Vec<Diagnostic>,
}

fn attribute<'a>(attributes: &'a [Attribute], names: &[&str]) -> Option<&'a Attribute> {
    attributes
        .iter()
        .find(|attribute| names.contains(&attribute.name.text.as_str()))
}

/// A name-valued attribute as a [`Name`] spanning its value.
fn name_attribute(attributes: &[Attribute], name: &str) -> Option<Name> {
    attribute(attributes, &[name]).map(|attribute| Name {
        text: attribute.value.clone(),
        span: attribute.value_span,
    })
}

impl Lowerer<'_> {
    fn schema(&mut self, root: Element) -> Schema {
        Schema {
            name: name_attribute(&root.attributes, "name"),
            items: self.schema_items(root.children),
            attributes: root.attributes,
            span: root.span,
            open_tag: root.open_tag,
        }
    }

    fn prompt(&mut self, root: Element) -> Prompt {
        Prompt {
            schema: name_attribute(&root.attributes, "schema"),
            items: self.prompt_items(root.children),
            attributes: root.attributes,
            span: root.span,
            open_tag: root.open_tag,
        }
    }

    fn schema_items(&mut self, children: Vec<Node>) -> Vec<SchemaItem> {
        children
            .into_iter()
            .filter_map(|node| match node {
                Node::Text(run) => Some(SchemaItem::Text(run)),
                Node::Element(element) => self.schema_item(element),
                // The tree builder makes these only in prompts.
                Node::RoleClose { .. } => None,
            })
            .collect()
    }

    fn schema_item(&mut self, element: Element) -> Option<SchemaItem> {
        let item = match element.name.text.as_str() {
            "module" => SchemaItem::Module(Module {
                name: name_attribute(&element.attributes, "name"),
                src: attribute(&element.attributes, &["src"]).cloned(),
                items: self.schema_items(element.children),
                attributes: element.attributes,
                span: element.span,
                open_tag: element.open_tag,
            }),
            "union" => SchemaItem::Union(Union {
                default: attribute(&element.attributes, &["default", "scaffold"]).cloned(),
                items: self.schema_items(element.children),
                attributes: element.attributes,
                span: element.span,
                open_tag: element.open_tag,
            }),
            "collection" => SchemaItem::Collection(Collection {
                name: name_attribute(&element.attributes, "name"),
                items: self.schema_items(element.children),
                attributes: element.attributes,
                span: element.span,
                open_tag: element.open_tag,
            }),
            "param" | "parameter" => SchemaItem::Param(self.param(element)),
            tag => match Role::from_tag(tag) {
                Some(role) => SchemaItem::Role(RoleBlock {
                    role,
                    items: self.schema_items(element.children),
                    span: element.span,
                    open_tag: element.open_tag,
                    close_tag: element.close_tag,
                }),
                None => {
                    self.report_misplaced(
                        &element,
                        "it cannot be nested; move it to a file of its own",
                    );
                    return None;
                }
            },
        };
        Some(item)
    }

    fn param(&mut self, element: Element) -> Param {
        let mut scaffold: Option<TextRun> = None;
        for child in element.children {
            match child {
                Node::Text(run) => match &mut scaffold {
                    Some(first) => {
                        first.text.push_str(&run.text);
                        first.span = first.span.cover(run.span);
                    }
                    None => scaffold = Some(run),
                },
                Node::Element(inner) => self.report_misplaced(
                    &inner,
                    "a `<param>` holds only its scaffold text; move the element out",
                ),
                Node::RoleClose { .. } => {}
            }
        }
        Param {
            name: name_attribute(&element.attributes, "name"),
            len: attribute(&element.attributes, &["len", "length"]).cloned(),
            scaffold,
            attributes: element.attributes,
            tag: element.name,
            span: element.span,
            open_tag: element.open_tag,
        }
    }

    fn prompt_items(&mut self, children: Vec<Node>) -> Vec<PromptItem> {
        children
            .into_iter()
            .filter_map(|node| match node {
                Node::Text(run) => Some(PromptItem::Text(run)),
                Node::RoleClose { role, span } => Some(PromptItem::RoleClose { role, span }),
                Node::Element(element) => self.prompt_item(element),
            })
            .collect()
    }

    fn prompt_item(&mut self, element: Element) -> Option<PromptItem> {
        if let Some(role) = Role::from_tag(&element.name.text) {
            return Some(PromptItem::Role(RoleBlock {
                role,
                items: self.prompt_items(element.children),
                span: element.span,
                open_tag: element.open_tag,
                close_tag: element.close_tag,
            }));
        }
        if crate::names::is_root(&element.name.text) {
            self.report_misplaced(
                &element,
                "it cannot be nested; move it to a file of its own",
            );
            return None;
        }
        Some(PromptItem::Import(Import {
            items: self.prompt_items(element.children),
            arguments: element.attributes,
            self_closing: element.self_closing,
            looks_like_code: element.looks_like_code,
            name: element.name,
            span: element.span,
            open_tag: element.open_tag,
        }))
    }

    fn report_misplaced(&mut self, element: &Element, help: &str) {
        self.diagnostics.push(
            Diagnostic::error(
                rules::MISPLACED_ELEMENT,
                format!(
                    "`<{}>` is not allowed here and is dropped",
                    element.name.text
                ),
            )
            .with_label(element.open_tag, "not allowed here")
            .with_help(help),
        );
    }
}
