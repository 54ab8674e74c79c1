//! Layout: snapshots of position tables and the rules of design §3 one by one.

use crate::support::{Compiled, PieceTokenizer, chatml, codes, gemma, render_layout};
use pml_compiler::MemorySourceLoader;
use pml_compiler::plan::{SchemaLayout, UnitKind};
use pml_compiler::{Tokenizer, unit_of};

/// Design §2's travel schema, abridged: a parameter with scaffold text, a union nested in a union
/// member, a parameter without scaffold, and role blocks.
pub const TRAVEL: &str = r#"<schema name="travel">
  <system>You plan trips.</system>
  <user>
    <module name="travel-plan">
      I'm gearing up for a trip of <param name="duration" len="4">one week</param>.
      Help me make a plan I can follow.
      <union default="domestic">
        <module name="domestic">
          I chose the city of <param name="city" len="3"/> as my base.
        </module>
        <module name="overseas">
          I'm yearning to tread international soil.
          <union default="rome">
            <module name="tokyo">Tokyo, Japan's bustling capital.</module>
            <module name="rome">The eternal city of Rome.</module>
          </union>
        </module>
      </union>
    </module>
  </user>
  <assistant>Where should I start?</assistant>
</schema>"#;

/// Role-play system prompts as a union inside `<system>`, a user turn and an assistant turn.
pub const ROLES: &str = r#"<schema name="roles">
  <system>
    <union default="poet">
      <module name="poet">You are a poet.</module>
      <module name="interviewer">
        You interview candidates for the <param name="position" len="3"/> position.
      </module>
    </union>
    Stay in your role.
  </system>
  <user>Hello!</user>
  <assistant>Hello, how can I help?</assistant>
</schema>"#;

/// Retrieval documents in a collection.
pub const DOCS: &str = r#"<schema name="docs">
  <system>Answer from the documents.</system>
  <user>
    Documents:
    <collection name="library">
      <module name="doc-a">Alpha is first.</module>
      <module name="doc-b">Beta comes second in line.</module>
      <module name="doc-c">Gamma.</module>
    </collection>
    Answer briefly.
  </user>
</schema>"#;

/// The Prompt Cache LongBench harness's shape: a user turn the prompt closes.
pub const OPEN_ROLE: &str = r#"<schema name="longbench">
  <system>Answer questions about the documents.</system>
  <user>
    Read the following documents.
    <module name="doc-1">The first document.</module>
    <module name="doc-2">The second document.</module>
    Answer in a few words.
</schema>"#;

fn table(
    source: &str,
    tokenizer: &PieceTokenizer,
    template: &pml_compiler::chat_template::ChatTemplate,
) -> String {
    let compiled = Compiled::new(source);
    render_layout(&compiled.layout(tokenizer, template), tokenizer)
}

#[test]
fn travel_chatml() {
    let tokenizer = PieceTokenizer::new();
    insta::assert_snapshot!(table(TRAVEL, &tokenizer, &chatml()));
}

#[test]
fn roles_chatml() {
    let tokenizer = PieceTokenizer::new();
    insta::assert_snapshot!(table(ROLES, &tokenizer, &chatml()));
}

#[test]
fn roles_gemma() {
    let tokenizer = PieceTokenizer::with_bos();
    insta::assert_snapshot!(table(ROLES, &tokenizer, &gemma()));
}

#[test]
fn collection_chatml() {
    let tokenizer = PieceTokenizer::new();
    insta::assert_snapshot!(table(DOCS, &tokenizer, &chatml()));
}

#[test]
fn open_role_gemma() {
    let tokenizer = PieceTokenizer::with_bos();
    insta::assert_snapshot!(table(OPEN_ROLE, &tokenizer, &gemma()));
}

fn unit<'a>(
    compiled: &Compiled,
    layout: &'a SchemaLayout,
    name: &str,
) -> &'a pml_compiler::plan::LayoutUnit {
    let id = compiled.index.modules_named(name)[0];
    &layout.units[unit_of(id).index()]
}

fn decode(tokenizer: &PieceTokenizer, tokens: &[u32]) -> String {
    tokenizer.decode(tokens).expect("decodes")
}

#[test]
fn units_follow_schema_order_with_paths_parents_and_scaffolds() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(TRAVEL);
    let layout = compiled.layout(&tokenizer, &chatml());
    assert_eq!(layout.units.len(), compiled.index.modules().len() + 1);
    assert_eq!(layout.units[0].kind, UnitKind::Root);
    for (id, module) in compiled.index.modules() {
        assert_eq!(layout.units[unit_of(id).index()].name, module.name_text());
    }
    let tokyo = unit(&compiled, &layout, "tokyo");
    assert_eq!(tokyo.path, ["travel-plan", "overseas", "tokyo"]);
    let overseas = unit(&compiled, &layout, "overseas");
    let plan = unit(&compiled, &layout, "travel-plan");
    assert_eq!(tokyo.parent, Some(overseas.id));
    assert_eq!(plan.parent, Some(layout.units[0].id));
    assert_eq!(tokyo.scaffold, [layout.units[0].id, plan.id, overseas.id]);
    for unit in &layout.units {
        assert!(
            unit.positions.windows(2).all(|pair| pair[0] < pair[1]),
            "{}",
            unit.name
        );
        assert!(
            unit.positions
                .iter()
                .all(|&p| unit.start <= p && p < unit.end.max(1) || unit.id.0 == 0)
        );
    }
}

