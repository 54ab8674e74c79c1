//! Rules checked on a schema on its own (`PML1xx`).

use pml_syntax::{Rule, Severity};

pub const MISSING_NAME: Rule = Rule {
    code: "PML101",
    name: "missing-name",
    severity: Severity::Error,
    summary: "A schema, module, parameter or collection has no `name` attribute, or an empty one.",
    why: "Prompts refer to schemas, modules and collections by name and pass arguments to \
          parameters by name; an unnamed element can never be used, and the runtime refuses it.",
    example: "<schema name=\"travel\">\n  <module>Tokyo ...</module>\n</schema>",
};

pub const DUPLICATE_NAME: Rule = Rule {
    code: "PML102",
    name: "duplicate-name",
    severity: Severity::Error,
    summary: "Two modules or collections in one scope share a name.",
    why: "A prompt imports a module by its name within a scope (the nearest enclosing module, or \
          the schema root; unions, collections and role blocks do not open a scope), so two \
          modules with one name there make the import ambiguous.",
    example: "<schema name=\"travel\">\n  <module name=\"tokyo\">...</module>\n  \
              <union>\n    <module name=\"tokyo\">...</module>\n  </union>\n</schema>",
};

pub const DUPLICATE_PARAM: Rule = Rule {
    code: "PML103",
    name: "duplicate-param",
    severity: Severity::Error,
    summary: "Two parameters of one module share a name.",
    why: "A prompt passes arguments as attributes named after the parameters; with two parameters \
          of one name, an argument could fill either.",
    example: "<module name=\"trip\">\n  From <param name=\"city\" len=\"5\"/> to \
              <param name=\"city\" len=\"5\"/>\n</module>",
};

pub const UNION_MEMBER_NOT_MODULE: Rule = Rule {
    code: "PML104",
    name: "union-member-not-module",
    severity: Severity::Error,
    summary: "A union holds text, a parameter, a union, a collection or a role block directly.",
    why: "Union members are mutually exclusive alternatives that a prompt selects by name; \
          anything else directly inside a union has no name to select it by and no defined place \
          in the layout.",
    example: "<union>\n  Pick one:\n  <module name=\"tokyo\">...</module>\n  \
              <module name=\"rome\">...</module>\n</union>",
};

pub const EMPTY_UNION: Rule = Rule {
    code: "PML105",
    name: "empty-union",
    severity: Severity::Warning,
    summary: "A union has no members.",
    why: "An empty union takes no positions and offers nothing to import; it is most likely \
          unfinished or a leftover.",
    example: "<module name=\"trip\">\n  <union></union>\n</module>",
};

pub const PARAM_OUTSIDE_MODULE: Rule = Rule {
    code: "PML106",
    name: "param-outside-module",
    severity: Severity::Error,
    summary: "A parameter appears outside every module.",
    why: "Arguments are passed on a module's import tag, so a parameter must belong to a module; \
          one in the always-present text can never receive an argument.",
    example: "<schema name=\"travel\">\n  Plan a trip to <param name=\"city\" len=\"5\"/>.\n</schema>",
};

pub const INVALID_PARAM_LEN: Rule = Rule {
    code: "PML107",
    name: "invalid-param-len",
    severity: Severity::Error,
    summary: "A parameter's `len` (or `length`) is missing, is not a whole number, or is below 1.",
    why: "A parameter reserves `len` token positions in the layout; without a positive whole \
          number the positions of everything after it are undefined.",
    example: "<module name=\"trip\">\n  To <param name=\"city\" len=\"ten\"/>\n</module>",
};

pub const PARAM_LEN_TOO_LARGE: Rule = Rule {
    code: "PML108",
    name: "param-len-too-large",
    severity: Severity::Error,
    summary: "A parameter's `len` is above 32768 tokens.",
    why: "Every reserved position costs KV-cache memory and pushes later modules beyond the \
          context window of common models; such a value is almost always a typo.",
    example: "<module name=\"trip\">\n  To <param name=\"city\" len=\"100000\"/>\n</module>",
};

pub const UNKNOWN_UNION_DEFAULT: Rule = Rule {
    code: "PML109",
    name: "unknown-union-default",
    severity: Severity::Error,
    summary: "A union's `default` (or `scaffold`) names no member of that union.",
    why: "The default member is the one laid out when a prompt selects none; naming a module that \
          is not a member leaves the union without a default.",
    example: "<union default=\"paris\">\n  <module name=\"tokyo\">...</module>\n  \
              <module name=\"rome\">...</module>\n</union>",
};

