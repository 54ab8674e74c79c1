//! `pml eval --edits`: the edited-fact set and edit reuse (AttMemo's reuse of similar inputs).
//!
//! An edited question is a QA question whose gold answer appears in its documents, with every
//! occurrence replaced by another fact of the same kind (a number moved by 7, a name or phrase
//! swapped for another question's answer that its documents do not mention): the question's
//! answer is now the changed fact. Its documents are one module (a 1k–4k-token text cached
//! whole, as a prefix cache holds a document sent before); the original text is encoded, then
//! the edited prompt runs:
//! - `full`: every token of the edited prompt computed (the reference);
//! - `prefix`: the cached rows before the first change reused, the rest computed (exact);
//! - `edit …`: every unchanged token's row reused at its new position
//!   ([`pml_runtime::inference::edit`]), the changed tokens and the question computed, in
//!   each compared mode: `reuse` recomputes nothing more (as llama.cpp's `--cache-reuse`
//!   shifts chunks), `blend` also the cached tokens its ranking picks.

use std::time::Instant;

use anyhow::Context;
use pml_compiler::RefuseSources;
use pml_runtime::inference::edit::rebind_edited;
use pml_runtime::inference::{InferenceMode, LaidOutSchema, Runtime, SplicePlan};

use super::data::{Document, Question};
use super::runner::{EvalMode, QuestionResult, decode, score};
use super::sources::{escape, single_line};

/// The schema every edited question is laid out under.
const SCHEMA_NAME: &str = "edited";
/// The module holding the documents.
const DOCUMENTS: &str = "documents";

/// A question whose answer was changed in its documents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EditedQuestion {
    pub original: Question,
    /// The question with the changed documents; its answer is the new fact.
    pub edited: Question,
    pub old_answer: String,
}

/// The edited questions of `questions`: those whose first gold answer (not yes or no) appears in
/// their documents and has a substitute of its kind.
pub fn edited_questions(questions: &[Question]) -> Vec<EditedQuestion> {
    let answers: Vec<&str> = questions
        .iter()
        .filter_map(|question| question.answers.first().map(String::as_str))
        .collect();
    let mut edited = Vec::new();
    for (index, question) in questions.iter().enumerate() {
        let Some(answer) = question.answers.first() else {
            continue;
        };
        let mentions = |text: &str| {
            question
                .documents
                .iter()
                .any(|document| document.text.contains(text) || document.title.contains(text))
        };
        if matches!(answer.to_lowercase().as_str(), "yes" | "no") || !mentions(answer) {
            continue;
        }
        let substitute = match answer.parse::<u64>() {
            Ok(number) => number.checked_add(7).map(|moved| moved.to_string()),
            // Another question's answer of the same kind, the next one round the set.
            Err(_) => (1..answers.len())
                .map(|step| answers[(index + step) % answers.len()])
                .find(|other| {
                    other.parse::<u64>().is_err()
                        && !matches!(other.to_lowercase().as_str(), "yes" | "no")
                        && *other != answer
                        && !mentions(other)
                        && !other.contains(answer.as_str())
                })
                .map(str::to_string),
        };
        let Some(substitute) = substitute else {
            continue;
        };
        let documents = question
            .documents
            .iter()
            .map(|document| Document {
                title: document.title.replace(answer.as_str(), &substitute),
                text: document.text.replace(answer.as_str(), &substitute),
            })
            .collect();
        edited.push(EditedQuestion {
            original: question.clone(),
            edited: Question {
                id: format!("{}-edited", question.id),
                question: question.question.clone(),
                answers: vec![substitute],
                documents,
            },
            old_answer: answer.clone(),
        });
    }
    edited
}

/// The schema of `question`: its documents as one module.
fn schema(question: &Question) -> String {
    let mut text = String::new();
    for document in &question.documents {
        text.push_str(&format!(
            "Title: {}\n{}\n",
            escape(&single_line(&document.title)),
            escape(&single_line(&document.text)),
        ));
    }
    format!(
        "<schema name=\"{SCHEMA_NAME}\">\n<system>{}</system>\n<user>\nDocuments:\n\
         <module name=\"{DOCUMENTS}\">{text}</module>\n</schema>\n",
        escape(super::sources::INSTRUCTION)
    )
}

fn prompt(question: &Question) -> String {
    format!(
        "<prompt schema=\"{SCHEMA_NAME}\">\n<{DOCUMENTS}/>\nQuestion: {}\n</user>\n</prompt>\n",
        escape(&single_line(&question.question))
    )
}

/// The token ids of an edited question's prompts, for running the same tokens through another
/// engine (`--prompts-out`: llama.cpp's `--cache-reuse`, `scripts/edit_reuse_llama.py`).
#[derive(Clone, Debug, serde::Serialize)]
pub struct EditedPrompts {
    pub id: String,
    pub original: Vec<u32>,
    pub edited: Vec<u32>,
}

