//! A question as PML: a schema whose user turn holds the documents as members of one
//! `<collection>` (each a module encoded once), and a prompt that imports every member in the
//! question's order and adds the question as new text before closing the turn.

use super::data::Question;

/// The schema every question of a run is laid out under (its name; the layout differs).
pub const SCHEMA_NAME: &str = "qa";

/// The system instruction: short answers, so F1 against short gold answers is meaningful.
pub const INSTRUCTION: &str = "You answer questions using the documents the user gives. Reply \
with the answer only: a few words, no explanation and no full sentence.";

/// The module name of document `index`.
fn member(index: usize) -> String {
    format!("doc-{index}")
}

/// The schema of `question`.
pub fn schema(question: &Question) -> String {
    let mut source = format!(
        "<schema name=\"{SCHEMA_NAME}\">\n<system>{}</system>\n<user>\nDocuments:\n\
         <collection name=\"documents\">\n",
        escape(INSTRUCTION)
    );
    for (index, document) in question.documents.iter().enumerate() {
        source.push_str(&format!(
            "<module name=\"{}\">Title: {}\n{}\n</module>\n",
            member(index),
            escape(&single_line(&document.title)),
            escape(&single_line(&document.text)),
        ));
    }
    source.push_str("</collection>\n</schema>\n");
    source
}

/// The prompt of `question`: every document imported in order, then the question.
pub fn prompt(question: &Question) -> String {
    let imports: String = (0..question.documents.len())
        .map(|index| format!("<{}/>", member(index)))
        .collect();
    format!(
        "<prompt schema=\"{SCHEMA_NAME}\">\n{imports}\nQuestion: {}\n</user>\n</prompt>\n",
        escape(&single_line(&question.question))
    )
}

/// `text` with its line breaks made spaces: a document is one paragraph, and a blank line could
/// not end a text run early.
pub fn single_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `text` as PML character data.
pub fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::data::Document;

    #[test]
    fn schema_and_prompt_parse_and_escape_markup() {
        let question = Question {
            id: "1".into(),
            question: "Is 1 < 2 & 3 > 2?".into(),
            answers: vec!["yes".into()],
            documents: vec![
                Document {
                    title: "A <b>".into(),
                    text: "x &amp y\n\nz".into(),
                },
                Document {
                    title: "B".into(),
                    text: "w".into(),
                },
            ],
        };
        let schema = schema(&question);
        let prompt = prompt(&question);
        for source in [&schema, &prompt] {
            let parsed = pml_syntax::parse(source);
            assert!(
                parsed.diagnostics.iter().all(|d| !d.is_error()),
                "{source}\n{:?}",
                parsed.diagnostics
            );
        }
        assert!(schema.contains("x &amp;amp y z"));
        assert!(prompt.contains("<doc-0/><doc-1/>"));
        assert!(prompt.contains("1 &lt; 2 &amp; 3 &gt; 2"));
    }
}
