//! Rules checked when a schema is laid out on a model's positions and a prompt is bound to that
//! layout (`PML3xx`). They need a model (its tokenizer, chat template and context length), so
//! `pmlc check` cannot report them; `pmlc compile` and `pml run` do. The last two are about a
//! prompt as a whole rather than a place in it: the runtime refuses such a prompt before computing
//! anything, with an error that names the code instead of a rendered diagnostic.

use pml_syntax::{Rule, Severity};

pub const SCHEMA_TOO_LONG: Rule = Rule {
    code: "PML301",
    name: "schema-too-long",
    severity: Severity::Error,
    summary: "A schema laid out for a model needs more positions than the model's context holds.",
    why: "Every module keeps its positions whether a prompt imports it or not, and a prompt's new \
          text goes after the end of the schema, so a schema that fills the context leaves no room \
          for the question or the answer.",
    example: "<schema name=\"library\">\n  <module name=\"book-1\">... 30 000 tokens ...</module>\n  \
              <module name=\"book-2\">... 30 000 tokens ...</module>\n</schema>\n\
              <!-- laid out for a model with a 32 768-token context -->",
};

pub const SCAFFOLD_TOO_LONG: Rule = Rule {
    code: "PML302",
    name: "scaffold-too-long",
    severity: Severity::Error,
    summary: "A parameter's scaffold text takes more tokens than the parameter's `len`.",
    why: "A parameter occupies exactly `len` positions; its scaffold text fills them when no \
          argument is given, so text that does not fit would overrun the positions of what follows.",
    example: "<param name=\"duration\" len=\"2\">one long and lazy week</param>",
};

pub const TOKENIZER_FAILED: Rule = Rule {
    code: "PML303",
    name: "tokenizer-failed",
    severity: Severity::Error,
    summary: "The model's tokenizer could not encode a text of the schema or the prompt.",
    why: "Positions are counted in tokens; a text that cannot be tokenized has no length and no \
          place in the layout. This points at a broken tokenizer or model file rather than at the \
          PML source.",
    example: "<module name=\"notes\">any text the tokenizer rejects</module>",
};

pub const LAYOUT_MISMATCH: Rule = Rule {
    code: "PML304",
    name: "layout-mismatch",
    severity: Severity::Error,
    summary: "A prompt is bound to a layout that was computed for a different version of its \
              schema.",
    why: "A layout records each module's positions and tokens; if the schema gained, lost or \
          renamed modules since, the prompt's imports would splice the wrong cached states.",
    example: "<!-- travel.pml changed after `pmlc compile travel.pml` -->\n\
              <prompt schema=\"travel\">\n  <travel-plan/>\n</prompt>",
};

pub const PROMPT_TOO_LONG: Rule = Rule {
    code: "PML305",
    name: "prompt-too-long",
    severity: Severity::Error,
    summary: "A prompt bound to its schema, with room for its answer (`--max-tokens`), needs more \
              positions than the model's context holds.",
    why: "Decoding goes on from one past the prompt's highest position, and a model's positions \
          end at its context length: past it the answer would be computed at positions the model \
          was never trained on. Collection members a prompt imports run on past the collection's \
          end, so a prompt can outgrow a schema that fits.",
    example: "<prompt schema=\"library\">\n  <chapter/><chapter/><chapter/> <!-- ... 12 000 \
              imports -->\n  Summarize.\n</prompt>\n\
              <!-- 36 014 positions on a model with a 32 768-token context -->",
};

pub const PROMPT_TOO_LARGE: Rule = Rule {
    code: "PML306",
    name: "prompt-too-large",
    severity: Severity::Error,
    summary: "A prompt has more bytes than the model's context could hold even if every token \
              were the vocabulary's longest.",
    why: "No token covers more bytes of text than the vocabulary's longest token, so a text longer \
          than the context times that length cannot fit, whatever it says. Such a prompt is \
          refused before it is read whole or tokenized, which would otherwise take memory in \
          proportion to its size.",
    example: "<!-- a 100 MB prompt for a model with a 32 768-token context, whose longest token is \
              256 bytes: at most 8 MiB can fit -->\n<prompt schema=\"library\">... 100 MB of text \
              ...</prompt>",
};

pub const SOURCE_TOO_LARGE: Rule = Rule {
    code: "PML307",
    name: "source-too-large",
    severity: Severity::Error,
    summary: "A PML file (a schema, a prompt, or a `src=` file) is larger than 8 MiB.",
    why: "8 MiB of text is about two million tokens: far more than any model's context, and more \
          than a schema's modules are worth encoding. Parsing and checking take memory in \
          proportion to a file's size, so a larger one is refused by its size, before it is \
          read, instead of exhausting the memory of the checker, the editor or the server.",
    example: "<!-- a 100 MB schema of small modules -->\n<schema name=\"big\"><module \
              name=\"m0\">...</module> ... 1.6 million modules ... </schema>",
};

/// Every layout and binding rule, in code order.
pub const LAYOUT_RULES: &[Rule] = &[
    SCHEMA_TOO_LONG,
    SCAFFOLD_TOO_LONG,
    TOKENIZER_FAILED,
    LAYOUT_MISMATCH,
    PROMPT_TOO_LONG,
    PROMPT_TOO_LARGE,
    SOURCE_TOO_LARGE,
];
