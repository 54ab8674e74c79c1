//! The QA files of `../shared/eval/` read into one shape: a question, its gold answers and the
//! documents to answer from.
//!
//! - HotpotQA distractor (`[{question, answer, context: [[title, [sentences]]]}]`): the ten
//!   paragraphs in the file's order.
//! - NQ-open with oracle passages (`.jsonl` or `.jsonl.gz`, `{question, answers[], ctxs[{title,
//!   text}]}`): the gold passage among distractors, which are other questions' gold passages
//!   chosen with the seed; the gold passage's place is drawn with the seed too.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use anyhow::{Context, bail};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;

/// One question with its documents.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Question {
    pub id: String,
    pub question: String,
    pub answers: Vec<String>,
    pub documents: Vec<Document>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Document {
    pub title: String,
    pub text: String,
}

/// Which format a file holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Dataset {
    Hotpotqa,
    Nq,
}

/// Reads `path` as `dataset`; NQ questions get `distractors` other passages each.
pub fn load(
    path: &Path,
    dataset: Dataset,
    seed: u64,
    distractors: usize,
) -> anyhow::Result<Vec<Question>> {
    let mut text = String::new();
    let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let gzipped = path.extension().is_some_and(|extension| extension == "gz");
    let mut reader: Box<dyn Read> = if gzipped {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    reader
        .read_to_string(&mut text)
        .with_context(|| format!("reading {}", path.display()))?;
    match dataset {
        Dataset::Hotpotqa => hotpotqa(&text),
        Dataset::Nq => nq(&text, seed, distractors),
    }
    .with_context(|| format!("parsing {} as {dataset:?}", path.display()))
}

#[derive(Deserialize)]
struct HotpotRecord {
    #[serde(rename = "_id")]
    id: String,
    question: String,
    answer: String,
    context: Vec<(String, Vec<String>)>,
}

fn hotpotqa(text: &str) -> anyhow::Result<Vec<Question>> {
    let records: Vec<HotpotRecord> = serde_json::from_str(text)?;
    Ok(records
        .into_iter()
        .map(|record| Question {
            id: record.id,
            question: record.question,
            answers: vec![record.answer],
            documents: record
                .context
                .into_iter()
                .map(|(title, sentences)| Document {
                    title,
                    text: sentences.concat().trim().to_string(),
                })
                .collect(),
        })
        .collect())
}

#[derive(Deserialize)]
struct NqRecord {
    question: String,
    answers: Vec<String>,
    ctxs: Vec<NqPassage>,
}

#[derive(Deserialize)]
struct NqPassage {
    title: String,
    text: String,
}

fn nq(text: &str, seed: u64, distractors: usize) -> anyhow::Result<Vec<Question>> {
    let mut records = Vec::new();
    for (line_idx, line) in BufReader::new(text.as_bytes()).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let record: NqRecord = serde_json::from_str(&line)
            .with_context(|| format!("line {} is not an NQ-open record", line_idx + 1))?;
        records.push(record);
    }
    if records.len() <= distractors {
        bail!(
            "{} questions cannot give {distractors} distractors each",
            records.len()
        );
    }
    let gold: Vec<Option<Document>> = records
        .iter()
        .map(|record| {
            record.ctxs.first().map(|passage| Document {
                title: passage.title.clone(),
                text: passage.text.trim().to_string(),
            })
        })
        .collect();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut questions = Vec::with_capacity(records.len());
    for (index, record) in records.into_iter().enumerate() {
        let Some(own) = gold[index].clone() else {
            continue;
        };
        let mut others: Vec<usize> = (0..gold.len())
            .filter(|&other| other != index && gold[other].is_some())
            .collect();
        others.shuffle(&mut rng);
        let mut documents: Vec<Document> = others
            .iter()
            .take(distractors)
            .filter_map(|&other| gold[other].clone())
            .collect();
        documents.insert(rng.random_range(0..=documents.len()), own);
        questions.push(Question {
            id: format!("nq-{index}"),
            question: record.question,
            answers: record.answers,
            documents,
        });
    }
    Ok(questions)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hotpotqa_records_become_questions() {
        let text = r#"[{"_id": "a1", "question": "Q?", "answer": "yes", "type": "comparison",
            "context": [["T1", ["One.", " Two."]], ["T2", ["Three."]]]}]"#;
        let questions = hotpotqa(text).expect("parses");
        assert_eq!(questions.len(), 1);
        assert_eq!(questions[0].answers, ["yes"]);
        assert_eq!(questions[0].documents[0].text, "One. Two.");
        assert_eq!(questions[0].documents[1].title, "T2");
    }

    #[test]
    fn nq_questions_get_their_gold_passage_among_distractors() {
        let line = |i: usize| {
            format!(
                r#"{{"question": "q{i}", "answers": ["a{i}"], "ctxs": [{{"title": "t{i}", "text": "p{i}"}}]}}"#
            )
        };
        let text: String = (0..5).map(|i| line(i) + "\n").collect();
        let questions = nq(&text, 7, 3).expect("parses");
        assert_eq!(questions.len(), 5);
        for (i, question) in questions.iter().enumerate() {
            assert_eq!(question.documents.len(), 4);
            let titles: Vec<&str> = question
                .documents
                .iter()
                .map(|d| d.title.as_str())
                .collect();
            assert_eq!(
                titles.iter().filter(|&&t| t == format!("t{i}")).count(),
                1,
                "{titles:?}"
            );
        }
        assert_eq!(nq(&text, 7, 3).expect("parses"), questions, "seeded");
        assert!(nq(&text, 7, 5).is_err());
        assert!(nq("not json", 7, 0).is_err());
    }
}
