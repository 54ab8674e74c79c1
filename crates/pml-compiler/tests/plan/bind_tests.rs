//! Binding: snapshots of bound prompts and the rules of design §3 ("Binding", "Cached
//! inference", "Collections") one by one.

use crate::layout_tests::{DOCS, OPEN_ROLE, ROLES, TRAVEL};
use crate::support::{Compiled, PieceTokenizer, chatml, codes, gemma, render_bound};
use pml_compiler::chat_template::ChatTemplate;
use pml_compiler::plan::{BoundPrompt, CachedSpan, LayoutUnit, NewTokenKind, SchemaLayout};
use pml_compiler::{Tokenizer, unit_of};

fn bound_table(
    schema: &str,
    prompt: &str,
    tokenizer: &PieceTokenizer,
    template: &ChatTemplate,
) -> String {
    let compiled = Compiled::new(schema);
    let layout = compiled.layout(tokenizer, template);
    let bound = compiled.bind(&layout, prompt, tokenizer, template);
    render_bound(&bound, &layout, tokenizer)
}

const TRAVEL_TOKYO: &str = r#"<prompt schema="travel">
  <travel-plan duration="3 days">
    <overseas>
      <tokyo/>
    </overseas>
  </travel-plan>
  <user>Highlight the surf spots.</user>
</prompt>"#;

#[test]
fn travel_tokyo_chatml() {
    let tokenizer = PieceTokenizer::new();
    insta::assert_snapshot!(bound_table(TRAVEL, TRAVEL_TOKYO, &tokenizer, &chatml()));
}

#[test]
fn travel_defaults_chatml() {
    let tokenizer = PieceTokenizer::new();
    let prompt = "<prompt schema=\"travel\">\n  <travel-plan/>\n  <user>Plan it.</user>\n</prompt>";
    insta::assert_snapshot!(bound_table(TRAVEL, prompt, &tokenizer, &chatml()));
}

#[test]
fn roles_gemma() {
    let tokenizer = PieceTokenizer::with_bos();
    let prompt = r#"<prompt schema="roles">
  <interviewer position="nurse"/>
  <user>Start the interview.</user>
</prompt>"#;
    insta::assert_snapshot!(bound_table(ROLES, prompt, &tokenizer, &gemma()));
}

#[test]
fn collection_in_prompt_order_chatml() {
    let tokenizer = PieceTokenizer::new();
    let prompt = r#"<prompt schema="docs">
  <doc-c/>
  <doc-a/>
  <doc-c/>
  <user>Which comes first?</user>
</prompt>"#;
    insta::assert_snapshot!(bound_table(DOCS, prompt, &tokenizer, &chatml()));
}

#[test]
fn open_role_closed_by_the_prompt_gemma() {
    let tokenizer = PieceTokenizer::with_bos();
    let prompt = r#"<prompt schema="longbench">
  <doc-2/>
  Question: who wrote the second document?
  </user>
</prompt>"#;
    insta::assert_snapshot!(bound_table(OPEN_ROLE, prompt, &tokenizer, &gemma()));
}

fn unit<'a>(compiled: &Compiled, layout: &'a SchemaLayout, name: &str) -> &'a LayoutUnit {
    let id = compiled.index.modules_named(name)[0];
    &layout.units[unit_of(id).index()]
}

fn span_of<'a>(bound: &'a BoundPrompt, unit: &LayoutUnit) -> Vec<&'a CachedSpan> {
    bound
        .cached
        .iter()
        .filter(|span| span.unit == unit.id)
        .collect()
}

fn new_of(bound: &BoundPrompt, kind: NewTokenKind) -> (Vec<u32>, Vec<u32>) {
    bound
        .new_tokens
        .iter()
        .zip(&bound.new_positions)
        .zip(&bound.new_kinds)
        .filter(|(_, k)| **k == kind)
        .map(|((&token, &position), _)| (token, position))
        .unzip()
}

/// The name of each cached span's unit, in splice order (the root's is empty).
fn cached_unit_names<'a>(layout: &'a SchemaLayout, bound: &BoundPrompt) -> Vec<&'a str> {
    bound
        .cached
        .iter()
        .map(|span| layout.units[span.unit.index()].name.as_str())
        .collect()
}

#[test]
fn arguments_replace_their_slot() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(TRAVEL);
    let layout = compiled.layout(&tokenizer, &chatml());
    let bound = compiled.bind(&layout, TRAVEL_TOKYO, &tokenizer, &chatml());
    let plan = unit(&compiled, &layout, "travel-plan");
    let slot = &plan.params[0];
    let [span] = span_of(&bound, plan)[..] else {
        panic!("the plan is cached once");
    };
    let dropped: Vec<usize> = (0..plan.tokens.len())
        .filter(|row| !span.rows.contains(row))
        .collect();
    assert_eq!(
        dropped,
        (slot.token_offset..slot.token_offset + 4).collect::<Vec<_>>()
    );
    let (tokens, positions) = new_of(&bound, NewTokenKind::Argument);
    assert_eq!(tokens, tokenizer.encode("3 days", false).expect("encodes"));
    assert_eq!(positions, [slot.start, slot.start + 1, slot.start + 2]);
    assert_eq!(span.placed_at, None);
}

