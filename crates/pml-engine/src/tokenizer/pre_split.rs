//! How byte-level BPE tokenizers cut text into words before merging, by the GGUF's
//! `tokenizer.ggml.pre`: the regular expressions llama.cpp's `llm_tokenizer_bpe` applies for
//! each pre-tokenizer type (`llama-vocab.cpp`), in order. Each expression splits every piece the
//! previous ones left, keeping matches and the text between them as pieces of their own — which
//! is a `tokenizers` sequence of `Split`s with `Isolated` delimiters.
//!
//! Spelled as llama.cpp spells them (its adaptations of the `tokenizer.json` originals, such as
//! `'[sS]` for `(?i:'s)`), so a difference from llama.cpp is a difference of regex engines only;
//! llama.cpp's own tokenizer test set checks every family listed here
//! (`tests/llama_cpp_vocab.rs`).

/// GPT-2's split: contractions, letter runs, digit runs and other runs, each with an optional
/// leading space, then whitespace.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";

/// Llama 3's split (also ChatGLM-4, DBRX, Smaug): digits in runs of up to three.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen2's split: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The letters DeepSeek-LLM's tokenizer groups into words (its `tokenizer.json`, as llama.cpp
/// copies it: the cased letters), by code point, as are the other non-ASCII classes: spelled as
/// characters, an editor's Unicode normalisation would turn `\x{1FD3}` into `\x{390}` and empty
/// a range.
const DEEPSEEK_LLM_LETTERS: &str = r"\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15}\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB}\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06}\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+";

/// Han, Samaritan to CJK, and Hangul runs, as DeepSeek's tokenizers group them.
const DEEPSEEK_CJK: &str = r"[\x{4E00}-\x{9FA5}\x{800}-\x{4E00}\x{AC00}-\x{D7FF}]+";

/// The expressions of pre-tokenizer `pre`, in order, and whether words found whole in the
/// vocabulary skip the merges (llama.cpp's `ignore_merges`, set for Llama 3); `None` for a
/// pre-tokenizer PML does not know.
pub fn split_expressions(pre: &str) -> Option<(Vec<&'static str>, bool)> {
    let expressions = match pre {
        "llama-bpe" | "llama3" | "llama-v3" => return Some((vec![LLAMA3], true)),
        "dbrx" | "smaug-bpe" | "chatglm-bpe" => vec![LLAMA3],
        "qwen2" | "stablelm2" | "hunyuan" => vec![QWEN2],
        "gpt-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling" => vec![GPT2],
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva" => {
            vec![r"\p{N}", GPT2]
        }
        "falcon" => vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, r"[0-9][0-9][0-9]"],
        "deepseek-llm" => vec![
            r"[\r\n]",
            DEEPSEEK_LLM_LETTERS,
            r"\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+",
            r"\s+$",
            DEEPSEEK_CJK,
            r"\p{N}+",
        ],
        "deepseek-coder" => vec![
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            DEEPSEEK_CJK,
            r"\p{N}",
        ],
        _ => return None,
    };
    Some((expressions, false))
}

/// The pre-tokenizer names [`split_expressions`] knows, for error messages.
pub const KNOWN: &str = "llama-bpe, qwen2, gpt-2, mpt, olmo, starcoder, refact, command-r, \
                         smollm, codeshell, exaone, falcon, deepseek-llm, deepseek-coder, dbrx, \
                         smaug-bpe, chatglm-bpe, stablelm2";
