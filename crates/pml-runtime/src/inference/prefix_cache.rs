//! Automatic prefix caching of plain prompts (completions and chats without a schema), as
//! vLLM's: the KV of every full block of [`BLOCK_TOKENS`] prompt tokens is kept under a key
//! chained on everything before it (the block hash chain) and the model, so a later prompt that
//! starts with the same tokens splices the longest run of cached blocks and computes only the
//! rest.
//!
//! The blocks a prompt adds are copied out of its cache once, as one span, and each block is a
//! view of that span ([`KvBlock::view`]): a later prompt splices a run of them without copying,
//! reading the span in place ([`KvCache::from_shared_blocks`]), so a system prompt shared by
//! every chat is held once however many chats are running. A span's memory is freed when the
//! last of its blocks is evicted and no cache reads it any more.
//!
//! Blocks are kept exact, in the engine's KV dtype, in a RAM tier of their own under a byte
//! budget (least recently used evicted first): the module store's tiers hold states in its
//! stored dtype (f16 by default), which would make a cached answer differ from an uncached one.
//! With a shared tier (a Redis namespace of the engine's KV dtype), blocks one server computed
//! are found by the others: a block missing from RAM is looked up there and copied into RAM.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

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
pub struct PrefixCache {
    blocks: MemoryTier,
    /// Blocks shared with other servers (Redis), behind `blocks`.
    shared: Option<Arc<dyn Tier>>,
    model_fingerprint: String,
    /// The token lists whose blocks were kept last, newest first: what an edited prompt is
    /// diffed against ([`super::prefix_edit`]).
    recent: Mutex<VecDeque<Arc<[u32]>>>,
}

/// The start of a plain prompt's prefill: a cache holding the longest run of its cached blocks
/// (with room for the rest of the prompt and what follows), and how many tokens that is.
pub struct SplicedPrefix {
    pub kv: KvCache,
    pub cached_tokens: usize,
}

impl std::fmt::Debug for PrefixCache {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("PrefixCache")
            .field("resident_bytes", &self.blocks.resident_bytes())
            .field("shared", &self.shared.as_ref().map(|tier| tier.name()))
            .finish_non_exhaustive()
    }
}

impl PrefixCache {
    pub fn new(budget_bytes: u64, model_fingerprint: impl Into<String>) -> Self {
        Self {
            blocks: MemoryTier::new(budget_bytes),
            shared: None,
            model_fingerprint: model_fingerprint.into(),
            recent: Mutex::new(VecDeque::new()),
        }
    }

    /// The same cache, also reading and writing blocks in `shared` (a tier whose states are in
    /// the engine's KV dtype, so blocks stay exact).
    pub fn with_shared(self, shared: Arc<dyn Tier>) -> Self {
        Self {
            shared: Some(shared),
            ..self
        }
    }

    /// Block `key` from RAM, else from the shared tier (then kept in RAM too).
    pub(super) fn block(&self, key: &StoreKey) -> Result<Option<Arc<ModuleState>>, StoreError> {
        if let Some(state) = self.blocks.get(key)? {
            return Ok(Some(state));
        }
        let Some(shared) = &self.shared else {
            return Ok(None);
        };
        let Some(state) = shared.get(key)? else {
            return Ok(None);
        };
        self.blocks.put(key, &state)?;
        Ok(Some(state))
    }

    /// Bytes of KV held now.
    pub fn resident_bytes(&self) -> u64 {
        self.blocks.resident_bytes()
    }

