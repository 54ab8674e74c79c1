//! Whether a prompt fits the model's context, decided before anything is computed: the positions
//! a bound prompt takes plus the answer's `max_tokens` ([`check_positions`], PML305), and before a
//! text is even tokenized, its length in bytes against the most bytes the context could hold
//! ([`PromptByteLimit`], PML306).

use pml_compiler::rules::{PROMPT_TOO_LARGE, PROMPT_TOO_LONG};
use pml_engine::gguf::{GgufError, GgufFile};
use pml_engine::tokenizer::GgufTokenizer;

/// A prompt the model's context cannot hold.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// PML305: the prompt's positions and the answer's tokens are more than the context.
    #[error(
        "{code} {name}: the prompt takes {prompt_positions} positions and its answer up to \
         {max_tokens} more ({total} in all), past the model's context of {context} positions",
        code = PROMPT_TOO_LONG.code,
        name = PROMPT_TOO_LONG.name,
        total = prompt_positions.saturating_add(*max_tokens)
    )]
    TooLong {
        prompt_positions: usize,
        max_tokens: usize,
        context: u32,
    },
    /// PML306: the prompt has more bytes than the context could hold at the longest token.
    #[error(
        "{code} {name}: the prompt is {bytes} bytes; the model's context of {context} tokens, at \
         most {longest_token_bytes} bytes each, holds at most {limit} bytes",
        code = PROMPT_TOO_LARGE.code,
        name = PROMPT_TOO_LARGE.name
    )]
    TooLarge {
        bytes: u64,
        limit: u64,
        context: u32,
        longest_token_bytes: usize,
    },
}

impl ContextError {
    /// The rule's code: `PML305` or `PML306`.
    pub fn code(&self) -> &'static str {
        match self {
            ContextError::TooLong { .. } => PROMPT_TOO_LONG.code,
            ContextError::TooLarge { .. } => PROMPT_TOO_LARGE.code,
        }
    }
}

/// Refuses a prompt taking `prompt_positions` positions (one past its highest, where decoding
/// goes on) whose answer of up to `max_tokens` tokens would run past a context of `context`
/// positions.
pub fn check_positions(
    prompt_positions: usize,
    max_tokens: usize,
    context: u32,
) -> Result<(), ContextError> {
    if prompt_positions.saturating_add(max_tokens) > context as usize {
        return Err(ContextError::TooLong {
            prompt_positions,
            max_tokens,
            context,
        });
    }
    Ok(())
}

/// The most bytes of prompt text a model's context can hold: its context length times the most
/// bytes one token of its vocabulary covers ([`pml_engine::Tokenizer::longest_token_bytes`]). A
/// text of `n` bytes takes at least `n / longest_token_bytes` tokens, so a longer one can never
/// fit, and can be refused before it is tokenized or read whole. A PML prompt's source counts its
/// markup and comments too, which take fewer tokens than their bytes, so only a source that is
/// mostly markup or comments could fit past this bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PromptByteLimit {
    /// The model's context length, in tokens.
    pub context: u32,
    /// The most bytes of text one token covers (at least 1).
    pub longest_token_bytes: usize,
}

impl PromptByteLimit {
    /// The limit of the model in `gguf`, from its metadata alone (context length and
    /// vocabulary), without loading the model or building its tokenizer: for a host to refuse a
    /// prompt file before it reads it or loads anything.
    pub fn of_gguf(gguf: &GgufFile) -> Result<Self, GgufError> {
        Ok(Self {
            context: u32::try_from(gguf.context_length()?).unwrap_or(u32::MAX),
            longest_token_bytes: GgufTokenizer::longest_token_bytes_of(gguf)?,
        })
    }

    /// The most bytes a prompt may have.
    pub fn max_bytes(&self) -> u64 {
        u64::from(self.context).saturating_mul(self.longest_token_bytes.max(1) as u64)
    }

    /// Refuses a prompt of `bytes` bytes past [`Self::max_bytes`] (PML306).
    pub fn check(&self, bytes: u64) -> Result<(), ContextError> {
        let limit = self.max_bytes();
        if bytes > limit {
            return Err(ContextError::TooLarge {
                bytes,
                limit,
                context: self.context,
                longest_token_bytes: self.longest_token_bytes,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_and_answer_fit_up_to_the_context_exactly() {
        assert_eq!(check_positions(32_512, 256, 32_768), Ok(()));
        let error = check_positions(36_014, 256, 32_768).unwrap_err();
        assert_eq!(error.code(), "PML305");
        let message = error.to_string();
        assert!(message.starts_with("PML305 prompt-too-long:"), "{message}");
        assert!(message.contains("36014 positions"), "{message}");
        assert!(message.contains("36270 in all"), "{message}");
        assert!(check_positions(32_513, 256, 32_768).is_err());
        assert!(check_positions(usize::MAX, 1, 32_768).is_err());
    }

    #[test]
    fn bytes_fit_up_to_the_context_times_the_longest_token() {
        let limit = |context, longest_token_bytes| PromptByteLimit {
            context,
            longest_token_bytes,
        };
        assert_eq!(limit(256, 1).max_bytes(), 256);
        assert_eq!(limit(32_768, 0).max_bytes(), 32_768);
        assert_eq!(limit(32_768, 256).max_bytes(), 8 << 20);
        assert_eq!(limit(256, 1).check(256), Ok(()));
        let error = limit(256, 1).check(257).unwrap_err();
        assert_eq!(error.code(), "PML306");
        assert_eq!(
            error,
            ContextError::TooLarge {
                bytes: 257,
                limit: 256,
                context: 256,
                longest_token_bytes: 1
            }
        );
        assert!(
            error.to_string().starts_with("PML306 prompt-too-large:"),
            "{error}"
        );
    }
}
