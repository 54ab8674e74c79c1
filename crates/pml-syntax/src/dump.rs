//! A compact, line-per-node text dump of the typed AST with spans, for snapshot tests and for
//! `pmlc` debugging output. Values are printed with Rust escapes so whitespace is visible.

use crate::ast::{Attribute, PromptItem, RoleBlock, SchemaItem, SourceFile, TextRun};
use crate::span::Span;
use std::fmt::Write;

pub fn dump(file: &SourceFile) -> String {
    let mut out = String::new();
    match file {
        SourceFile::Empty => out.push_str("empty\n"),
        SourceFile::Schema(schema) => {
            line(&mut out, 0, "schema", &schema.attributes, schema.span);
            for item in &schema.items {
                schema_item(&mut out, 1, item);
            }
        }
        SourceFile::Prompt(prompt) => {
            line(&mut out, 0, "prompt", &prompt.attributes, prompt.span);
            for item in &prompt.items {
                prompt_item(&mut out, 1, item);
            }
        }
    }
    out
}

fn line(out: &mut String, depth: usize, head: &str, attributes: &[Attribute], span: Span) {
    let _ = write!(out, "{:indent$}{head}", "", indent = depth * 2);
    for attribute in attributes {
        let _ = write!(out, " {}={:?}", attribute.name.text, attribute.value);
    }
    let _ = writeln!(out, " @{}..{}", span.start, span.end);
}

fn text(out: &mut String, depth: usize, head: &str, run: &TextRun) {
    let _ = writeln!(
        out,
        "{:indent$}{head} @{}..{} {:?}",
        "",
        run.span.start,
        run.span.end,
        run.text,
        indent = depth * 2
    );
}

fn role<T>(
    out: &mut String,
    depth: usize,
    block: &RoleBlock<T>,
    mut child: impl FnMut(&mut String, &T),
) {
    let head = match block.close_tag {
        Some(_) => format!("role {}", block.role.tag()),
        None => format!("role {} (left open)", block.role.tag()),
    };
    line(out, depth, &head, &[], block.span);
    for item in &block.items {
        child(out, item);
    }
}

fn schema_item(out: &mut String, depth: usize, item: &SchemaItem) {
    let children = |out: &mut String, items: &[SchemaItem]| {
        for item in items {
            schema_item(out, depth + 1, item);
        }
    };
    match item {
        SchemaItem::Text(run) => text(out, depth, "text", run),
        SchemaItem::Module(module) => {
            line(out, depth, "module", &module.attributes, module.span);
            children(out, &module.items);
        }
        SchemaItem::Union(union) => {
            line(out, depth, "union", &union.attributes, union.span);
            children(out, &union.items);
        }
        SchemaItem::Collection(collection) => {
            line(
                out,
                depth,
                "collection",
                &collection.attributes,
                collection.span,
            );
            children(out, &collection.items);
        }
        SchemaItem::Param(param) => {
            line(out, depth, &param.tag.text, &param.attributes, param.span);
            if let Some(scaffold) = &param.scaffold {
                text(out, depth + 1, "scaffold", scaffold);
            }
        }
        SchemaItem::Role(block) => role(out, depth, block, |out, item| {
            schema_item(out, depth + 1, item)
        }),
    }
}

fn prompt_item(out: &mut String, depth: usize, item: &PromptItem) {
    match item {
        PromptItem::Text(run) => text(out, depth, "text", run),
        PromptItem::Import(import) => {
            let head = if import.self_closing {
                format!("import {}/", import.name.text)
            } else {
                format!("import {}", import.name.text)
            };
            line(out, depth, &head, &import.arguments, import.span);
            for item in &import.items {
                prompt_item(out, depth + 1, item);
            }
        }
        PromptItem::Role(block) => role(out, depth, block, |out, item| {
            prompt_item(out, depth + 1, item)
        }),
        PromptItem::RoleClose { role, span } => {
            let _ = writeln!(
                out,
                "{:indent$}role-close {} @{}..{}",
                "",
                role.tag(),
                span.start,
                span.end,
                indent = depth * 2
            );
        }
    }
}
