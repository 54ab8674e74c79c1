//! The rule table of syntax diagnostics (`PML001`…`PML099`): one stable code per problem the
//! parser can report, with its documentation. Codes are never renumbered; a retired code stays
//! reserved. `docs/diagnostics.md` and `pmlc explain` are generated from or checked against
//! [`SYNTAX_RULES`], and every rule's `example` is parsed by a test that expects its code.

use crate::diagnostic::{Rule, Severity};

pub(crate) const STRAY_LESS_THAN: &str = "PML001";
pub(crate) const MALFORMED_TAG: &str = "PML002";
pub(crate) const UNQUOTED_ATTRIBUTE: &str = "PML003";
pub(crate) const DUPLICATE_ATTRIBUTE: &str = "PML004";
pub(crate) const BAD_ENTITY: &str = "PML005";
pub(crate) const UNTERMINATED_COMMENT: &str = "PML006";
pub(crate) const UNTERMINATED_CDATA: &str = "PML007";
pub(crate) const UNCLOSED_ELEMENT: &str = "PML008";
pub(crate) const UNMATCHED_CLOSE_TAG: &str = "PML009";
pub(crate) const UNKNOWN_SCHEMA_TAG: &str = "PML010";
pub(crate) const MISSPELLED_ELEMENT: &str = "PML011";
pub(crate) const MISSING_ROOT: &str = "PML012";
pub(crate) const MULTIPLE_ROOTS: &str = "PML013";
pub(crate) const CONTENT_OUTSIDE_ROOT: &str = "PML014";
pub(crate) const NESTED_ROLE: &str = "PML015";
pub(crate) const MISPLACED_ELEMENT: &str = "PML016";
pub(crate) const NESTING_TOO_DEEP: &str = "PML017";
pub(crate) const NUL_CHARACTER: &str = "PML018";

