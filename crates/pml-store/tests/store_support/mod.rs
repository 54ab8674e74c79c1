//! Shared by the store tests: deterministic states whose every value follows from a seed, so
//! separate processes build byte-identical states for the same key, and exact comparisons.

#![allow(dead_code)] // each test binary uses a different subset

use candle_core::{DType, Device, Tensor};
use pml_engine::kv_cache::{KvBlock, KvLayout};
use pml_store::{ContextHash, ModuleState, StateSpec, StoreError, StoreKey, StoreKeyParts};

pub const FINGERPRINT: &str = "5eed0000aaaa1111bbbb2222cccc3333";

pub const LAYOUT: KvLayout = KvLayout {
    n_layers: 3,
    n_kv_heads: 2,
    head_dim: 8,
    dtype: DType::F32,
};

/// The stored dtype of [`spec`]: the store's default, f16, under an f32 engine ([`LAYOUT`]).
pub const STATE_DTYPE: DType = DType::F16;

pub fn spec() -> StateSpec {
    StateSpec::new(FINGERPRINT, LAYOUT)
}

/// Tokens and positions of unit `seed`: `n_tokens` tokens starting at position `10 * seed`.
pub fn unit_tokens(seed: u32, n_tokens: usize) -> (Vec<u32>, Vec<u32>) {
    let tokens = (0..n_tokens as u32)
        .map(|i| (seed * 31 + i * 7) % 256)
        .collect();
    let positions = (0..n_tokens as u32).map(|i| 10 * seed + i).collect();
    (tokens, positions)
}

pub fn key_of(seed: u32, n_tokens: usize) -> StoreKey {
    key_of_dtype(seed, n_tokens, STATE_DTYPE)
}

/// [`key_of`] for states stored in `state_dtype`.
pub fn key_of_dtype(seed: u32, n_tokens: usize, state_dtype: DType) -> StoreKey {
    let (tokens, positions) = unit_tokens(seed, n_tokens);
    StoreKeyParts {
        model_fingerprint: FINGERPRINT,
        weight_format: Default::default(),
        kv_dtype: LAYOUT.dtype,
        state_dtype,
        kind: Default::default(),
        encode_mode: Default::default(),
        tokens: &tokens,
        positions: &positions,
        context: ContextHash::NONE,
    }
    .key()
}

/// A state of `layout` whose values are a function of `seed` and the element index.
pub fn state_with(layout: KvLayout, seed: u32, n_tokens: usize) -> ModuleState {
    let (tokens, positions) = unit_tokens(seed, n_tokens);
    let shape = (n_tokens, layout.n_kv_heads, layout.head_dim);
    let n_values = n_tokens * layout.n_kv_heads * layout.head_dim;
    let tensor = |salt: usize| {
        let values: Vec<f32> = (0..n_values)
            .map(|i| ((i * 13 + salt * 101 + seed as usize * 7) % 997) as f32 / 97.0 - 5.0)
            .collect();
        Tensor::from_vec(values, shape, &Device::Cpu)
            .and_then(|t| t.to_dtype(layout.dtype))
            .expect("tensor builds")
    };
    let layers = (0..layout.n_layers)
        .map(|layer_idx| (tensor(2 * layer_idx), tensor(2 * layer_idx + 1)))
        .collect();
    let kv = KvBlock::new(layers, positions).expect("block");
    ModuleState::new(kv, tokens).expect("state")
}

/// A state of [`spec`]: [`LAYOUT`] in the stored dtype.
pub fn state(seed: u32, n_tokens: usize) -> ModuleState {
    let stored = KvLayout {
        dtype: STATE_DTYPE,
        ..LAYOUT
    };
    state_with(stored, seed, n_tokens)
}

fn values(tensor: &Tensor) -> Vec<f32> {
    tensor
        .to_dtype(DType::F32)
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .expect("values")
}

/// Panics unless the two states hold the same tokens, positions, dtypes, shapes and values.
pub fn assert_same_state(actual: &ModuleState, expected: &ModuleState) {
    assert_eq!(actual.kind(), expected.kind(), "kind");
    assert_eq!(actual.tokens(), expected.tokens(), "tokens");
    assert_eq!(actual.positions(), expected.positions(), "positions");
    assert_eq!(actual.kv().n_layers(), expected.kv().n_layers(), "layers");
    for (layer_idx, ((k1, v1), (k2, v2))) in actual
        .kv()
        .layers()
        .expect("actual tensors")
        .iter()
        .zip(expected.kv().layers().expect("expected tensors"))
        .enumerate()
    {
        for (a, b, what) in [(k1, k2, "K"), (v1, v2, "V")] {
            assert_eq!(a.dims(), b.dims(), "layer {layer_idx} {what} shape");
            assert_eq!(a.dtype(), b.dtype(), "layer {layer_idx} {what} dtype");
            assert_eq!(values(a), values(b), "layer {layer_idx} {what} values");
        }
    }
}

/// Every file under `dir`, recursively, as paths relative to it.
pub fn files_under(dir: &std::path::Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).expect("readable dir") {
            let path = entry.expect("entry").path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(dir).expect("under dir");
                found.push(relative.display().to_string());
            }
        }
    }
    found.sort();
    found
}

/// [`ModuleState::from_safetensors`] on a copy of `bytes` (a file's contents or a part of them).
pub fn decode(bytes: &[u8], key: &StoreKey, spec: &StateSpec) -> Result<ModuleState, StoreError> {
    ModuleState::from_safetensors(std::sync::Arc::new(bytes.to_vec()), key, spec)
}

/// Bytes of one test state as a tier stores it.
pub fn state_bytes() -> u64 {
    state(0, 10)
        .to_safetensors(&key_of(0, 10), &spec())
        .expect("bytes")
        .len() as u64
}

/// Two Redis tiers of one namespace (two processes, in effect) whose shared budget holds 2.5
/// states: after 1 and 2 are put and 1 is read, putting 3 evicts 2, the least recently used.
pub fn assert_shared_budget_evicts_least_recently_used(
    first: &pml_store::RedisTier,
    second: &pml_store::RedisTier,
) {
    use pml_store::Tier;
    use std::sync::Arc;
    let put = |tier: &pml_store::RedisTier, seed| {
        tier.put(&key_of(seed, 10), &Arc::new(state(seed, 10)))
            .expect("put");
    };
    put(first, 1);
    put(second, 2);
    // Reading 1 makes 2 the least recently used.
    assert!(second.get(&key_of(1, 10)).expect("get").is_some());
    put(first, 3);
    assert!(first.contains(&key_of(1, 10)).expect("contains"));
    assert!(
        !first.contains(&key_of(2, 10)).expect("contains"),
        "2 was least recently used"
    );
    assert!(first.contains(&key_of(3, 10)).expect("contains"));
    assert_eq!(first.held_bytes().expect("held"), Some(2 * state_bytes()));
}
