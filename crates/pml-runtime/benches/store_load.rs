//! Load and store throughput of the module store for a state the size of the default model's
//! (Qwen2.5-0.5B: 24 layers, 2 KV heads, head dim 64, f32 KV) over 1,000 tokens, about 24 MiB:
//! a RAM-tier hit, a disk-tier hit (page cache warm: map, checksum, decode), decoding the bytes
//! alone (what a remote tier would pay after the transfer), the sha256 pass alone (the part of a
//! decode spent verifying), and a disk put (encode, checksum, write, two fsyncs).

use std::hint::black_box;
use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pml_runtime::kv_cache::{KvBlock, KvLayout};
use pml_runtime::store::{
    ContextHash, DiskTier, MemoryTier, ModuleState, StateSpec, StoreKey, StoreKeyParts, Tier,
};
use sha2::{Digest, Sha256};

const N_TOKENS: usize = 1000;

const LAYOUT: KvLayout = KvLayout {
    n_layers: 24,
    n_kv_heads: 2,
    head_dim: 64,
    dtype: DType::F32,
};

fn default_model_state() -> (StoreKey, StateSpec, Arc<ModuleState>) {
    let spec = StateSpec {
        model_fingerprint: "bench".to_string(),
        layout: LAYOUT,
    };
    let tokens: Vec<u32> = (0..N_TOKENS as u32).collect();
    let key = StoreKeyParts {
        model_fingerprint: &spec.model_fingerprint,
        weight_format: Default::default(),
        kv_dtype: LAYOUT.dtype,
        kind: Default::default(),
        encode_mode: Default::default(),
        tokens: &tokens,
        positions: &tokens,
        context: ContextHash::NONE,
    }
    .key();
    let shape = (N_TOKENS, LAYOUT.n_kv_heads, LAYOUT.head_dim);
    let layers = (0..LAYOUT.n_layers)
        .map(|_| {
            Ok((
                Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?,
                Tensor::randn(0f32, 1.0, shape, &Device::Cpu)?,
            ))
        })
        .collect::<candle_core::Result<Vec<_>>>()
        .expect("random tensors");
    let kv = KvBlock::new(layers, tokens.clone()).expect("consistent block");
    let state = ModuleState::new(kv, tokens).expect("one token per row");
    (key, spec, Arc::new(state))
}

fn store_load(criterion: &mut Criterion) {
    let (key, spec, state) = default_model_state();
    let bytes = state.size_in_bytes() as u64;
    let root = tempfile::tempdir().expect("temporary directory");
    let disk = DiskTier::open(root.path(), spec.clone()).expect("disk tier");
    let memory = MemoryTier::new(4 * bytes);
    disk.put(&key, &state).expect("disk put");
    memory.put(&key, &state).expect("ram put");
    let encoded = state.to_safetensors(&key, &spec).expect("encode");

    let mut group = criterion.benchmark_group("store_1k_tokens_qwen2.5_0.5b_f32");
    group.sample_size(20);
    group.throughput(Throughput::Bytes(bytes));
    group.bench_function("ram_get", |bench| {
        bench.iter(|| black_box(memory.get(&key).expect("ram get")))
    });
    group.bench_function("disk_get", |bench| {
        bench.iter(|| black_box(disk.get(&key).expect("disk get")))
    });
    group.bench_function("decode_bytes", |bench| {
        bench.iter(|| {
            black_box(ModuleState::from_safetensors(&encoded, &key, &spec).expect("decode"))
        })
    });
    group.bench_function("sha256_only", |bench| {
        bench.iter(|| black_box(Sha256::digest(&encoded)))
    });
    group.bench_function("disk_put", |bench| {
        bench.iter(|| black_box(disk.put(&key, &state).expect("disk put")))
    });
    group.finish();
}

criterion_group!(benches, store_load);
criterion_main!(benches);
