//! Edit reuse of plain prompts in the prefix cache, on the tiny random models of every family:
//! an edited prompt splices the kept rows of its unchanged tokens at their new positions (layer
//! 0's keys, which depend on the token and its position only, equal a full prefill's), computes
//! the changed ones, recomputing everything is a full prefill, and a prompt with nothing to gain
//! over the exact prefix splice is left to it.

mod cached_support;

use candle_core::{Device, Tensor};
use pml_engine::kv_cache::KvCache;
use pml_engine::model::tiny::random_model;
use pml_engine::model::{Arch, Model, WeightFormat};
use pml_runtime::inference::prefix_cache::PrefixCache;
use pml_runtime::inference::{BlendOptions, Ratio};

use cached_support::assert_close;

const RELATIVE_TOLERANCE: f32 = 1e-4;

fn old_prompt() -> Vec<u32> {
    (0..120u32).map(|i| 3 + (i * 7 + i / 5) % 200).collect()
}

/// The old prompt with 5 tokens inserted at 40 and one changed at 90.
fn edited_prompt() -> Vec<u32> {
    let mut tokens = old_prompt();
    tokens.splice(40..40, [250, 251, 252, 253, 254]);
    tokens[95] = 249;
    tokens
}

fn full(model: &Model, tokens: &[u32]) -> (KvCache, Tensor) {
    let mut kv = model.new_kv_cache().expect("cache");
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let logits = model.forward(tokens, &positions, &mut kv).expect("prefill");
    (kv, logits)
}

/// A cache that kept the old prompt's blocks.
fn cache_with_old(model: &Model) -> PrefixCache {
    let cache = PrefixCache::new(1 << 30, "tiny");
    let old = old_prompt();
    let (kv, _) = full(model, &old);
    cache.keep(model, &old, &kv).expect("keeps");
    cache
}

fn blend(recompute: f64) -> BlendOptions {
    BlendOptions {
        recompute: Ratio::new(recompute).expect("a ratio"),
        shortcuts: false,
        ..BlendOptions::default()
    }
}

/// Layer 0's keys by position.
fn layer0_keys(kv: &KvCache) -> Tensor {
    let layer = kv.layer(0).expect("layer 0");
    let mut order: Vec<u32> = (0..kv.len() as u32).collect();
    order.sort_by_key(|&slot| kv.positions()[slot as usize]);
    let index = Tensor::new(order.as_slice(), &Device::Cpu).expect("index");
    layer
        .keys()
        .expect("keys")
        .index_select(&index, 0)
        .expect("sorted")
}

#[test]
fn unchanged_tokens_are_spliced_at_their_new_positions() {
    for arch in Arch::ALL {
        let model = random_model(arch, 5, WeightFormat::F32, &Device::Cpu).expect("tiny model");
        let cache = cache_with_old(&model);
        let edited = edited_prompt();
        // What the exact prefix splice finds: the blocks before the insertion.
        let prefix = cache
            .splice(&model, &edited, 0, usize::MAX)
            .expect("splice");
        assert_eq!(prefix.cached_tokens, 32, "{arch:?}");
        let reused = cache
            .edit_prefill(&model, &edited, prefix.cached_tokens, &blend(0.0), 8)
            .expect("edit reuse")
            .expect("more than the prefix is reused");
        let stats = &reused.stats;
        // The old prompt's 7 full blocks (112 rows), less the changed token.
        assert_eq!(stats.tokens_reused, 111, "{arch:?}");
        assert_eq!(stats.tokens_new, edited.len() - 111, "{arch:?}");
        assert_eq!(stats.tokens_recomputed, 0, "{arch:?}");
        let mut positions = reused.kv.positions().to_vec();
        positions.sort_unstable();
        assert_eq!(positions, (0..edited.len() as u32).collect::<Vec<_>>());

        let (full_kv, full_logits) = full(&model, &edited);
        assert_close(
            &layer0_keys(&reused.kv),
            &layer0_keys(&full_kv),
            RELATIVE_TOLERANCE,
            &format!("{arch:?}: layer 0 keys, spliced rows re-rotated"),
        );
        let everything = cache
            .edit_prefill(&model, &edited, prefix.cached_tokens, &blend(1.0), 8)
            .expect("edit reuse")
            .expect("reused");
        assert_eq!(everything.stats.tokens_recomputed, 111, "{arch:?}");
        assert_close(
            &everything.logits,
            &full_logits,
            RELATIVE_TOLERANCE,
            &format!("{arch:?}: recomputing every reused row is a full prefill"),
        );
    }
}

#[test]
fn a_prompt_with_nothing_to_gain_over_its_prefix_is_left_to_the_prefix_splice() {
    let model = random_model(Arch::Qwen2, 5, WeightFormat::F32, &Device::Cpu).expect("model");
    let cache = cache_with_old(&model);
    // The old prompt and 70 more tokens: its blocks are all an exact prefix, and the diff finds
    // nothing more (it would need 112 + 64 matched tokens).
    let mut longer = old_prompt();
    longer.extend((0..70u32).map(|i| 220 + i % 30));
    let prefix = cache
        .splice(&model, &longer, 0, usize::MAX)
        .expect("splice");
    assert_eq!(prefix.cached_tokens, 112);
    let edit = cache
        .edit_prefill(&model, &longer, prefix.cached_tokens, &blend(0.15), 8)
        .expect("no error");
    assert!(edit.is_none());
    // Unrelated text matches nothing worth it.
    let other: Vec<u32> = (0..150u32).map(|i| 201 + i % 50).collect();
    let edit = cache
        .edit_prefill(&model, &other, 0, &blend(0.15), 8)
        .expect("no error");
    assert!(edit.is_none());
}
