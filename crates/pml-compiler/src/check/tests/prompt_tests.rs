//! Prompt rules `PML2xx` against the travel schema of the test helpers.

use super::{WORD_LENGTH_TOKENIZER, codes, primary_text};
use crate::check::{PromptCheckOptions, check_prompt};
use crate::schema_index::SchemaIndex;
use crate::test_sources::{TRAVEL, parse_prompt, parse_schema};
use pml_syntax::Diagnostic;

fn travel_index() -> SchemaIndex {
    SchemaIndex::build(&parse_schema(TRAVEL))
}

fn prompt_diagnostics(source: &str) -> Vec<Diagnostic> {
    check_prompt(
        &parse_prompt(source),
        &travel_index(),
        &PromptCheckOptions::default(),
    )
}

fn prompt_diagnostics_with_tokenizer(source: &str) -> Vec<Diagnostic> {
    check_prompt(
        &parse_prompt(source),
        &travel_index(),
        &PromptCheckOptions {
            tokenizer: Some(&WORD_LENGTH_TOKENIZER),
        },
    )
}

fn assert_clean(source: &str) {
    let diagnostics = prompt_diagnostics_with_tokenizer(source);
    assert!(
        diagnostics.is_empty(),
        "expected no diagnostics, got {diagnostics:#?}"
    );
}

