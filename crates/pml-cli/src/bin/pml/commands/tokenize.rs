//! `pml tokenize --model M TEXT`: the token ids (and pieces) the model's tokenizer gives a text,
//! as llama.cpp's `llama-tokenize` prints them, with its defaults: no BOS/EOS added, control
//! tokens not parsed (`--add-special` and `--parse-special` change them). Reads the GGUF's
//! vocabulary only, never its weights.

use std::io::Read;

use anyhow::Context;
use clap::Args;
use pml_commands::model_fetch::{model_file, resolve_model};
use pml_engine::Tokenizer;
use pml_engine::gguf::GgufFile;
use pml_engine::tokenizer::GgufTokenizer;
use serde::Serialize;

#[derive(Args)]
pub struct TokenizeArgs {
    /// The text; read from stdin when absent (or `-`).
    text: Option<String>,
    /// Model: an id or alias (see `pml models list`) or a path to a GGUF file; the default
    /// model when absent.
    #[arg(long, short = 'm', value_name = "MODEL")]
    model: Option<String>,
    /// Read the text from this file.
    #[arg(long, short = 'f', value_name = "FILE", conflicts_with = "text")]
    file: Option<std::path::PathBuf>,
    /// Add the tokens the model adds to a prompt (BOS, where the vocabulary asks for it).
    #[arg(long)]
    add_special: bool,
    /// Turn control-token spellings in the text (`<|im_start|>`) into their tokens.
    #[arg(long)]
    parse_special: bool,
    /// Print the ids only, as a list.
    #[arg(long, conflicts_with = "json")]
    ids: bool,
    /// Print a JSON array of `{"id", "piece"}` objects.
    #[arg(long)]
    json: bool,
}

#[derive(Serialize)]
struct Token {
    id: u32,
    piece: String,
}

pub fn run(args: TokenizeArgs) -> anyhow::Result<()> {
    let text = match (&args.text, &args.file) {
        (_, Some(file)) => {
            std::fs::read_to_string(file).with_context(|| format!("reading {}", file.display()))?
        }
        (Some(text), None) if text != "-" => text.clone(),
        _ => {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .context("reading the text from stdin")?;
            text
        }
    };
    let path = model_file(&resolve_model(args.model.as_deref())?)?;
    let gguf = GgufFile::open(&path)?;
    let tokenizer = GgufTokenizer::from_gguf(&gguf)
        .with_context(|| format!("building the tokenizer of {}", path.display()))?;
    let mut ids: Vec<u32> = match args.add_special {
        true => tokenizer.bos_token().into_iter().collect(),
        false => Vec::new(),
    };
    ids.extend(tokenizer.encode(&text, args.parse_special)?);
    if args.ids {
        let list: Vec<String> = ids.iter().map(u32::to_string).collect();
        println!("[{}]", list.join(", "));
        return Ok(());
    }
    let tokens = ids
        .iter()
        .map(|&id| {
            Ok(Token {
                id,
                piece: tokenizer.decode(&[id])?,
            })
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if args.json {
        println!("{}", serde_json::to_string(&tokens)?);
    } else {
        for token in &tokens {
            println!("{:>6} -> {:?}", token.id, token.piece);
        }
    }
    Ok(())
}
