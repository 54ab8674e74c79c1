//! What `pml bench cache` times: every example prompt under a folder of schemas (each with the
//! schema it names), and generated document prompts — a system prompt and one document module of
//! about N tokens, then a short question as the only new text.

use std::path::{Path, PathBuf};

use pml_commands::failure::Failure;
use pml_commands::pipeline::{CheckedFile, SourceText, check};
use pml_compiler::Tokenizer;
use pml_syntax::ast::SourceFile;

/// The default document: HotpotQA's Wikipedia paragraphs (see `crates/pml-bench/data/README.md`).
pub const DEFAULT_DOCUMENT: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/bench-document.txt"
));

/// HotpotQA's first question, answered by the document's first two paragraphs.
pub const DEFAULT_QUESTION: &str = "Were Scott Derrickson and Ed Wood of the same nationality?";

/// Tokens a document prompt spends besides its document (system turn, roles, question), so the
/// whole prompt comes out near its nominal size.
const DOCUMENT_PROMPT_OVERHEAD_TOKENS: usize = 64;

/// One prompt to time, with its schema.
#[derive(Clone, Debug)]
pub struct Case {
    /// Shown in the table: the prompt's path below the schemas folder, or `document-N`.
    pub name: String,
    pub schema: SourceText,
    pub prompt: SourceText,
}

/// Every prompt file under `folder` (recursively, sorted) whose name contains `filter`, with the
/// schema `pmlc check` finds for it. A prompt with errors stops the benchmark.
pub fn example_cases(folder: &Path, filter: Option<&str>) -> Result<Vec<Case>, Failure> {
    let mut files = Vec::new();
    collect_pml_files(folder, &mut files)
        .map_err(|error| Failure::usage(format!("cannot list `{}`: {error}", folder.display())))?;
    files.sort();
    let mut cases = Vec::new();
    for path in files {
        let name = path
            .strip_prefix(folder)
            .unwrap_or(&path)
            .with_extension("")
            .display()
            .to_string();
        if filter.is_some_and(|filter| !name.contains(filter)) {
            continue;
        }
        let prompt = SourceText::read(&path)?;
        if !matches!(pml_syntax::parse(&prompt.text).file, SourceFile::Prompt(_)) {
            continue;
        }
        let CheckedFile::Prompt { schema_path } = check(&prompt, None, false)? else {
            continue;
        };
        cases.push(Case {
            name,
            schema: SourceText::read(&schema_path)?,
            prompt,
        });
    }
    Ok(cases)
}

fn collect_pml_files(folder: &Path, files: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(folder)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_pml_files(&path, files)?;
        } else if path.extension().is_some_and(|extension| extension == "pml") {
            files.push(path);
        }
    }
    Ok(())
}

/// A document prompt of about `size` tokens for each size: the document is `document`'s first
/// paragraphs (blank-line separated), as many as fit.
pub fn document_cases(
    document: &str,
    question: &str,
    sizes: &[usize],
    tokenizer: &dyn Tokenizer,
) -> Result<Vec<Case>, Failure> {
    let paragraphs: Vec<&str> = document
        .split("\n\n")
        .map(str::trim)
        .filter(|paragraph| !paragraph.is_empty())
        .collect();
    let mut paragraph_tokens = Vec::with_capacity(paragraphs.len());
    for paragraph in &paragraphs {
        let tokens = tokenizer
            .encode(paragraph, false)
            .map_err(|error| Failure::Failed(anyhow::Error::new(error)))?;
        paragraph_tokens.push(tokens.len());
    }
    let available: usize = paragraph_tokens.iter().sum();
    let mut cases = Vec::with_capacity(sizes.len());
    for &size in sizes {
        let budget = size.saturating_sub(DOCUMENT_PROMPT_OVERHEAD_TOKENS);
        if available < budget {
            return Err(Failure::usage(format!(
                "the document has about {available} tokens, too few for a {size}-token prompt \
                 (give a longer one with `--document`)"
            )));
        }
        let mut used = 0;
        let mut count = 0;
        for &tokens in &paragraph_tokens {
            // Each separator costs about one token (a double line break); one paragraph at least.
            if count > 0 && used + tokens + 1 > budget {
                break;
            }
            used += tokens + 1;
            count += 1;
        }
        let text = paragraphs[..count].join("\n\n");
        cases.push(document_case(size, &text, question));
    }
    Ok(cases)
}

fn document_case(size: usize, document: &str, question: &str) -> Case {
    let name = format!("document-{size}");
    let schema = format!(
        "<schema name=\"{name}\">\n<system>\nYou are a careful research assistant. Answer the \
         question using only the document, in a few words.\n</system>\n<user>\n<module \
         name=\"document\">\n{}\n</module>\n</user>\n</schema>\n",
        escape(document)
    );
    let prompt = format!(
        "<prompt schema=\"{name}\">\n<document/>\n<user>{}</user>\n</prompt>\n",
        escape(question)
    );
    Case {
        schema: SourceText {
            path: PathBuf::from(format!("<{name} schema>")),
            text: schema,
        },
        prompt: SourceText {
            path: PathBuf::from(format!("<{name} prompt>")),
            text: prompt,
        },
        name,
    }
}

/// `text` as PML character data.
fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