    /// The key of every full block of `tokens` (at positions 0, 1, …).
    pub(super) fn block_keys(&self, model: &Model, tokens: &[u32]) -> Vec<StoreKey> {
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

    /// A cache holding the longest run of `tokens`' cached blocks (at positions 0, 1, …),
    /// leaving at least the last token to compute (its logits pick the first answer token),
    /// with room for the rest of the prompt and `reserve` more slots, but no more than
    /// `at_most` rows allocated now (the cache grows as it fills: a prompt that will catch up
    /// on another's blocks never allocates what it will not compute).
    pub fn splice(
        &self,
        model: &Model,
        tokens: &[u32],
        reserve: usize,
        at_most: usize,
    ) -> Result<SplicedPrefix, PrefixCacheError> {
        let keys = self.block_keys(model, tokens);
        let usable = tokens.len().saturating_sub(1) / BLOCK_TOKENS;
        let mut cached: Vec<Arc<ModuleState>> = Vec::new();
        for key in &keys[..usable.min(keys.len())] {
            match self.block(key)? {
                Some(state) => cached.push(state),
                None => break,
            }
        }
        let cached_tokens = cached.len() * BLOCK_TOKENS;
        let blocks: Vec<&KvBlock> = cached.iter().map(|state| state.kv()).collect();
        let kv = KvCache::from_shared_blocks(
            model.kv_layout(),
            model.device(),
            &blocks,
            (tokens.len() - cached_tokens + reserve).min(at_most),
        )
        .map_err(EngineError::from)?;
        Ok(SplicedPrefix { kv, cached_tokens })
    }

    /// Keeps every full block of `tokens` that `kv` (their prefilled cache, positions 0, 1, …)
    /// holds and the cache lacks.
    /// For a prompt part way through its prefill: when RAM now holds more of `tokens`' leading
    /// blocks than `kv` has computed (another prompt with the same start finished meanwhile),
    /// replaces `kv` with a splice of them (room for the rest and `reserve`, at most `at_most`
    /// rows now, as [`Self::splice`])
    /// and returns the tokens it now holds; `None` when that is no more. RAM only, so a prompt
    /// checked at every step never waits on the shared tier.
    pub fn catch_up(
        &self,
        model: &Model,
        tokens: &[u32],
        kv: &mut KvCache,
        reserve: usize,
        at_most: usize,
    ) -> Result<Option<usize>, PrefixCacheError> {
        let usable = tokens.len().saturating_sub(1) / BLOCK_TOKENS;
        if usable * BLOCK_TOKENS <= kv.len() {
            return Ok(None);
        }
        let mut cached: Vec<Arc<ModuleState>> = Vec::new();
        for key in self.block_keys(model, &tokens[..usable * BLOCK_TOKENS]) {
            match self.blocks.get(&key)? {
                Some(state) => cached.push(state),
                None => break,
            }
        }
        let cached_tokens = cached.len() * BLOCK_TOKENS;
        if cached_tokens <= kv.len() {
            return Ok(None);
        }
        let blocks: Vec<&KvBlock> = cached.iter().map(|state| state.kv()).collect();
        *kv = KvCache::from_shared_blocks(
            model.kv_layout(),
            model.device(),
            &blocks,
            (tokens.len() - cached_tokens + reserve).min(at_most),
        )
        .map_err(EngineError::from)?;
        Ok(Some(cached_tokens))
    }

    pub fn keep(
        &self,
        model: &Model,
        tokens: &[u32],
        kv: &KvCache,
    ) -> Result<(), PrefixCacheError> {
        let computed = kv.len().min(tokens.len());
        self.remember(&tokens[..computed]);
        let keys = self.block_keys(model, &tokens[..computed]);
        let mut missing = Vec::new();
        for (index, key) in keys.iter().enumerate() {
            if !self.blocks.contains(key)? {
                missing.push(index);
            }
        }
        // Each run of consecutive missing blocks is copied out once, as one span.
        for run in missing.chunk_by(|a, b| a + 1 == *b) {
            let (first, last) = (run[0], run[run.len() - 1]);
            let span = kv
                .slice(first * BLOCK_TOKENS..(last + 1) * BLOCK_TOKENS)
                .map_err(EngineError::from)?;
            let span = Arc::new(span);
            for &index in run {
                let rows = (index - first) * BLOCK_TOKENS..(index - first + 1) * BLOCK_TOKENS;
                let block = KvBlock::view(&span, rows).map_err(EngineError::from)?;
                let slots = index * BLOCK_TOKENS..(index + 1) * BLOCK_TOKENS;
                let state = Arc::new(ModuleState::new(block, tokens[slots].to_vec())?);
                self.blocks.put(&keys[index], &state)?;
                if let Some(shared) = &self.shared {
                    shared.put(&keys[index], &state)?;
                }
            }
        }
        Ok(())
    }

    /// Notes `tokens` as the newest prompt kept, dropping one it extends (a chat's earlier
    /// turn) and the oldest past [`RECENT_PROMPTS`].
    fn remember(&self, tokens: &[u32]) {
        if tokens.len() < BLOCK_TOKENS {
            return;
        }
        let Ok(mut recent) = self.recent.lock() else {
            return;
        };
        recent.retain(|old| !tokens.starts_with(old));
        if recent.iter().any(|old| old.starts_with(tokens)) {
            return;
        }
        recent.push_front(tokens.into());
        recent.truncate(RECENT_PROMPTS);
    }

    /// The token lists kept last, newest first.
    pub(super) fn recent(&self) -> Vec<Arc<[u32]>> {
        self.recent
            .lock()
            .map(|recent| recent.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// Token lists [`PrefixCache`] remembers for edit reuse.
pub const RECENT_PROMPTS: usize = 32;

#[cfg(test)]
mod tests {
    use pml_engine::model::tiny::random_model;
    use pml_engine::model::{Arch, WeightFormat};

    use super::*;

    /// Computes the rest of `tokens` after the `kv.len()` that `kv` holds (at positions 0, 1,
    /// …) and checks the logits against a prefill of `tokens` from nothing.
    fn assert_rest_computes_as_alone(model: &Model, tokens: &[u32], kv: &mut KvCache) {
        let cached = kv.len();
        let rest: Vec<u32> = (cached as u32..tokens.len() as u32).collect();
        let logits = model.forward(&tokens[cached..], &rest, kv).expect("rest");
        let mut alone = model.new_kv_cache().expect("cache");
        let positions: Vec<u32> = (0..tokens.len() as u32).collect();
        let reference = model
            .forward(tokens, &positions, &mut alone)
            .expect("alone");
        let gap = pml_engine::testing::max_abs_diff(&logits, &reference);
        assert!(gap < 1e-4, "logits differ by {gap}");
    }

    /// Two caches (two servers) over one shared tier: the second splices what the first kept,
    /// and the logits match a prefill without any cache.
    #[test]
    fn a_shared_tier_carries_blocks_between_caches() {
        let model = random_model(Arch::Qwen2, 5, WeightFormat::F32, &candle_core::Device::Cpu)
            .expect("tiny model");
        let shared: Arc<dyn Tier> = Arc::new(MemoryTier::new(1 << 30));
        let first = PrefixCache::new(1 << 30, "tiny").with_shared(Arc::clone(&shared));
        let second = PrefixCache::new(1 << 30, "tiny").with_shared(shared);
        let tokens: Vec<u32> = (0..3 * BLOCK_TOKENS as u32 + 5)
            .map(|t| 3 + t % 50)
            .collect();

        let prefill = |cache: &PrefixCache| {
            let mut spliced = cache
                .splice(&model, &tokens, 1, usize::MAX)
                .expect("splice");
            let rest = &tokens[spliced.cached_tokens..];
            let positions: Vec<u32> = (spliced.cached_tokens as u32..tokens.len() as u32).collect();
            let logits = model
                .forward(rest, &positions, &mut spliced.kv)
                .expect("forward");
            cache.keep(&model, &tokens, &spliced.kv).expect("keep");
            (
                spliced.cached_tokens,
                logits.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            )
        };
        let (cached, uncached_logits) = prefill(&first);
        assert_eq!(cached, 0);
        let (cached, logits) = prefill(&second);
        assert_eq!(cached, 3 * BLOCK_TOKENS);
        let gap = logits
            .iter()
            .zip(&uncached_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(gap < 1e-4, "logits differ by {gap}");
    }

    /// Prompts that start alike splice the kept blocks without copying them: their caches read
    /// one span in place, held once between them, and compute what a prefill from nothing does.
    #[test]
    fn splices_read_the_kept_span_in_place() {
        let model = random_model(Arch::Qwen2, 5, WeightFormat::F32, &candle_core::Device::Cpu)
            .expect("tiny model");
        let cache = PrefixCache::new(1 << 30, "tiny");
        let start: Vec<u32> = (0..6 * BLOCK_TOKENS as u32).map(|t| 3 + t % 50).collect();
        let prompt = |tail: &[u32]| start.iter().chain(tail).copied().collect::<Vec<u32>>();
        let first = prompt(&[7, 8, 9]);
        let mut spliced = cache.splice(&model, &first, 1, usize::MAX).expect("splice");
        let positions: Vec<u32> = (0..first.len() as u32).collect();
        model
            .forward(&first, &positions, &mut spliced.kv)
            .expect("prefill");
        cache.keep(&model, &first, &spliced.kv).expect("keep");

        for tail in [[4u32, 5], [6, 2]] {
            let second = prompt(&tail);
            let mut late = cache
                .splice(&model, &second, 1, usize::MAX)
                .expect("splice");
            assert_eq!(late.cached_tokens, 6 * BLOCK_TOKENS);
            assert_eq!(late.kv.shared_rows(), 6 * BLOCK_TOKENS, "read in place");
            assert_rest_computes_as_alone(&model, &second, &mut late.kv);
        }
        // The span is counted once, the tails once each.
        let mut seen = std::collections::HashSet::new();
        let span_bytes = 6 * BLOCK_TOKENS * model.kv_layout().slot_bytes();
        let splices: Vec<_> = [[4u32, 5], [6, 2]]
            .iter()
            .map(|tail| {
                cache
                    .splice(&model, &prompt(tail), 1, usize::MAX)
                    .expect("splice")
            })
            .collect();
        let together: usize = splices
            .iter()
            .map(|spliced| spliced.kv.resident_bytes(&mut seen))
            .sum();
        let own_now: usize = splices.iter().map(|s| s.kv.allocated_bytes()).sum();
        assert_eq!(together, span_bytes + own_now);
    }

    /// A prompt that started before another with the same start finished takes that one's
    /// blocks when it can, and only when that is more than it has.
    #[test]
    fn a_prefill_catches_up_on_blocks_kept_meanwhile() {
        let model = random_model(Arch::Qwen2, 5, WeightFormat::F32, &candle_core::Device::Cpu)
            .expect("tiny model");
        let cache = PrefixCache::new(1 << 30, "tiny");
        let shared_start: Vec<u32> = (0..3 * BLOCK_TOKENS as u32).map(|t| 3 + t % 50).collect();
        let first: Vec<u32> = shared_start.iter().copied().chain([7, 8, 9]).collect();
        let second: Vec<u32> = shared_start.iter().copied().chain([4, 5]).collect();

        // The second starts with nothing cached and computes one block.
        let mut late = cache
            .splice(&model, &second, 1, usize::MAX)
            .expect("splice");
        assert_eq!(late.cached_tokens, 0);
        let positions: Vec<u32> = (0..BLOCK_TOKENS as u32).collect();
        model
            .forward(&second[..BLOCK_TOKENS], &positions, &mut late.kv)
            .expect("first chunk");
        assert_eq!(
            cache
                .catch_up(&model, &second, &mut late.kv, 1, usize::MAX)
                .unwrap(),
            None
        );

        // The first runs whole and keeps its blocks.
        let mut early = cache.splice(&model, &first, 1, usize::MAX).expect("splice");
        let positions: Vec<u32> = (0..first.len() as u32).collect();
        model
            .forward(&first, &positions, &mut early.kv)
            .expect("prefill");
        cache.keep(&model, &first, &early.kv).expect("keep");

        let caught = cache
            .catch_up(&model, &second, &mut late.kv, 1, usize::MAX)
            .unwrap();
        assert_eq!(caught, Some(3 * BLOCK_TOKENS));
        assert_eq!(late.kv.len(), 3 * BLOCK_TOKENS);
        assert_rest_computes_as_alone(&model, &second, &mut late.kv);
        assert_eq!(
            cache
                .catch_up(&model, &second, &mut late.kv, 1, usize::MAX)
                .unwrap(),
            None
        );
    }
}