#[test]
fn union_members_share_start_and_union_takes_the_longest() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(TRAVEL);
    let layout = compiled.layout(&tokenizer, &chatml());
    let domestic = unit(&compiled, &layout, "domestic");
    let overseas = unit(&compiled, &layout, "overseas");
    let tokyo = unit(&compiled, &layout, "tokyo");
    let rome = unit(&compiled, &layout, "rome");
    assert_eq!(domestic.start, overseas.start);
    assert_eq!(tokyo.start, rome.start);
    let tokyo_len = tokyo.end - tokyo.start;
    let rome_len = rome.end - rome.start;
    assert_ne!(
        tokyo_len, rome_len,
        "the test needs members of different lengths"
    );
    assert_eq!(overseas.end, tokyo.start + tokyo_len.max(rome_len));
    // The outer union ends where its longest member ends, and the plan ends with it.
    let plan = unit(&compiled, &layout, "travel-plan");
    assert_eq!(plan.end, domestic.end.max(overseas.end));
    // Nothing of the root lies inside the plan's extent.
    let root = &layout.units[0];
    assert!(
        root.positions
            .iter()
            .all(|&p| p < plan.start || p >= plan.end)
    );
}

#[test]
fn parameter_slots_reserve_len_positions() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(TRAVEL);
    let layout = compiled.layout(&tokenizer, &chatml());
    let plan = unit(&compiled, &layout, "travel-plan");
    let [duration] = plan.params.as_slice() else {
        panic!("one parameter: {:?}", plan.params);
    };
    assert_eq!(duration.name, "duration");
    assert_eq!(duration.len, 4);
    let intro = tokenizer
        .encode("I'm gearing up for a trip of ", false)
        .expect("encodes");
    assert_eq!(duration.token_offset, intro.len());
    assert_eq!(duration.start, plan.positions[duration.token_offset]);
    let slot = &plan.tokens[duration.token_offset..duration.token_offset + 4];
    // Scaffold text "one week" is 3 pieces; one placeholder pads the slot.
    assert_eq!(decode(&tokenizer, slot), "one week<pad>");
    let after = plan.positions[duration.token_offset + 4];
    assert_eq!(after, duration.start + 4);

    let domestic = unit(&compiled, &layout, "domestic");
    let city = &domestic.params[0];
    let slot = &domestic.tokens[city.token_offset..city.token_offset + 3];
    assert!(
        slot.iter()
            .all(|&token| token == tokenizer.placeholder_token())
    );
}

#[test]
fn separator_rule_between_runs() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(TRAVEL);
    let layout = compiled.layout(&tokenizer, &chatml());
    let plan = unit(&compiled, &layout, "travel-plan");
    let text = decode(&tokenizer, &plan.tokens);
    // The run after the parameter ends its line before the union: it gets the line break.
    assert!(
        text.ends_with("Help me make a plan I can follow.\n"),
        "{text:?}"
    );
    let overseas = decode(&tokenizer, &unit(&compiled, &layout, "overseas").tokens);
    assert_eq!(overseas, "I'm yearning to tread international soil.\n");
    // Before a role's close string the template owns the whitespace.
    let domestic = decode(&tokenizer, &unit(&compiled, &layout, "domestic").tokens);
    assert!(domestic.ends_with("as my base."), "{domestic:?}");
    let tokyo = decode(&tokenizer, &unit(&compiled, &layout, "tokyo").tokens);
    assert_eq!(tokyo, "Tokyo, Japan's bustling capital.");
}

#[test]
fn separator_rule_at_the_end_of_the_schema() {
    let tokenizer = PieceTokenizer::new();
    let plain = Compiled::new(
        "<schema name=\"s\">\n  Intro.\n  <module name=\"m\">\n    Body.\n  </module>\n</schema>",
    );
    let layout = plain.layout(&tokenizer, &chatml());
    assert_eq!(decode(&tokenizer, &layout.units[0].tokens), "Intro.\n");
    assert_eq!(decode(&tokenizer, &layout.units[1].tokens), "Body.");
    // A role left open continues in the prompt, so its last text keeps its line break.
    let open = Compiled::new(OPEN_ROLE);
    let layout = open.layout(&tokenizer, &chatml());
    let root = decode(&tokenizer, &layout.units[0].tokens);
    assert!(root.ends_with("Answer in a few words.\n"), "{root:?}");
    // Inline modules on their own lines are separated by the line break after the close tag.
    let doc = decode(&tokenizer, &unit(&open, &layout, "doc-1").tokens);
    assert_eq!(doc, "The first document.\n");
}