/// Every code the parser emits, in code order.
pub const SYNTAX_RULES: &[Rule] = &[
    Rule {
        code: STRAY_LESS_THAN,
        name: "stray-less-than",
        severity: Severity::Warning,
        summary: "A `<` that does not start a well-formed tag is kept as text.",
        why: "Source code and maths in modules (`0 <= x < n`) contain `<`. PML keeps such a `<` as \
              text so the code survives, but a typo in a real tag would silently become text too, \
              so the parser says which `<` it did not read as a tag and why.",
        example: "<schema name=\"s\"><module name=\"m\">while 0 <= x < n: x += 1</module></schema>",
    },
    Rule {
        code: MALFORMED_TAG,
        name: "malformed-tag",
        severity: Severity::Error,
        summary: "A tag of a PML element is malformed (missing `=`, `>` or closing quote).",
        why: "The tag names a PML element, so it was meant as markup, but its attributes cannot be \
              read. The parser keeps the element with the attributes it could read and drops the \
              rest, which changes the meaning of the file.",
        example: "<schema name=\"s\"><module name=\"m>text</module></schema>",
    },
    Rule {
        code: UNQUOTED_ATTRIBUTE,
        name: "unquoted-attribute-value",
        severity: Severity::Warning,
        summary: "An attribute value is not quoted.",
        why: "Unquoted values (`name=domestic`) are accepted for compatibility with Prompt Cache \
              schemas, but they end at the first space and cannot contain quotes, `<`, `>`, `=` or \
              `/`, which is easy to get wrong.",
        example: "<schema name=\"s\"><module name=domestic>text</module></schema>",
    },
    Rule {
        code: DUPLICATE_ATTRIBUTE,
        name: "duplicate-attribute",
        severity: Severity::Error,
        summary: "The same attribute appears twice on one tag.",
        why: "Only the first value is used; the second is dropped, which is almost never what was \
              meant.",
        example: "<schema name=\"s\"><module name=\"a\" name=\"b\">text</module></schema>",
    },
    Rule {
        code: BAD_ENTITY,
        name: "bad-entity",
        severity: Severity::Warning,
        summary: "An entity or character reference is unknown or malformed; it is kept literally.",
        why: "PML knows `&lt; &gt; &amp; &quot; &apos;` and numeric references `&#NN;` / `&#xHH;`. \
              Anything else that looks like a reference (`&nbsp;`, `&#xZZ;`, `&lt` without `;`) is \
              kept as written, which is probably not what the author expected.",
        example: "<schema name=\"s\"><module name=\"m\">a&nbsp;b</module></schema>",
    },
    Rule {
        code: UNTERMINATED_COMMENT,
        name: "unterminated-comment",
        severity: Severity::Error,
        summary: "A comment `<!--` has no closing `-->`.",
        why: "Without the end marker the parser cannot know where the comment stops. It keeps \
              `<!--` as text and reads on, so the rest of the file is still checked.",
        example: "<schema name=\"s\"><!-- note <module name=\"m\">text</module></schema>",
    },
    Rule {
        code: UNTERMINATED_CDATA,
        name: "unterminated-cdata",
        severity: Severity::Error,
        summary: "A CDATA section `<![CDATA[` has no closing `]]>`.",
        why: "Without the end marker the parser cannot know where the verbatim text stops. It \
              keeps `<![CDATA[` as text and reads on as markup.",
        example: "<schema name=\"s\"><module name=\"m\"><![CDATA[x < y</module></schema>",
    },
    Rule {
        code: UNCLOSED_ELEMENT,
        name: "unclosed-element",
        severity: Severity::Error,
        summary: "An element is not closed before its parent closes or the file ends.",
        why: "The parser closes it where its parent closes (or at the end of the file), which may \
              pull following text and modules into it. Role tags in a schema are exempt: a \
              prompt may close them.",
        example: "<schema name=\"s\"><module name=\"m\">text</schema>",
    },
    Rule {
        code: UNMATCHED_CLOSE_TAG,
        name: "unmatched-close-tag",
        severity: Severity::Error,
        summary: "A close tag has no matching open element; it is ignored.",
        why: "A close tag without its open tag usually means the open tag was misspelled, \
              removed, or already closed, so the structure is not what it looks like.",
        example: "<schema name=\"s\"><module name=\"m\">text</module></module></schema>",
    },
    Rule {
        code: UNKNOWN_SCHEMA_TAG,
        name: "unknown-schema-tag",
        severity: Severity::Warning,
        summary: "A tag in a schema is not a PML element; it is kept as text.",
        why: "Schemas have a closed set of elements, so `List<String>` in embedded Java code \
              stays text. A real typo would silently become text too, hence the warning.",
        example: "<schema name=\"s\"><module name=\"m\">List<String> names;</module></schema>",
    },
    Rule {
        code: MISSPELLED_ELEMENT,
        name: "misspelled-element",
        severity: Severity::Error,
        summary: "A tag in a schema is not a PML element but is close to one.",
        why: "A tag like `<modle>` is almost certainly a misspelled `<module>`; kept as text it \
              would put markup into the prompt and lose the module.",
        example: "<schema name=\"s\"><modle name=\"m\">text</modle></schema>",
    },
    Rule {
        code: MISSING_ROOT,
        name: "missing-root",
        severity: Severity::Error,
        summary: "The file has no `<schema>` or `<prompt>` root element.",
        why: "The root element says what the file is; without it nothing in the file is used.",
        example: "<module name=\"m\">text</module>",
    },
    Rule {
        code: MULTIPLE_ROOTS,
        name: "multiple-roots",
        severity: Severity::Error,
        summary: "The file has a second `<schema>` or `<prompt>` root element; it is ignored.",
        why: "A file holds exactly one schema or one prompt; the first root decides which, and \
              everything in a second root is ignored.",
        example: "<schema name=\"a\"></schema>\n<schema name=\"b\"></schema>",
    },
    Rule {
        code: CONTENT_OUTSIDE_ROOT,
        name: "content-outside-root",
        severity: Severity::Error,
        summary: "Text or an element appears outside the root element; it is ignored.",
        why: "Only the root element's content is used, so text or elements before or after it \
              are silently lost.",
        example: "Hello\n<schema name=\"s\"></schema>",
    },
    Rule {
        code: NESTED_ROLE,
        name: "nested-role",
        severity: Severity::Error,
        summary: "A role block (`<system>`, `<user>`, `<assistant>`) appears inside another.",
        why: "Role blocks expand to the model's chat template turns, which cannot nest.",
        example: "<prompt schema=\"s\"><user>hi <system>be brief</system></user></prompt>",
    },
    Rule {
        code: MISPLACED_ELEMENT,
        name: "misplaced-element",
        severity: Severity::Error,
        summary: "An element appears where the syntax has no place for it; it is dropped.",
        why: "A root element (`<schema>`, `<prompt>`) cannot be nested, and a `<param>` holds only \
              its scaffold text; anything else there is dropped.",
        example: "<schema name=\"s\"><param name=\"p\" len=\"2\"><module name=\"m\"/></param></schema>",
    },
    Rule {
        code: NESTING_TOO_DEEP,
        name: "nesting-too-deep",
        severity: Severity::Error,
        summary: "Elements nest deeper than the limit (32 levels); deeper tags are kept as text.",
        why: "Real schemas nest a handful of levels. Unbounded nesting would let one file exhaust \
              the stack of every tool that walks the tree (checker, layout, editor), so the parser \
              stops building elements at the limit and says so once.",
        example: "<prompt schema=\"s\"><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a><a>",
    },
    Rule {
        code: NUL_CHARACTER,
        name: "nul-character",
        severity: Severity::Warning,
        summary: "The text contains NUL characters (U+0000).",
        why: "A NUL is almost never meant in a prompt: it comes from a binary file or a broken \
              conversion pasted into a module. It is kept (and tokenized) as it is, so the model \
              sees it; the parser says where the first one is and how many there are.",
        example: "<schema name=\"s\"><module name=\"m\">a\u{0}b</module></schema>",
    },
];

/// The rule for a syntax code, if it is one.
pub fn syntax_rule(code: &str) -> Option<&'static Rule> {
    SYNTAX_RULES.iter().find(|rule| rule.code == code)
}
