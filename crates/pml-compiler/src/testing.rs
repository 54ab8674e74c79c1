//! Deterministic stand-ins for a model's tokenizer, for tests and benchmarks of the compiler and
//! its callers, which need token counts but no model; and a generated schema of any size for
//! benchmarks.

use crate::tokenizer::{TokenizeError, Tokenizer};
use std::fmt::Write;

/// A tokenizer made of two functions, with no BOS, no EOS and placeholder 0: the stand-ins of
/// the tests differ only in how text maps to ids.
pub struct FnTokenizer {
    encode: fn(&str) -> Vec<u32>,
    decode: fn(&[u32]) -> String,
    vocab_size: usize,
}

impl FnTokenizer {
    pub const fn new(
        encode: fn(&str) -> Vec<u32>,
        decode: fn(&[u32]) -> String,
        vocab_size: usize,
    ) -> Self {
        Self {
            encode,
            decode,
            vocab_size,
        }
    }
}

impl Tokenizer for FnTokenizer {
    fn encode(&self, text: &str, _allow_special: bool) -> Result<Vec<u32>, TokenizeError> {
        Ok((self.encode)(text))
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        Ok((self.decode)(ids))
    }

    fn bos_token(&self) -> Option<u32> {
        None
    }

    fn eos_tokens(&self) -> Vec<u32> {
        Vec::new()
    }

    fn placeholder_token(&self) -> u32 {
        0
    }

    fn vocab_size(&self) -> usize {
        self.vocab_size
    }
}

/// One token per whitespace-separated word; every word is token 1. Enough for argument-length
/// checks, whose only question is how many tokens a text takes.
pub const WORD_TOKENIZER: FnTokenizer = FnTokenizer::new(
    |text| text.split_whitespace().map(|_| 1).collect(),
    |ids| vec!["word"; ids.len()].join(" "),
    2,
);

/// A clean schema of about `target_bytes` (modules with params, nested unions, collections, role
/// blocks), for benchmarks of everything that reads schemas; also returns the number of topic
/// groups (`topic-0` ... `topic-{n-1}`), each with the same inner structure.
pub fn generated_schema(target_bytes: usize) -> (String, usize) {
    let mut schema = String::from(
        "<schema name=\"bench\">\n  <system>You are a careful assistant.</system>\n  <user>\n",
    );
    let mut n_groups = 0;
    while schema.len() < target_bytes {
        let index = n_groups;
        let _ = write!(
            schema,
            r#"    <module name="topic-{index}">
      Topic {index} is written for <param name="reader" len="8"/> in <param name="tone" len="4"/> words.
      <union default="brief-{index}">
        <module name="brief-{index}">A brief summary of topic {index}.</module>
        <module name="detailed-{index}">
          A detailed summary of topic {index} with <param name="focus" len="16">the main points</param>.
          <union>
            <module name="example-a">Example A of topic {index}.</module>
            <module name="example-b">Example B of topic {index}.</module>
          </union>
        </module>
      </union>
      <collection name="sources-{index}">
        <module name="source-1">The first source of topic {index}, quoted at some length.</module>
        <module name="source-2">The second source of topic {index}, quoted at some length.</module>
      </collection>
    </module>
"#
        );
        n_groups += 1;
    }
    schema.push_str("  </user>\n</schema>\n");
    (schema, n_groups)
}