#[test]
fn collection_members_are_laid_out_one_after_another() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(DOCS);
    let layout = compiled.layout(&tokenizer, &chatml());
    let members: Vec<_> = ["doc-a", "doc-b", "doc-c"]
        .iter()
        .map(|name| unit(&compiled, &layout, name))
        .collect();
    for pair in members.windows(2) {
        assert_eq!(pair[0].end, pair[1].start);
    }
    for member in &members {
        assert_eq!(
            member.kind,
            UnitKind::CollectionMember {
                collection: "library".to_string()
            }
        );
    }
    let root = &layout.units[0];
    let after = root
        .positions
        .iter()
        .find(|&&p| p >= members[0].start)
        .copied();
    assert_eq!(after, Some(members[2].end));
}

#[test]
fn bos_takes_position_zero() {
    let tokenizer = PieceTokenizer::with_bos();
    let compiled = Compiled::new(ROLES);
    let layout = compiled.layout(&tokenizer, &gemma());
    let root = &layout.units[0];
    assert_eq!(root.tokens[0], tokenizer.bos_token().expect("bos"));
    assert_eq!(root.positions[0], 0);
    assert_eq!(root.positions[1], 1);
}

#[test]
fn src_modules_take_the_file_verbatim() {
    let tokenizer = PieceTokenizer::new();
    let source = "<schema name=\"code\">\n  <module name=\"a.py\" src=\"a.py\"/>\n  <module name=\"b.py\" src=\"b.py\"/>\n</schema>";
    let compiled = Compiled::new(source);
    let loader = MemorySourceLoader::new()
        .with_file("a.py", "def a():\n    return 1\n")
        .with_file("b.py", "def b():\n    return 2\n");
    let layout = compiled
        .try_layout_with(&tokenizer, &chatml(), &loader, 1000)
        .expect("lays out");
    // The first file keeps its line break (text follows); the last loses its trailing one.
    assert_eq!(
        decode(&tokenizer, &layout.units[1].tokens),
        "def a():\n    return 1\n"
    );
    assert_eq!(
        decode(&tokenizer, &layout.units[2].tokens),
        "def b():\n    return 2"
    );
}

#[test]
fn schema_too_long_for_the_context() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new(TRAVEL);
    let layout = compiled.layout(&tokenizer, &chatml());
    let end = layout.end_position;
    let fits = compiled.try_layout_with(&tokenizer, &chatml(), &MemorySourceLoader::new(), end + 1);
    assert!(fits.is_ok());
    let diagnostics = compiled
        .try_layout_with(&tokenizer, &chatml(), &MemorySourceLoader::new(), end)
        .expect_err("no room left for the answer");
    assert_eq!(codes(&diagnostics), ["PML301"]);
    assert!(
        diagnostics[0].message.contains(&end.to_string()),
        "{}",
        diagnostics[0].message
    );
    let diagnostics = compiled
        .try_layout_with(&tokenizer, &chatml(), &MemorySourceLoader::new(), 10)
        .expect_err("too long");
    assert!(
        diagnostics[0]
            .message
            .contains("more than the model's context of 10")
    );
    let help = diagnostics[0].help.as_deref().unwrap_or_default();
    assert!(help.contains("`travel-plan`"), "{help}");
}

#[test]
fn scaffold_longer_than_len() {
    let tokenizer = PieceTokenizer::new();
    let source = r#"<schema name="s">
  <module name="m">A <param name="p" len="2">one long week</param> trip.</module>
</schema>"#;
    let compiled = Compiled::new(source);
    let diagnostics = compiled
        .try_layout_with(&tokenizer, &chatml(), &MemorySourceLoader::new(), 1000)
        .expect_err("scaffold does not fit");
    assert_eq!(codes(&diagnostics), ["PML302"]);
    assert_eq!(
        diagnostics[0].message,
        "the scaffold text of parameter `p` takes 5 tokens but the parameter holds 2"
    );
    let span = diagnostics[0].primary_span().expect("label");
    assert_eq!(&source[span.start..span.end], "one long week");
}

#[test]
fn schema_errors_are_returned_before_layout() {
    let tokenizer = PieceTokenizer::new();
    let compiled = Compiled::new("<schema name=\"s\"><module>unnamed</module></schema>");
    let diagnostics = compiled
        .try_layout_with(&tokenizer, &chatml(), &MemorySourceLoader::new(), 1000)
        .expect_err("schema has errors");
    assert_eq!(codes(&diagnostics), ["PML101"]);
}