#[test]
fn selected_modules_and_union_defaults() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(TRAVEL);
    let layout = compiled.layout(&tokenizer, &chatml());
    let cached_names = |prompt: &str| -> Vec<String> {
        let bound = compiled.bind(&layout, prompt, &tokenizer, &chatml());
        cached_unit_names(&layout, &bound)
            .into_iter()
            .map(String::from)
            .collect()
    };
    // The chosen path, and nothing of the other members.
    assert_eq!(
        cached_names(TRAVEL_TOKYO),
        ["", "travel-plan", "overseas", "tokyo"]
    );
    // No member of the outer union: its default stands in; nested modules of a selection that
    // are not selected stay out.
    assert_eq!(
        cached_names("<prompt schema=\"travel\"><travel-plan/></prompt>"),
        ["", "travel-plan", "domestic"]
    );
    // `overseas` selected without a destination: the inner union's default.
    assert_eq!(
        cached_names("<prompt schema=\"travel\"><travel-plan><overseas/></travel-plan></prompt>"),
        ["", "travel-plan", "overseas", "rome"]
    );
    // A module that is not imported brings nothing, defaults included.
    assert_eq!(cached_names("<prompt schema=\"travel\"/>"), [""]);
}

#[test]
fn defaults_apply_inside_defaults_and_at_the_root() {
    let tokenizer = PieceTokenizer::new();
    let schema = r#"<schema name="nest">
  <union default="outer-a">
    <module name="outer-a">
      A.
      <union default="inner-b">
        <module name="inner-a">Inner A.</module>
        <module name="inner-b">Inner B.</module>
      </union>
      <module name="optional">Not selected.</module>
    </module>
    <module name="outer-b">B.</module>
  </union>
</schema>"#;
    let compiled = Compiled::new(schema);
    let layout = compiled.layout(&tokenizer, &chatml());
    let bound = compiled.bind(
        &layout,
        "<prompt schema=\"nest\">Hi.</prompt>",
        &tokenizer,
        &chatml(),
    );
    let names = cached_unit_names(&layout, &bound);
    // The schema has no anonymous text and the model no BOS: the root has no rows to splice.
    assert_eq!(names, ["outer-a", "inner-b"]);
    let bound = compiled.bind(
        &layout,
        "<prompt schema=\"nest\"><outer-b/></prompt>",
        &tokenizer,
        &chatml(),
    );
    let names = cached_unit_names(&layout, &bound);
    assert_eq!(names, ["outer-b"]);
}

#[test]
fn new_text_positions() {
    let tokenizer = PieceTokenizer::new();
    let schema = r#"<schema name="s">
  Intro.
  <module name="a">Alpha text.</module>
  <module name="b">Beta text that is long.</module>
  <module name="c">Gamma.</module>
  Outro.
</schema>"#;
    let compiled = Compiled::new(schema);
    let layout = compiled.layout(&tokenizer, &chatml());
    let a = unit(&compiled, &layout, "a");
    let c = unit(&compiled, &layout, "c");
    let prompt = "<prompt schema=\"s\">Before.\n<a/>\nBetween.\n<c/>\nAfter.</prompt>";
    let bound = compiled
        .try_bind(&layout, prompt, &tokenizer, &chatml(), false)
        .expect("binds");
    let (tokens, positions) = new_of(&bound, NewTokenKind::Text);
    let pieces = |text: &str| tokenizer.encode(text, false).expect("encodes").len() as u32;
    let before = pieces("Before.\n");
    let between = pieces("Between.\n");
    let after = pieces("After.");
    assert_eq!(tokens.len() as u32, before + between + after);
    // Before the first import: right after the last root position below it ("Intro.\n").
    let intro_end = pieces("Intro.\n");
    assert_eq!(positions[0], intro_end);
    // Between imports: after the preceding import's extent (in b's unused positions).
    assert_eq!(positions[before as usize], a.end);
    // After the last import: after the end of the schema.
    assert_eq!(positions[(before + between) as usize], layout.end_position);
    assert!(layout.end_position > c.end);
    assert!(
        bound
            .new_kinds
            .iter()
            .all(|kind| *kind == NewTokenKind::Text)
    );
}

