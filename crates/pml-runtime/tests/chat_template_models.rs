//! The real models' chat templates: analysed from the GGUF (or the built-in Gemma-3 one), their
//! role strings tokenize to the models' control tokens, and the copy of Qwen's template used by the
//! compiler's unit tests is the one in the file (and its copy of Gemma's is the engine's built-in
//! one). Needs the fetched models.

use pml_compiler::chat_template::SystemStyle;
use pml_engine::Tokenizer;
use pml_engine::chat::{builtin_template, chat_template_source};
use pml_engine::gguf::GgufFile;
use pml_engine::tokenizer::GgufTokenizer;
use pml_runtime::chat::model_chat_template;
use pml_testkit::fetched_model;

type TestResult = Result<(), Box<dyn std::error::Error>>;

#[test]
fn qwen_template_gives_chatml_control_tokens() -> TestResult {
    let Some(path) = fetched_model("qwen2.5-0.5b") else {
        return Ok(());
    };
    let gguf = GgufFile::open(path)?;
    let tokenizer = GgufTokenizer::from_gguf(&gguf)?;
    let template = model_chat_template(&gguf, &tokenizer)?;
    assert_eq!(template.system_style, SystemStyle::Native);
    assert!(!template.emits_bos);
    // <|im_start|> user \n
    assert_eq!(
        tokenizer.encode(&template.user.open, true)?,
        [151644, 872, 198]
    );
    // <|im_end|> \n
    assert_eq!(tokenizer.encode(&template.user.close, true)?, [151645, 198]);
    assert_eq!(
        tokenizer.encode(&template.generation_prompt, true)?,
        [151644, 77091, 198]
    );

    let embedded = include_str!(
        "../../pml-compiler/tests/data/chat_templates/qwen2.5-coder-0.5b-instruct.jinja"
    );
    assert_eq!(
        chat_template_source(&gguf)?,
        embedded,
        "the compiler's test copy drifted from the GGUF"
    );
    Ok(())
}

#[test]
fn gemma_uses_the_builtin_template_and_turn_tokens() -> TestResult {
    let Some(path) = fetched_model("gemma3-270m") else {
        return Ok(());
    };
    let gguf = GgufFile::open(path)?;
    let tokenizer = GgufTokenizer::from_gguf(&gguf)?;
    let template = model_chat_template(&gguf, &tokenizer)?;
    assert_eq!(
        builtin_template("gemma3"),
        Some(include_str!(
            "../../pml-compiler/tests/data/chat_templates/gemma3.jinja"
        )),
        "the compiler's test copy drifted from the engine's built-in template"
    );
    assert!(template.emits_bos);
    assert_eq!(template.system, template.user);
    // <start_of_turn> user \n
    assert_eq!(
        tokenizer.encode(&template.user.open, true)?,
        [105, 2364, 107]
    );
    // <end_of_turn> \n
    assert_eq!(tokenizer.encode(&template.user.close, true)?, [106, 107]);
    // <start_of_turn> model \n
    assert_eq!(
        tokenizer.encode(&template.generation_prompt, true)?,
        [105, 4368, 107]
    );
    Ok(())
}
