//! A prompt its model's context cannot hold is refused with exit 2 and a coded error before
//! anything is computed: `pml run` on a prompt whose imports of a collection member, or whose
//! `--max-tokens`, run past the context (PML305), and on a file of more bytes than the context
//! could hold (PML306), a large one by its size before it is read (and with a `--schema` that cannot
//! be read, exit 2 too); `pml generate` on a text of
//! either kind. On the tiny model written to a temporary folder (one token per byte, a context of
//! 256 positions), so no fetched model is needed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use pml_engine::testing::write_tiny_chat_gguf;

/// The tiny model's context; with one byte per token it also holds at most this many bytes.
const CONTEXT: usize = 256;

/// A schema with a one-member collection, the tiny model and a home of their own.
struct Fixture {
    dir: tempfile::TempDir,
}

impl Fixture {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        write_tiny_chat_gguf(&dir.path().join("tiny.gguf"), CONTEXT);
        let fixture = Self { dir };
        fixture.write(
            "lib.pml",
            "<schema name=\"lib\">\n  <collection name=\"docs\">\n    <module name=\"note\">A \
             short note on the weather in spring.</module>\n  </collection>\n</schema>\n",
        );
        fixture
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.path(name);
        std::fs::write(&path, text).expect("write a fixture file");
        path
    }

    /// A prompt of `lib` importing `note` `imports` times, then asking a question.
    fn prompt(&self, name: &str, imports: usize) -> PathBuf {
        let text = format!(
            "<prompt schema=\"lib\">{}<user>Why?</user></prompt>\n",
            "<note/>".repeat(imports)
        );
        self.write(name, &text)
    }

    fn pml(&self, args: &[&str]) -> Output {
        let model = self.path("tiny.gguf");
        Command::new(env!("CARGO_BIN_EXE_pml"))
            .args(args)
            .args(["--model", model.to_str().expect("a UTF-8 path")])
            .env("PML_HOME", self.path("home"))
            .env_remove("PML_STORE")
            .env("NO_COLOR", "1")
            .current_dir(self.dir.path())
            .output()
            .expect("the pml binary runs")
    }

    fn run(&self, prompt: &Path, extra: &[&str]) -> Output {
        let prompt = prompt.to_str().expect("a UTF-8 path");
        self.pml(&[&["run", prompt, "--temperature", "0"], extra].concat())
    }
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Refused with exit 2 and `code`, nothing computed: no schema compiled, no answer.
fn assert_refused(output: &Output, code: &str) -> String {
    let text = stderr(output);
    assert_eq!(output.status.code(), Some(2), "{text}");
    assert!(text.contains(&format!("{code} ")), "{text}");
    assert!(text.contains(&format!("pmlc explain {code}")), "{text}");
    assert!(!text.contains("compiling"), "nothing compiled: {text}");
    assert!(!text.contains("TTFT"), "nothing ran: {text}");
    assert!(output.stdout.is_empty());
    text
}

#[test]
fn run_refuses_imports_or_max_tokens_past_the_context() {
    let fixture = Fixture::new();
    // A few imports and a short answer fit, and run.
    let few = fixture.prompt("few.pml", 2);
    let output = fixture.run(&few, &["--max-tokens", "4"]);
    assert!(output.status.success(), "{}", stderr(&output));
    assert!(stderr(&output).contains("TTFT"), "{}", stderr(&output));

    // The collection member imported until its positions outgrow the context.
    let many = fixture.prompt("many.pml", 8);
    let text = assert_refused(&fixture.run(&many, &["--max-tokens", "4"]), "PML305");
    assert!(
        text.contains(&format!("past the model's context of {CONTEXT} positions")),
        "{text}"
    );
    // The prompt that ran fits, but not with room for a long answer.
    let text = assert_refused(&fixture.run(&few, &["--max-tokens", "250"]), "PML305");
    assert!(text.contains("its answer up to 250 more"), "{text}");
}

#[test]
fn run_refuses_a_file_past_the_byte_limit_and_a_large_one_unread() {
    let fixture = Fixture::new();
    // One token per byte: the context holds at most CONTEXT bytes.
    let sized = |name: &str, bytes: usize| {
        let head = "<prompt schema=\"lib\"><note/><user>";
        let tail = "</user></prompt>";
        let filler = "x".repeat(bytes - head.len() - tail.len());
        fixture.write(name, &format!("{head}{filler}{tail}"))
    };
    let at_limit = sized("at-limit.pml", CONTEXT);
    let text = assert_refused(&fixture.run(&at_limit, &[]), "PML305");
    assert!(!text.contains("PML306"), "{text}");
    let over = sized("over.pml", CONTEXT + 1);
    let text = assert_refused(&fixture.run(&over, &[]), "PML306");
    assert!(
        text.contains(&format!("the prompt is {} bytes", CONTEXT + 1)),
        "{text}"
    );
    assert!(
        text.contains(&format!("holds at most {CONTEXT} bytes")),
        "{text}"
    );

    // Past the size read before the model loads, refused by its size: the file is all NUL
    // bytes, which read as text would be "neither a schema nor a prompt".
    let large = fixture.path("large.pml");
    let size = pml_commands::pipeline::PROMPT_READ_FIRST_BYTES + 1;
    std::fs::File::create(&large)
        .and_then(|file| file.set_len(size))
        .expect("a sparse file");
    let text = assert_refused(&fixture.run(&large, &[]), "PML306");
    assert!(
        text.contains(&format!("the prompt is {size} bytes")),
        "{text}"
    );
}

#[test]
fn generate_refuses_a_text_past_the_context() {
    let fixture = Fixture::new();
    let output = fixture.pml(&["generate", "Hello", "--max-tokens", "4"]);
    assert!(output.status.success(), "{}", stderr(&output));
    let text = assert_refused(
        &fixture.pml(&["generate", "Hello", "--max-tokens", "300"]),
        "PML305",
    );
    assert!(text.contains("the prompt takes 5 positions"), "{text}");
    let long = "y".repeat(CONTEXT + 1);
    assert_refused(
        &fixture.pml(&["generate", &long, "--max-tokens", "4"]),
        "PML306",
    );
}

#[test]
fn run_with_a_schema_file_that_cannot_be_read_exits_2() {
    let fixture = Fixture::new();
    let prompt = fixture.prompt("few.pml", 1);
    let output = fixture.run(&prompt, &["--schema", "missing.pml"]);
    assert_eq!(output.status.code(), Some(2), "{}", stderr(&output));
    assert!(
        stderr(&output).contains("cannot read the schema missing.pml"),
        "{}",
        stderr(&output)
    );
}
