//! Real chat templates rendered by PML (minijinja, `template_render`) against Python's jinja2 as
//! Hugging Face transformers renders them: llama.cpp's `models/templates/*.jinja` of the families
//! PML runs, each for a fixed set of conversations (system, multi-turn, tools, a tool round trip),
//! rendered by `scripts/template_reference.py` into the committed fixture. A conversation the
//! template refuses (`raise_exception`) must be refused here too.
//!
//! The templates come from `scripts/fetch-llama-cpp-testdata.sh`; absent, the test skips, or
//! fails under `PML_REQUIRE_MODELS=1`.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use minijinja::{Value, context};
use pml_compiler::template_render::{TEMPLATE_NAME, TemplateDate, template_environment};
use pml_testkit::llama_cpp_models;
use serde::Deserialize;
use sha2::{Digest, Sha256};

#[derive(Deserialize)]
struct Fixture {
    date: String,
    bos_token: String,
    eos_token: String,
    conversations: BTreeMap<String, Conversation>,
    templates: BTreeMap<String, Template>,
}

#[derive(Deserialize)]
struct Conversation {
    messages: serde_json::Value,
    #[serde(default)]
    tools: Option<serde_json::Value>,
    add_generation_prompt: bool,
}

#[derive(Deserialize)]
struct Template {
    sha256: String,
    cases: BTreeMap<String, Case>,
}

#[derive(Deserialize)]
struct Case {
    text: Option<String>,
    error: Option<String>,
}

/// The one known difference: minijinja iterates `none` as an empty sequence where jinja2 raises
/// `TypeError: 'NoneType' object is not iterable`. It shows where a template loops over `tools`
/// unguarded and a conversation has none (Hermes' tool-use templates, meant only for requests
/// with tools): jinja2 refuses the render, PML renders the prompt without tools. Listed whole,
/// so any other difference fails.
const NONE_ITERATION: &str = "TypeError: 'NoneType' object is not iterable";

fn is_known_divergence(template: &str, jinja2_error: &str) -> bool {
    template.starts_with("NousResearch-Hermes-") && jinja2_error == NONE_ITERATION
}

fn fixture() -> Fixture {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/reference/chat-templates-jinja2.json");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("reference fixture {}: {error}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|error| panic!("{}: {error}", path.display()))
}

#[test]
fn templates_render_as_jinja2_renders_them() {
    let Some(models) = llama_cpp_models() else {
        return;
    };
    let fixture = fixture();
    let date: Vec<i64> = fixture
        .date
        .split('-')
        .map(|part| part.parse().expect("a date"))
        .collect();
    let date = TemplateDate::Fixed {
        year: date[0] as i32,
        month: date[1] as u32,
        day: date[2] as u32,
    };
    assert!(
        fixture.templates.len() >= 10,
        "too few templates in the fixture"
    );
    let mut failures = Vec::new();
    let mut compared = 0;
    let mut known = 0;
    for (name, expected) in &fixture.templates {
        let path = models.join("templates").join(name);
        let source = std::fs::read_to_string(&path)
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        let sha256 = format!("{:x}", Sha256::digest(source.as_bytes()));
        assert_eq!(
            sha256, expected.sha256,
            "{name} is not the file the fixture rendered"
        );
        let environment = template_environment(&source, date)
            .unwrap_or_else(|error| panic!("{name} does not compile: {error:#}"));
        let template = environment.get_template(TEMPLATE_NAME).expect("registered");
        for (conversation_name, case) in &expected.cases {
            let conversation = &fixture.conversations[conversation_name];
            let rendered = template.render(context! {
                messages => Value::from_serialize(&conversation.messages),
                tools => Value::from_serialize(&conversation.tools),
                add_generation_prompt => conversation.add_generation_prompt,
                bos_token => fixture.bos_token.as_str(),
                eos_token => fixture.eos_token.as_str(),
            });
            compared += 1;
            match (&case.text, &case.error, rendered) {
                (Some(text), _, Ok(ours)) if &ours == text => {}
                (Some(text), _, Ok(ours)) => failures.push(format!(
                    "{name} / {conversation_name}: renders differently\n--- jinja2\n{text}\n--- pml\n{ours}"
                )),
                (Some(_), _, Err(error)) => failures.push(format!(
                    "{name} / {conversation_name}: jinja2 renders it, pml fails: {error:#}"
                )),
                (None, Some(_), Err(_)) => {}
                (None, Some(theirs), Ok(_)) if is_known_divergence(name, theirs) => {
                    known += 1;
                }
                (None, Some(theirs), Ok(_)) => failures.push(format!(
                    "{name} / {conversation_name}: jinja2 refuses it ({theirs}), pml renders it"
                )),
                (None, None, _) => panic!("{name} / {conversation_name}: an empty case"),
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {compared} renders differ from jinja2:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    eprintln!(
        "{} templates, {compared} renders: all as jinja2's but {known} where jinja2 refuses to \
         iterate none",
        fixture.templates.len()
    );
    assert_eq!(known, 8, "the known divergence changed");
}
