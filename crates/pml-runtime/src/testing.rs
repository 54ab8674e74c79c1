//! Support for tests of what sits on a runtime: a runtime on a tiny random model ([`tiny_runtime`])
//! and a stand-in tokenizer. Test-only: it panics. A fetched model's path is
//! `pml_testkit::fetched_model`, a throwaway `redis-server` `pml_testkit::redis_server`. Tensor
//! comparisons are in [`pml_engine::testing`].

use candle_core::Device;
use pml_compiler::chat_template::{ChatTemplate, RoleMarkers, SystemStyle};
use pml_compiler::plan::EncodeMode;
use pml_engine::tokenizer::{TokenBytes, TokenizeError, Tokenizer};

use crate::inference::Runtime;
use crate::store::{ManifestStore, MemoryTier, ModuleStore, StateSpec};
use crate::tokenizer::PmlTokenizer;
use pml_engine::model::tiny::random_model;
use pml_engine::model::{Arch, WeightFormat};

/// A [`Runtime`] on a seeded random model of `arch` (256-token vocabulary), with a tokenizer of
/// one token per byte that decodes each id as a letter and has no end-of-turn token (so generation
/// always runs to `max_tokens`), empty chat markers, and a RAM-only store whose manifests live in
/// the returned temporary directory (keep it alive as long as the runtime). For tests of whatever
/// sits on top of a runtime (the server) where the answer's content does not matter.
///
/// # Panics
/// When the random model or the temporary directory cannot be built.
pub fn tiny_runtime(arch: Arch, seed: u64) -> (Runtime, tempfile::TempDir) {
    let model = random_model(arch, seed, WeightFormat::F32, &Device::Cpu).expect("tiny model");
    let manifests = tempfile::TempDir::new().expect("temporary directory");
    let spec = StateSpec::new(format!("tiny-{arch:?}-{seed}"), model.kv_layout());
    let store = ModuleStore::with_tiers(
        spec,
        vec![Box::new(MemoryTier::new(1 << 30))],
        ManifestStore::new(manifests.path()),
    );
    let markers = RoleMarkers {
        open: String::new(),
        close: String::new(),
    };
    let template = ChatTemplate {
        system: markers.clone(),
        user: markers.clone(),
        assistant: markers,
        generation_prompt: String::new(),
        emits_bos: false,
        system_style: SystemStyle::Native,
        default_preamble: String::new(),
        source: String::new(),
        tokens: Default::default(),
    };
    let runtime = Runtime::from_parts(
        model,
        letter_tokenizer(),
        template,
        store,
        EncodeMode::Scaffolded,
        4096,
    );
    (runtime, manifests)
}

/// The tokenizer of [`tiny_runtime`].
pub struct LetterTokenizer;

/// BOS of [`LetterTokenizer`].
const LETTER_BOS: u32 = 1;

/// [`LetterTokenizer`] as the runtime holds it, with 0 as its placeholder.
pub fn letter_tokenizer() -> PmlTokenizer {
    PmlTokenizer::new(LetterTokenizer, 0)
}

impl Tokenizer for LetterTokenizer {
    fn encode(&self, text: &str, _allow_special: bool) -> Result<Vec<u32>, TokenizeError> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        Ok(ids
            .iter()
            .map(|&id| char::from(b'a' + (id % 26) as u8))
            .collect())
    }

    fn bos_token(&self) -> Option<u32> {
        Some(LETTER_BOS)
    }

    fn eos_tokens(&self) -> Vec<u32> {
        Vec::new()
    }

    fn vocab_size(&self) -> usize {
        256
    }

    /// The letter [`Self::decode`] writes for `id`.
    fn token_bytes(&self, id: u32) -> Option<TokenBytes> {
        (id < 256).then(|| TokenBytes::Text(vec![b'a' + (id % 26) as u8]))
    }
}

/// One token per byte of the text, BOS = 1, no end-of-sequence token: round-trips ASCII, so
/// conversation tests can feed text through tiny random models (vocabulary 256).
pub struct ByteTokenizer;

impl ByteTokenizer {
    pub const BOS: u32 = 1;
}

impl Tokenizer for ByteTokenizer {
    fn encode(&self, text: &str, _allow_special: bool) -> Result<Vec<u32>, TokenizeError> {
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, ids: &[u32]) -> Result<String, TokenizeError> {
        let bytes: Vec<u8> = ids.iter().map(|&id| (id % 128) as u8).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn bos_token(&self) -> Option<u32> {
        Some(Self::BOS)
    }

    fn eos_tokens(&self) -> Vec<u32> {
        Vec::new()
    }

    fn vocab_size(&self) -> usize {
        256
    }

    fn token_bytes(&self, id: u32) -> Option<TokenBytes> {
        (id < 256).then(|| TokenBytes::Text(vec![(id % 128) as u8]))
    }
}
