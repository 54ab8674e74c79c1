//! Automatic prefix caching of plain prompts (completions and chats without a schema), as
//! vLLM's: the KV of every full block of [`BLOCK_TOKENS`] prompt tokens is kept under a key
//! chained on everything before it (the block hash chain) and the model, so a later prompt that
//! starts with the same tokens splices the longest run of cached blocks and computes only the
//! rest.
//!
//! Blocks are kept exact, in the engine's KV dtype, in a RAM tier of their own under a byte
//! budget (least recently used evicted first): the module store's tiers hold states in its
//! stored dtype (f16 by default), which would make a cached answer differ from an uncached one.

use std::sync::Arc;

use pml_compiler::plan::EncodeMode;
use pml_engine::kv_cache::{KvBlock, KvCache};
use pml_engine::model::{EngineError, Model};

use crate::store::{
    ContextHash, MemoryTier, ModuleState, StateKind, StoreError, StoreKey, StoreKeyParts, Tier,
};

/// Tokens per cached block (vLLM's default).
pub const BLOCK_TOKENS: usize = 16;

/// Why a prefix-cached prefill failed.
#[derive(Debug, thiserror::Error)]
pub enum PrefixCacheError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The blocks of one model's plain prompts.
#[derive(Debug)]
pub struct PrefixCache {
    blocks: MemoryTier,
    model_fingerprint: String,
}

/// A plain prompt's prefill: the cache (with room for what follows), the last token's logits,
/// and how many prompt tokens were spliced from cached blocks.
pub struct PrefixPrefill {
    pub kv: KvCache,
    pub logits: candle_core::Tensor,
    pub cached_tokens: usize,
}

impl PrefixCache {
    pub fn new(budget_bytes: u64, model_fingerprint: impl Into<String>) -> Self {
        Self {
            blocks: MemoryTier::new(budget_bytes),
            model_fingerprint: model_fingerprint.into(),
        }
    }

    /// Bytes of KV held now.
    pub fn resident_bytes(&self) -> u64 {
        self.blocks.resident_bytes()
    }

    /// The key of every full block of `tokens` (at positions 0, 1, …).
    fn block_keys(&self, model: &Model, tokens: &[u32]) -> Vec<StoreKey> {
        let dtype = model.kv_layout().dtype;
        let mut context = ContextHash::NONE;
        tokens
            .chunks_exact(BLOCK_TOKENS)
            .enumerate()
            .map(|(index, block)| {
                let start = (index * BLOCK_TOKENS) as u32;
                let positions: Vec<u32> = (start..start + BLOCK_TOKENS as u32).collect();
                let key = StoreKeyParts {
                    model_fingerprint: &self.model_fingerprint,
                    weight_format: model.weight_format(),
                    kv_dtype: dtype,
                    state_dtype: dtype,
                    kind: StateKind::Kv,
                    encode_mode: EncodeMode::default(),
                    tokens: block,
                    positions: &positions,
                    context,
                }
                .key();
                context = context.chain(block, &positions);
                key
            })
            .collect()
    }

    /// Prefills `tokens` (positions 0, 1, …): the longest run of cached blocks spliced (one
    /// token at least left to compute, for the logits), the rest computed, then every new full
    /// block kept. `reserve`: slots to leave for the answer.
    pub fn prefill(
        &self,
        model: &Model,
        tokens: &[u32],
        reserve: usize,
    ) -> Result<PrefixPrefill, PrefixCacheError> {
        let keys = self.block_keys(model, tokens);
        // At least the last prompt token is computed: its logits pick the first answer token.
        let usable = tokens.len().saturating_sub(1) / BLOCK_TOKENS;
        let mut cached: Vec<Arc<ModuleState>> = Vec::new();
        for key in &keys[..usable.min(keys.len())] {
            match self.blocks.get(key)? {
                Some(state) => cached.push(state),
                None => break,
            }
        }
        let cached_tokens = cached.len() * BLOCK_TOKENS;
        let blocks: Vec<&KvBlock> = cached.iter().map(|state| state.kv()).collect();
        let rest = &tokens[cached_tokens..];
        let mut kv = KvCache::from_blocks(
            model.kv_layout(),
            model.device(),
            &blocks,
            rest.len() + reserve,
        )
        .map_err(EngineError::from)?;
        let positions: Vec<u32> = (cached_tokens as u32..tokens.len() as u32).collect();
        let logits = model.forward(rest, &positions, &mut kv)?;
        for (index, key) in keys.iter().enumerate().skip(cached.len()) {
            let slots = index * BLOCK_TOKENS..(index + 1) * BLOCK_TOKENS;
            let block = kv.slice(slots.clone()).map_err(EngineError::from)?;
            let state = ModuleState::new(block, tokens[slots].to_vec())?;
            self.blocks.put(key, &Arc::new(state))?;
        }
        Ok(PrefixPrefill {
            kv,
            logits,
            cached_tokens,
        })
    }
}