/// Runs `question`: its original documents encoded, then `full` on the edited prompt (the
/// reference), `prefix`, and every one of `modes` on the edit-reused prompt.
pub fn run_edited_question(
    runtime: &Runtime,
    question: &EditedQuestion,
    modes: &[(String, InferenceMode)],
    horizon: usize,
) -> anyhow::Result<(QuestionResult, EditedPrompts)> {
    let lay_out = |question: &Question| -> anyhow::Result<LaidOutSchema> {
        runtime
            .lay_out(&schema(question), &RefuseSources)
            .context("laying out the question's schema")
    };
    let old = lay_out(&question.original)?;
    let new = lay_out(&question.edited)?;
    let bound = runtime
        .bind(&new, &prompt(&question.edited))
        .context("binding the edited prompt")?;
    let original_bound = runtime
        .bind(&old, &prompt(&question.original))
        .context("binding the original prompt")?;
    let edited_plan = SplicePlan::new(&new.layout, &bound)?;
    // A question too long for the context is skipped before its documents are encoded.
    runtime.check_context(&edited_plan, horizon)?;
    let prompts = EditedPrompts {
        id: question.edited.id.clone(),
        original: SplicePlan::new(&old.layout, &original_bound)?.all_tokens,
        edited: edited_plan.all_tokens,
    };
    let encode_start = Instant::now();
    runtime
        .encode(&old.layout, &mut |_| {})
        .context("encoding the original documents")?;
    let encode_ms = encode_start.elapsed().as_secs_f64() * 1e3;

    let full = EvalMode::Cached(InferenceMode::Full);
    let reference = decode(runtime, &new.layout, &bound, full, None, horizon)?;
    let edited = &question.edited;
    let mut results = vec![score(edited, "full", &reference, &reference, horizon)];
    let prefix_bound = rebind_edited(&old.layout, &new.layout, &bound, true)?;
    let reuse = EvalMode::Cached(InferenceMode::Reuse);
    let prefix = decode(
        runtime,
        &old.layout,
        &prefix_bound,
        reuse,
        Some(&reference),
        horizon,
    )
    .context("mode prefix")?;
    results.push(score(edited, "prefix", &prefix, &reference, horizon));
    let edit_bound = rebind_edited(&old.layout, &new.layout, &bound, false)?;
    for (label, mode) in modes {
        let decoded = decode(
            runtime,
            &old.layout,
            &edit_bound,
            EvalMode::Cached(*mode),
            Some(&reference),
            horizon,
        )
        .with_context(|| format!("mode {label}"))?;
        results.push(score(edited, label, &decoded, &reference, horizon));
    }
    let result = QuestionResult {
        id: edited.id.clone(),
        question: edited.question.clone(),
        answers: edited.answers.clone(),
        encode_ms,
        modes: results,
        edited_from: Some(question.old_answer.clone()),
        store_bytes: None,
        first_token_margin: Some(reference.first_token_margin()),
    };
    Ok((result, prompts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn question(id: &str, answer: &str, text: &str) -> Question {
        Question {
            id: id.into(),
            question: format!("q{id}"),
            answers: vec![answer.into()],
            documents: vec![Document {
                title: "T".into(),
                text: text.into(),
            }],
        }
    }

    #[test]
    fn answers_in_the_documents_are_changed_to_a_fact_of_their_kind() {
        let questions = [
            question(
                "1",
                "1901",
                "It opened in 1901 and closed in 1950; 1901 again.",
            ),
            question("2", "Ada Lovelace", "Ada Lovelace wrote the notes."),
            question("3", "yes", "yes it is"),
            question("4", "Paris", "Nothing about it."),
            question("5", "Charles Babbage", "Charles Babbage designed it."),
        ];
        let edited = edited_questions(&questions);
        let ids: Vec<&str> = edited.iter().map(|e| e.original.id.as_str()).collect();
        assert_eq!(ids, ["1", "2", "5"]);
        assert_eq!(edited[0].edited.answers, ["1908"]);
        assert_eq!(
            edited[0].edited.documents[0].text,
            "It opened in 1908 and closed in 1950; 1908 again."
        );
        assert_eq!(edited[0].old_answer, "1901");
        // The next answer round the set that is a phrase and not in the documents.
        assert_eq!(edited[1].edited.answers, ["Paris"]);
        assert_eq!(edited[1].edited.documents[0].text, "Paris wrote the notes.");
        assert_eq!(edited[2].edited.answers, ["Ada Lovelace"]);
    }

    #[test]
    fn schema_and_prompt_parse() {
        let question = question("1", "1901", "It opened in 1901 <then> & closed.");
        for source in [schema(&question), prompt(&question)] {
            let parsed = pml_syntax::parse(&source);
            assert!(
                parsed.diagnostics.iter().all(|d| !d.is_error()),
                "{source}\n{:?}",
                parsed.diagnostics
            );
        }
    }
}