#[test]
fn a_module_after_the_prefix_gives_the_full_sequence() {
    let tokenizer = PieceTokenizer::with_bos();
    let template = gemma();
    let schema = r#"<schema name="exact">
  <system>Be brief.</system>
  <user>
    Intro text.
    <module name="m">
      Body of the module.
    </module>
</schema>"#;
    let compiled = Compiled::new(schema);
    let layout = compiled.layout(&tokenizer, &template);
    let prompt = "<prompt schema=\"exact\">\n  <m/>\n  What is it?\n  </user>\n</prompt>";
    let bound = compiled.bind(&layout, prompt, &tokenizer, &template);
    let mut sequence: Vec<(u32, u32)> = Vec::new();
    for span in &bound.cached {
        let unit = &layout.units[span.unit.index()];
        sequence.extend(
            span.rows
                .iter()
                .map(|&row| (unit.positions[row], unit.tokens[row])),
        );
    }
    sequence.extend(
        bound
            .new_positions
            .iter()
            .copied()
            .zip(bound.new_tokens.iter().copied()),
    );
    sequence.sort_unstable();
    let positions: Vec<u32> = sequence.iter().map(|entry| entry.0).collect();
    assert_eq!(positions, (0..sequence.len() as u32).collect::<Vec<_>>());
    let tokens: Vec<u32> = sequence.iter().map(|entry| entry.1).collect();
    let mut expected = vec![tokenizer.bos_token().expect("bos")];
    for (text, special) in [
        ("<start_of_turn>user\n", true),
        ("Be brief.", false),
        ("<end_of_turn>\n", true),
        ("<start_of_turn>user\n", true),
        ("Intro text.\n", false),
        ("Body of the module.\n", false),
        ("What is it?", false),
        ("<end_of_turn>\n", true),
        ("<start_of_turn>model\n", true),
    ] {
        expected.extend(tokenizer.encode(text, special).expect("encodes"));
    }
    assert_eq!(tokens, expected);
}

#[test]
fn collection_members_are_packed_in_prompt_order() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(DOCS);
    let layout = compiled.layout(&tokenizer, &chatml());
    let [a, b, c] = ["doc-a", "doc-b", "doc-c"].map(|name| unit(&compiled, &layout, name));
    let start = a.start;
    let extent = |unit: &LayoutUnit| unit.end - unit.start;

    let prompt = "<prompt schema=\"docs\"><doc-c/><doc-a/><doc-c/></prompt>";
    let bound = compiled
        .try_bind(&layout, prompt, &tokenizer, &chatml(), false)
        .expect("binds");
    let placed: Vec<(u32, Option<u32>)> = bound
        .cached
        .iter()
        .filter(|span| span.unit != layout.units[0].id)
        .map(|span| (span.unit.0, span.placed_at))
        .collect();
    assert_eq!(
        placed,
        [
            (c.id.0, Some(start)),
            (a.id.0, Some(start + extent(c))),
            (c.id.0, Some(start + extent(c) + extent(a))),
        ]
    );

    // Packed past the reserved extent: text after the last import goes after the packed end.
    let prompt = "<prompt schema=\"docs\"><doc-b/><doc-b/><doc-b/>Next.</prompt>";
    let bound = compiled
        .try_bind(&layout, prompt, &tokenizer, &chatml(), false)
        .expect("binds");
    let packed_end = start + 3 * extent(b);
    assert!(
        packed_end > layout.end_position,
        "the test needs an overflow"
    );
    assert_eq!(bound.new_positions.first(), Some(&packed_end));
}

#[test]
fn generation_prompt_comes_last() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(ROLES);
    let layout = compiled.layout(&tokenizer, &chatml());
    let prompt = "<prompt schema=\"roles\"><user>Hi</user></prompt>";
    let bound = compiled.bind(&layout, prompt, &tokenizer, &chatml());
    let (tokens, positions) = new_of(&bound, NewTokenKind::GenerationPrompt);
    assert_eq!(
        tokenizer.decode(&tokens).expect("decodes"),
        "<|im_start|>assistant\n"
    );
    let last_other = bound
        .new_kinds
        .iter()
        .zip(&bound.new_positions)
        .filter(|(kind, _)| **kind != NewTokenKind::GenerationPrompt)
        .map(|(_, &position)| position)
        .max();
    assert_eq!(last_other.map(|p| p + 1), positions.first().copied());
    // No imports: the prompt's text follows the schema; the union's default stands in.
    assert_eq!(bound.new_positions[0], layout.end_position);
    let without = compiled
        .try_bind(&layout, prompt, &tokenizer, &chatml(), false)
        .expect("binds");
    assert!(!without.new_kinds.contains(&NewTokenKind::GenerationPrompt));
}

#[test]
fn prompt_errors_are_returned() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(TRAVEL);
    let layout = compiled.layout(&tokenizer, &chatml());
    let unknown = compiled
        .try_bind(
            &layout,
            "<prompt schema=\"travel\"><paris/></prompt>",
            &tokenizer,
            &chatml(),
            true,
        )
        .expect_err("unknown module");
    assert_eq!(codes(&unknown), ["PML205"]);
    let too_long = compiled
        .try_bind(
            &layout,
            "<prompt schema=\"travel\"><travel-plan duration=\"three long lazy weeks\"/></prompt>",
            &tokenizer,
            &chatml(),
            true,
        )
        .expect_err("argument too long");
    assert_eq!(codes(&too_long), ["PML210"]);
}

#[test]
fn a_layout_of_another_schema_is_refused() {
    let tokenizer = PieceTokenizer::new();
    let travel = Compiled::new(TRAVEL);
    let roles = Compiled::new(ROLES);
    let roles_layout = roles.layout(&tokenizer, &chatml());
    let diagnostics = travel
        .try_bind(&roles_layout, TRAVEL_TOKYO, &tokenizer, &chatml(), true)
        .expect_err("mismatch");
    assert_eq!(codes(&diagnostics), ["PML304"]);
}