#[test]
fn correct_prompts_are_clean() {
    assert_clean(
        r#"<prompt schema="travel"><travel-plan duration="3 days"><overseas><tokyo/></overseas></travel-plan>Surf?</prompt>"#,
    );
    assert_clean(
        r#"<prompt schema="travel">
  Before.
  <travel-plan><domestic city="Santa Fe"/></travel-plan>
  <note-sleep/> <note-food/> <note-sleep/>
  <packing-list/>
  </user>
  <assistant>Sure.</assistant>
  <user>Where to eat?</user>
</prompt>"#,
    );
    assert_clean(r#"<prompt schema="travel"><user><travel-plan/></user></prompt>"#);
}

#[test]
fn pml201_missing_schema_attribute() {
    let diagnostics = prompt_diagnostics("<prompt><travel-plan/></prompt>");
    assert_eq!(codes(&diagnostics), ["PML201"]);
    let typo = prompt_diagnostics(r#"<prompt shema="travel"><travel-plan/></prompt>"#);
    assert_eq!(codes(&typo), ["PML201"]);
    assert_eq!(
        typo[0].help.as_deref(),
        Some("write the attribute as `schema=\"...\"`")
    );
    let empty = prompt_diagnostics(r#"<prompt schema=" "><travel-plan/></prompt>"#);
    assert_eq!(codes(&empty), ["PML201"]);
}

#[test]
fn pml202_schema_name_mismatch() {
    let source = r#"<prompt schema="cooking"><travel-plan/></prompt>"#;
    let diagnostics = prompt_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML202"]);
    assert_eq!(
        diagnostics[0].message,
        "prompt written for schema `cooking` is checked against schema `travel`"
    );
    assert_eq!(primary_text(source, &diagnostics[0]), "cooking");
}

#[test]
fn pml205_unknown_module_with_suggestions() {
    let source = r#"<prompt schema="travel">
  <travel-plans/>
  <travel-plan><domestc/><city/></travel-plan>
  <kitchen/>
  <notes/>
  <tokio/>
</prompt>"#;
    let diagnostics = prompt_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML205"; 6]);
    let helps: Vec<&str> = diagnostics
        .iter()
        .filter_map(|diagnostic| diagnostic.help.as_deref())
        .collect();
    assert_eq!(helps[0], "did you mean `travel-plan`?");
    assert_eq!(helps[1], "did you mean `domestic`?");
    assert_eq!(
        helps[2],
        "modules that can be imported here: `domestic`, `overseas`"
    );
    assert_eq!(
        helps[3],
        "modules that can be imported here: `travel-plan`, `note-food`, `note-sleep`, `packing-list`"
    );
    assert_eq!(
        helps[4],
        "`notes` is a collection: import its members by name, such as `<note-food/>`"
    );
    assert_eq!(
        helps[5],
        "did you mean `tokyo`? (declared elsewhere in the schema)"
    );
    assert_eq!(
        diagnostics[0].message,
        "schema `travel` has no module `travel-plans`"
    );
    assert_eq!(primary_text(source, &diagnostics[0]), "travel-plans");
}

#[test]
fn pml205_parameter_used_as_a_tag() {
    let diagnostics = prompt_diagnostics(
        r#"<prompt schema="travel"><travel-plan><duration/></travel-plan></prompt>"#,
    );
    assert_eq!(codes(&diagnostics), ["PML205"]);
    assert_eq!(
        diagnostics[0].help.as_deref(),
        Some(
            "`duration` is a parameter of `travel-plan`: pass it as an attribute, `<travel-plan duration=\"...\">`"
        )
    );
}

#[test]
fn pml205_children_of_unknown_imports_are_not_reported() {
    let diagnostics = prompt_diagnostics(
        r#"<prompt schema="travel"><nowhere x="1">text<also-unknown/></nowhere></prompt>"#,
    );
    assert_eq!(codes(&diagnostics), ["PML205"]);
}

#[test]
fn pml206_nested_import_outside_its_parent() {
    let source = r#"<prompt schema="travel"><tokyo/></prompt>"#;
    let diagnostics = prompt_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML206"]);
    assert_eq!(
        diagnostics[0].message,
        "`tokyo` is nested in `overseas` and cannot be imported here"
    );
    assert_eq!(
        diagnostics[0].help.as_deref(),
        Some(
            "import it through its parents, at the top level of the prompt: `<travel-plan><overseas><tokyo/></overseas></travel-plan>`"
        )
    );
    let inside = prompt_diagnostics(
        r#"<prompt schema="travel"><travel-plan><tokyo/></travel-plan></prompt>"#,
    );
    assert_eq!(codes(&inside), ["PML206"]);
    assert_eq!(
        inside[0].help.as_deref(),
        Some(
            "import it through its parents, inside `travel-plan`: `<overseas><tokyo/></overseas>`"
        )
    );
}

#[test]
fn pml206_top_level_module_imported_inside_another() {
    let diagnostics = prompt_diagnostics(
        r#"<prompt schema="travel"><travel-plan><packing-list/></travel-plan></prompt>"#,
    );
    assert_eq!(codes(&diagnostics), ["PML206"]);
    assert_eq!(
        diagnostics[0].message,
        "`packing-list` is a top-level module and cannot be imported in `travel-plan`"
    );
    assert_eq!(
        diagnostics[0].help.as_deref(),
        Some("import it through its parents, at the top level of the prompt: `<packing-list/>`")
    );
}

#[test]
fn pml207_two_members_of_one_union() {
    let source =
        r#"<prompt schema="travel"><travel-plan><domestic/><overseas/></travel-plan></prompt>"#;
    let diagnostics = prompt_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML207"]);
    assert_eq!(
        diagnostics[0].message,
        "`overseas` and `domestic` are alternatives of one union"
    );
    assert_eq!(primary_text(source, &diagnostics[0]), "overseas");
    assert_eq!(diagnostics[0].labels.len(), 2);
    let nested = prompt_diagnostics(
        r#"<prompt schema="travel"><travel-plan><overseas><rome/><tokyo/></overseas></travel-plan></prompt>"#,
    );
    assert_eq!(
        codes(&nested),
        ["PML207"],
        "union members share a position: no order warning"
    );
}

#[test]
fn pml208_duplicate_import() {
    let source = r#"<prompt schema="travel"><packing-list/> <packing-list/></prompt>"#;
    let diagnostics = prompt_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML208"]);
    assert!(
        diagnostics[0]
            .primary_span()
            .is_some_and(|span| span.start > source.find("/>").unwrap_or(0))
    );
    let repeated_parent = prompt_diagnostics(
        r#"<prompt schema="travel"><travel-plan><overseas/></travel-plan><travel-plan><overseas/></travel-plan></prompt>"#,
    );
    assert_eq!(
        codes(&repeated_parent),
        ["PML208"],
        "children of a repeated import are not reported again"
    );
}

#[test]
fn pml208_collection_members_may_repeat() {
    assert_clean(
        r#"<prompt schema="travel"><note-food/><note-food/><note-sleep/><note-food/></prompt>"#,
    );
}

#[test]
fn pml209_unknown_argument() {
    let source = r#"<prompt schema="travel">
  <travel-plan durration="3 days" city="Rome"><overseas mood="calm"/></travel-plan>
</prompt>"#;
    let diagnostics = prompt_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML209"; 3]);
    assert_eq!(
        diagnostics[0].message,
        "`travel-plan` has no parameter `durration`"
    );
    assert_eq!(
        diagnostics[0].help.as_deref(),
        Some("did you mean `duration`?")
    );
    assert_eq!(
        diagnostics[1].help.as_deref(),
        Some("parameters of `travel-plan`: `duration`")
    );
    assert_eq!(
        diagnostics[2].help.as_deref(),
        Some("`overseas` takes no arguments")
    );
    assert_eq!(primary_text(source, &diagnostics[2]), "mood");
}

#[test]
fn pml210_argument_too_long_with_a_tokenizer() {
    let source = r#"<prompt schema="travel"><travel-plan duration="one two three four"><domestic city="New York"/></travel-plan></prompt>"#;
    let diagnostics = prompt_diagnostics_with_tokenizer(source);
    assert_eq!(codes(&diagnostics), ["PML210"]);
    assert_eq!(
        diagnostics[0].message,
        "argument `duration` takes 4 tokens but the parameter holds 3"
    );
    assert_eq!(primary_text(source, &diagnostics[0]), "one two three four");
    assert!(
        diagnostics[0]
            .help
            .as_deref()
            .is_some_and(|help| help.contains("at most 3 tokens"))
    );
}

#[test]
fn pml210_skipped_without_a_tokenizer() {
    let diagnostics = prompt_diagnostics(
        r#"<prompt schema="travel"><travel-plan duration="one two three four five"/></prompt>"#,
    );
    assert!(diagnostics.is_empty(), "{diagnostics:#?}");
}

#[test]
fn pml211_text_inside_an_import() {
    let source = r#"<prompt schema="travel">
  <travel-plan>Also Kyoto. <overseas><tokyo/> and more</overseas>
    <user>hi</user>
  </travel-plan>
</prompt>"#;
    let diagnostics = prompt_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML211"; 3]);
    assert_eq!(
        diagnostics[0].message,
        "text inside the import of `travel-plan`"
    );
    assert_eq!(
        diagnostics[1].message,
        "text inside the import of `overseas`"
    );
    assert_eq!(
        diagnostics[2].message,
        "a role block inside the import of `travel-plan`"
    );
    assert_clean(
        "<prompt schema=\"travel\"><travel-plan>\n   <domestic/>\n</travel-plan></prompt>",
    );
}

#[test]
fn pml212_imports_out_of_schema_order() {
    let source = r#"<prompt schema="travel"><packing-list/><note-food/><travel-plan/></prompt>"#;
    let diagnostics = prompt_diagnostics(source);
    assert_eq!(codes(&diagnostics), ["PML212"]);
    assert!(!diagnostics[0].is_error());
    assert_eq!(
        diagnostics[0].message,
        "`travel-plan` is imported after `packing-list` but comes before it in the schema"
    );
    assert_eq!(primary_text(source, &diagnostics[0]), "travel-plan");
    let across_roles = prompt_diagnostics(
        r#"<prompt schema="travel"><user><packing-list/></user><travel-plan/></prompt>"#,
    );
    assert_eq!(
        codes(&across_roles),
        ["PML212"],
        "role blocks do not reset the order"
    );
}

#[test]
fn pml213_role_close_must_match_an_open_schema_role() {
    let diagnostics =
        prompt_diagnostics(r#"<prompt schema="travel"><travel-plan/></system></prompt>"#);
    assert_eq!(codes(&diagnostics), ["PML213"]);
    assert_eq!(
        diagnostics[0].message,
        "`</system>` closes a role that is not open"
    );
    assert!(
        diagnostics[0]
            .help
            .as_deref()
            .is_some_and(|help| help.contains("leaves no `<system>` open"))
    );
}

#[test]
fn pml213_closing_twice() {
    let diagnostics = prompt_diagnostics(
        r#"<prompt schema="travel"><travel-plan/></user> text </user></prompt>"#,
    );
    assert_eq!(codes(&diagnostics), ["PML213"]);
    assert!(
        diagnostics[0]
            .help
            .as_deref()
            .is_some_and(|help| help.contains("already closed"))
    );
}

#[test]
fn several_mistakes_in_one_prompt() {
    let diagnostics = prompt_diagnostics(
        r#"<prompt schema="travel"><packing-list/><travel-plan durations="x">hi<rome/></travel-plan><packing-list/></prompt>"#,
    );
    assert_eq!(
        codes(&diagnostics),
        ["PML212", "PML209", "PML211", "PML206", "PML208"]
    );
}