pub const SRC_UNREADABLE: Rule = Rule {
    code: "PML110",
    name: "src-unreadable",
    severity: Severity::Error,
    summary: "A module's `src` file does not exist, cannot be read, is not UTF-8, or loading \
              files is not allowed here.",
    why: "The module's text comes from that file; without it the module has no content to encode.",
    example: "<module name=\"solution\" src=\"missing.py\"/>",
};

pub const SRC_OUTSIDE_SCHEMA_FOLDER: Rule = Rule {
    code: "PML111",
    name: "src-outside-schema-folder",
    severity: Severity::Error,
    summary: "A module's `src` is an absolute path or leads outside the schema's folder (through \
              `..` or a symbolic link).",
    why: "A schema must not read arbitrary files of the machine that compiles or serves it; \
          keeping sources next to the schema also keeps the schema folder self-contained.",
    example: "<module name=\"secrets\" src=\"../../etc/passwd\"/>",
};

pub const SRC_WITH_CONTENT: Rule = Rule {
    code: "PML112",
    name: "src-with-content",
    severity: Severity::Error,
    summary: "A module has both a `src` attribute and content of its own.",
    why: "`src` supplies the module's whole text; content written inline as well would be \
          silently dropped or mixed in an unclear order.",
    example: "<module name=\"solution\" src=\"solution.py\">\n  def main(): ...\n</module>",
};

pub const UNKNOWN_ATTRIBUTE: Rule = Rule {
    code: "PML113",
    name: "unknown-attribute",
    severity: Severity::Warning,
    summary: "A schema element has an attribute that means nothing to it.",
    why: "Unknown attributes are ignored, so a misspelt `len` or `default` silently loses its \
          effect.",
    example: "<param name=\"city\" lenght=\"5\"/>",
};

pub const COLLECTION_MEMBER_NOT_MODULE: Rule = Rule {
    code: "PML114",
    name: "collection-member-not-module",
    severity: Severity::Error,
    summary: "A collection holds text, a parameter, a union, a collection or a role block \
              directly.",
    why: "A prompt imports collection members by name, in any order and any number of times; \
          anything else directly inside a collection has no name and no position.",
    example: "<collection name=\"docs\">\n  Documents:\n  <module name=\"doc-a\">...</module>\n\
              </collection>",
};

pub const RESERVED_MODULE_NAME: Rule = Rule {
    code: "PML115",
    name: "reserved-module-name",
    severity: Severity::Error,
    summary: "A module is named after a role tag (`system`, `user`, `assistant`).",
    why: "A prompt imports a module by writing its name as a tag, but those tags open chat \
          roles, so a module with such a name can never be imported.",
    example: "<module name=\"user\">...</module>",
};

pub const INVALID_MODULE_NAME: Rule = Rule {
    code: "PML116",
    name: "invalid-module-name",
    severity: Severity::Error,
    summary: "A module's name cannot be written as a tag: it must start with a letter or `_` and \
              hold only letters, digits, `_`, `.`, `:` and `-`.",
    why: "A prompt imports a module by writing its name as a tag; a name that is not a valid tag \
          name can never be imported.",
    example: "<module name=\"day one\">...</module>",
};

pub const SCHEMA_NAME_TOO_LONG: Rule = Rule {
    code: "PML117",
    name: "schema-name-too-long",
    severity: Severity::Error,
    summary: "A schema's name is longer than 128 characters.",
    why: "A schema's name becomes part of file names: the compiled schema's manifest in the \
          module store, and the copy a server keeps of an uploaded schema. File systems limit a \
          file name to 255 bytes, so a very long name could be checked but not compiled, or \
          served until the next restart and then lost.",
    example: "<schema name=\"a-name-of-more-than-128-characters-is-refused-a-name-of-more-than-\
              128-characters-is-refused-a-name-of-more-than-128-characters-is-refused\">\n\
              </schema>",
};

/// Every schema rule, in code order.
pub const SCHEMA_RULES: &[Rule] = &[
    MISSING_NAME,
    DUPLICATE_NAME,
    DUPLICATE_PARAM,
    UNION_MEMBER_NOT_MODULE,
    EMPTY_UNION,
    PARAM_OUTSIDE_MODULE,
    INVALID_PARAM_LEN,
    PARAM_LEN_TOO_LARGE,
    UNKNOWN_UNION_DEFAULT,
    SRC_UNREADABLE,
    SRC_OUTSIDE_SCHEMA_FOLDER,
    SRC_WITH_CONTENT,
    UNKNOWN_ATTRIBUTE,
    COLLECTION_MEMBER_NOT_MODULE,
    RESERVED_MODULE_NAME,
    INVALID_MODULE_NAME,
    SCHEMA_NAME_TOO_LONG,
];
