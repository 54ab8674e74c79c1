//! Typed syntax tree of PML schemas and prompts, with byte spans. The parser always builds one,
//! however broken the input: missing names are `None`, unknown attributes are kept, and the
//! checker (in `pml-compiler`) decides what is meaningful. Text is already dedented and decoded.

use crate::span::Span;
use serde::Serialize;

/// An identifier as written (a tag or attribute name, or a name-valued attribute), with its span.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Name {
    pub text: String,
    pub span: Span,
}

/// `name="value"`: `value` has entities decoded; `value_span` excludes the quotes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Attribute {
    pub name: Name,
    pub value: String,
    pub value_span: Span,
    /// From the attribute name to the closing quote.
    pub span: Span,
}

/// A run of text between tags (text, entities and CDATA; comments removed), dedented as in
/// design §2: common indentation and leading/trailing blank lines removed, all else kept.
/// `span` covers the raw source of the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TextRun {
    pub text: String,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

impl Role {
    pub fn from_tag(tag: &str) -> Option<Role> {
        match tag {
            "system" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            _ => None,
        }
    }

    pub fn tag(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// What a file holds, decided by its root element.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum SourceFile {
    Schema(Schema),
    Prompt(Prompt),
    /// No `<schema>` or `<prompt>` root was found (a diagnostic says why).
    Empty,
}

/// `<schema name="...">`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Schema {
    pub name: Option<Name>,
    /// Every attribute as written, `name` included.
    pub attributes: Vec<Attribute>,
    pub items: Vec<SchemaItem>,
    /// The whole element, open tag to close tag (or to the end of the file when unclosed).
    pub span: Span,
    pub open_tag: Span,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum SchemaItem {
    Text(TextRun),
    Module(Module),
    Union(Union),
    Collection(Collection),
    Param(Param),
    Role(RoleBlock<SchemaItem>),
}

/// `<module name="..." [src="file"]>`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Module {
    pub name: Option<Name>,
    pub src: Option<Attribute>,
    pub attributes: Vec<Attribute>,
    pub items: Vec<SchemaItem>,
    pub span: Span,
    pub open_tag: Span,
}

/// `<union [default="member" | scaffold="member"]>`: members are mutually exclusive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Union {
    /// `default`, or the Prompt Cache spelling `scaffold`.
    pub default: Option<Attribute>,
    pub attributes: Vec<Attribute>,
    pub items: Vec<SchemaItem>,
    pub span: Span,
    pub open_tag: Span,
}

/// `<collection name="...">`: members a prompt may import any number of times, in any order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Collection {
    pub name: Option<Name>,
    pub attributes: Vec<Attribute>,
    pub items: Vec<SchemaItem>,
    pub span: Span,
    pub open_tag: Span,
}

/// `<param name="..." len="N"/>` or the Prompt Cache spelling `<parameter name="..." length="N"/>`,
/// optionally with scaffold text as content (`<param name="x" len="4">default</param>`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Param {
    /// The tag as written: `param` or `parameter`.
    pub tag: Name,
    pub name: Option<Name>,
    /// `len` or `length`, unvalidated (the checker wants an integer ≥ 1).
    pub len: Option<Attribute>,
    pub scaffold: Option<TextRun>,
    pub attributes: Vec<Attribute>,
    pub span: Span,
    pub open_tag: Span,
}

/// `<system>`, `<user>` or `<assistant>` around content. In a schema the close tag may be missing
/// (the prompt closes it): then `close` is `None` and the block runs to the end of its parent.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RoleBlock<T> {
    pub role: Role,
    pub items: Vec<T>,
    pub span: Span,
    pub open_tag: Span,
    pub close_tag: Option<Span>,
}

/// `<prompt schema="...">`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Prompt {
    pub schema: Option<Name>,
    pub attributes: Vec<Attribute>,
    pub items: Vec<PromptItem>,
    pub span: Span,
    pub open_tag: Span,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub enum PromptItem {
    Text(TextRun),
    Import(Import),
    Role(RoleBlock<PromptItem>),
    /// A role close tag with no open tag in this prompt: it closes a role the schema left open.
    RoleClose {
        role: Role,
        span: Span,
    },
}

/// A module imported by using its name as a tag; attributes are parameter arguments and children
/// select nested modules (text inside is kept so the checker can report it).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Import {
    pub name: Name,
    pub arguments: Vec<Attribute>,
    pub items: Vec<PromptItem>,
    pub span: Span,
    pub open_tag: Span,
    pub self_closing: bool,
    /// The tag reads as code rather than an import (`Vec<u8>`, `<T>`): when it names no module,
    /// diagnostics suggest writing it as text.
    pub looks_like_code: bool,
}
