//! The model's tokenizer as the runtime holds it: an engine tokenizer ([`pml_engine::Tokenizer`],
//! which generation uses) that also serves the compiler ([`pml_compiler::Tokenizer`], which PML's
//! layout uses) by adding what only PML needs: the placeholder token filling the positions of a
//! parameter that received no argument.
//!
//! A newtype, because neither trait nor the engine's tokenizers are the runtime's own: the orphan
//! rule forbids implementing the compiler's trait for them here, and the compiler must not depend on
//! the engine.

use pml_engine::tokenizer::GgufTokenizer;

/// An engine tokenizer with a placeholder token; implements both the engine's and the compiler's
/// tokenizer traits, so one value serves generation and layout.
pub struct PmlTokenizer {
    engine: Box<dyn pml_engine::Tokenizer>,
    placeholder: u32,
    /// The engine tokenizer's, asked once (a stand-in's default scans its vocabulary).
    longest_token_bytes: usize,
}

impl PmlTokenizer {
    /// `engine`, filling unbound parameters with `placeholder`.
    pub fn new(engine: impl pml_engine::Tokenizer + 'static, placeholder: u32) -> Self {
        Self {
            longest_token_bytes: engine.longest_token_bytes(),
            engine: Box::new(engine),
            placeholder,
        }
    }

    /// The wrapped engine tokenizer.
    pub fn engine(&self) -> &dyn pml_engine::Tokenizer {
        self.engine.as_ref()
    }
}

/// A model's GGUF tokenizer: placeholders are its pad token ([`GgufTokenizer::pad_token`]).
impl From<GgufTokenizer> for PmlTokenizer {
    fn from(tokenizer: GgufTokenizer) -> Self {
        let placeholder = tokenizer.pad_token();
        Self::new(tokenizer, placeholder)
    }
}

impl std::fmt::Debug for PmlTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PmlTokenizer")
            .field("vocab_size", &self.engine.vocab_size())
            .field("placeholder", &self.placeholder)
            .finish_non_exhaustive()
    }
}

fn compiler_error(error: pml_engine::TokenizeError) -> pml_compiler::TokenizeError {
    pml_compiler::TokenizeError(error.0)
}

impl pml_engine::Tokenizer for PmlTokenizer {
    fn encode(
        &self,
        text: &str,
        allow_special: bool,
    ) -> Result<Vec<u32>, pml_engine::TokenizeError> {
        self.engine.encode(text, allow_special)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, pml_engine::TokenizeError> {
        self.engine.decode(ids)
    }

    fn count_tokens(&self, text: &str) -> Result<usize, pml_engine::TokenizeError> {
        self.engine.count_tokens(text)
    }

    fn bos_token(&self) -> Option<u32> {
        self.engine.bos_token()
    }

    fn eos_tokens(&self) -> Vec<u32> {
        self.engine.eos_tokens()
    }

    fn vocab_size(&self) -> usize {
        self.engine.vocab_size()
    }

    fn token_bytes(&self, id: u32) -> Option<pml_engine::tokenizer::TokenBytes> {
        self.engine.token_bytes(id)
    }

    fn longest_token_bytes(&self) -> usize {
        self.longest_token_bytes
    }
}

impl pml_compiler::Tokenizer for PmlTokenizer {
    fn encode(
        &self,
        text: &str,
        allow_special: bool,
    ) -> Result<Vec<u32>, pml_compiler::TokenizeError> {
        self.engine
            .encode(text, allow_special)
            .map_err(compiler_error)
    }

    fn decode(&self, ids: &[u32]) -> Result<String, pml_compiler::TokenizeError> {
        self.engine.decode(ids).map_err(compiler_error)
    }

    fn count_tokens(&self, text: &str) -> Result<usize, pml_compiler::TokenizeError> {
        self.engine.count_tokens(text).map_err(compiler_error)
    }

    fn bos_token(&self) -> Option<u32> {
        self.engine.bos_token()
    }

    fn eos_tokens(&self) -> Vec<u32> {
        self.engine.eos_tokens()
    }

    fn placeholder_token(&self) -> u32 {
        self.placeholder
    }

    fn vocab_size(&self) -> usize {
        self.engine.vocab_size()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::LetterTokenizer;

    #[test]
    fn both_views_agree_and_the_compiler_gets_the_placeholder() {
        let tokenizer = PmlTokenizer::new(LetterTokenizer, 7);
        let engine: &dyn pml_engine::Tokenizer = &tokenizer;
        let compiler: &dyn pml_compiler::Tokenizer = &tokenizer;
        assert_eq!(
            engine.encode("abc", false).unwrap(),
            compiler.encode("abc", false).unwrap()
        );
        assert_eq!(
            engine.decode(&[0, 1]).unwrap(),
            compiler.decode(&[0, 1]).unwrap()
        );
        assert_eq!(engine.bos_token(), compiler.bos_token());
        assert_eq!(engine.vocab_size(), compiler.vocab_size());
        assert_eq!(compiler.placeholder_token(), 7);
    }
}
