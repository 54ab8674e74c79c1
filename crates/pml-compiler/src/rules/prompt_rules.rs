//! Rules checked on a prompt against its schema (`PML2xx`).

use pml_syntax::{Rule, Severity};

pub const MISSING_SCHEMA_ATTRIBUTE: Rule = Rule {
    code: "PML201",
    name: "missing-schema-attribute",
    severity: Severity::Error,
    summary: "A prompt has no `schema` attribute, or an empty one.",
    why: "A prompt is bound to the schema it names; without a name there is nothing to bind its \
          imports to.",
    example: "<prompt>\n  <travel-plan/>\n</prompt>",
};

pub const SCHEMA_NAME_MISMATCH: Rule = Rule {
    code: "PML202",
    name: "schema-name-mismatch",
    severity: Severity::Error,
    summary: "A prompt names one schema but is checked against another.",
    why: "Modules, unions and parameters differ between schemas; checking or running a prompt \
          against a schema it was not written for gives meaningless results.",
    example: "<!-- checked with: pmlc check --schema travel.pml prompt.pml -->\n\
              <prompt schema=\"cooking\">\n  <recipe/>\n</prompt>",
};

pub const SCHEMA_NOT_FOUND: Rule = Rule {
    code: "PML203",
    name: "schema-not-found",
    severity: Severity::Error,
    summary: "The schema a prompt names could not be found.",
    why: "A prompt cannot be checked or run without its schema. `pmlc check` looks for \
          `--schema FILE`, then `NAME.pml` and `NAME.xml` next to the prompt, then any `.pml` \
          or `.xml` file in that folder whose root is `<schema name=\"NAME\">`.",
    example: "<prompt schema=\"travle\">\n  <travel-plan/>\n</prompt>",
};

pub const SCHEMA_HAS_ERRORS: Rule = Rule {
    code: "PML204",
    name: "schema-has-errors",
    severity: Severity::Error,
    summary: "The schema a prompt names has errors of its own.",
    why: "The runtime refuses a schema with errors, so the prompt cannot run even if it is \
          correct; the prompt was checked against what could be understood of the schema.",
    example: "<prompt schema=\"travel\">\n  <travel-plan/>\n</prompt>\n\
              <!-- travel.pml: <module> without a name -->",
};

pub const UNKNOWN_MODULE: Rule = Rule {
    code: "PML205",
    name: "unknown-module",
    severity: Severity::Error,
    summary: "A prompt imports a module that does not exist anywhere in the schema.",
    why: "Only modules declared in the schema have cached state to reuse; an unknown tag is \
          usually a typo.",
    example: "<prompt schema=\"travel\">\n  <travel-plans/>\n</prompt>",
};

pub const IMPORT_OUTSIDE_PARENT: Rule = Rule {
    code: "PML206",
    name: "import-outside-parent",
    severity: Severity::Error,
    summary: "A prompt imports a nested module somewhere other than inside its parent module.",
    why: "A nested module's cached state was computed after its parent's text and at positions \
          inside it, so it can only be used inside an import of that parent.",
    example: "<prompt schema=\"travel\">\n  <tokyo/>\n</prompt>\n\
              <!-- tokyo is declared inside travel-plan > overseas -->",
};

pub const UNION_CONFLICT: Rule = Rule {
    code: "PML207",
    name: "union-conflict",
    severity: Severity::Error,
    summary: "A prompt imports two members of one union.",
    why: "Union members are alternatives laid out at the same positions; two of them would \
          overlap.",
    example: "<prompt schema=\"travel\">\n  <travel-plan><domestic/><overseas/></travel-plan>\n\
              </prompt>",
};

pub const DUPLICATE_IMPORT: Rule = Rule {
    code: "PML208",
    name: "duplicate-import",
    severity: Severity::Error,
    summary: "A prompt imports the same module twice (collection members excepted).",
    why: "A module has one fixed place in the layout, so it can appear in a prompt only once; \
          only collection members are positioned at bind time and may repeat.",
    example: "<prompt schema=\"travel\">\n  <travel-plan/>\n  <travel-plan/>\n</prompt>",
};

pub const UNKNOWN_ARGUMENT: Rule = Rule {
    code: "PML209",
    name: "unknown-argument",
    severity: Severity::Error,
    summary: "An import passes an argument that is not a parameter of that module.",
    why: "Arguments fill a module's parameter positions; one that matches no parameter would be \
          silently dropped.",
    example: "<prompt schema=\"travel\">\n  <travel-plan durration=\"3 days\"/>\n</prompt>",
};

pub const ARGUMENT_TOO_LONG: Rule = Rule {
    code: "PML210",
    name: "argument-too-long",
    severity: Severity::Error,
    summary: "An argument takes more tokens than its parameter's `len`.",
    why: "A parameter reserves exactly `len` positions; a longer argument would overwrite the \
          positions of the text after it. Checked only when a tokenizer is known: by `pml run`, \
          by `pmlc check --model ID`, and by the language server when it has its model.",
    example: "<prompt schema=\"travel\">\n  \
              <travel-plan duration=\"three weeks and a long weekend in late spring\"/>\n</prompt>",
};

pub const TEXT_IN_IMPORT: Rule = Rule {
    code: "PML211",
    name: "text-in-import",
    severity: Severity::Error,
    summary: "An import holds text or a role block; only nested imports may go inside one.",
    why: "An import stands for the module's cached text; there is no place inside it for new \
          text. New text goes between imports or after them.",
    example: "<prompt schema=\"travel\">\n  <travel-plan>Also visit Kyoto.</travel-plan>\n</prompt>",
};

pub const IMPORT_OUT_OF_ORDER: Rule = Rule {
    code: "PML212",
    name: "import-out-of-order",
    severity: Severity::Warning,
    summary: "A prompt imports modules in a different order from the schema.",
    why: "Module positions are fixed by the schema, so the prompt is laid out in schema order \
          whatever order it is written in; the text does not read the way the model will see it.",
    example: "<prompt schema=\"travel\">\n  <packing-list/>\n  <travel-plan/>\n</prompt>\n\
              <!-- the schema declares travel-plan first -->",
};

pub const UNEXPECTED_ROLE_CLOSE: Rule = Rule {
    code: "PML213",
    name: "unexpected-role-close",
    severity: Severity::Error,
    summary: "A prompt closes a role (`</user>`) that the schema did not leave open.",
    why: "A prompt may close only a role block that its schema opened and left unclosed (the \
          Prompt Cache convention); any other close tag has nothing to close.",
    example: "<prompt schema=\"travel\">\n  <travel-plan/>\n  </user>\n</prompt>\n\
              <!-- the schema closes its <user> block itself -->",
};

/// Every prompt rule, in code order.
pub const PROMPT_RULES: &[Rule] = &[
    MISSING_SCHEMA_ATTRIBUTE,
    SCHEMA_NAME_MISMATCH,
    SCHEMA_NOT_FOUND,
    SCHEMA_HAS_ERRORS,
    UNKNOWN_MODULE,
    IMPORT_OUTSIDE_PARENT,
    UNION_CONFLICT,
    DUPLICATE_IMPORT,
    UNKNOWN_ARGUMENT,
    ARGUMENT_TOO_LONG,
    TEXT_IN_IMPORT,
    IMPORT_OUT_OF_ORDER,
    UNEXPECTED_ROLE_CLOSE,
];
