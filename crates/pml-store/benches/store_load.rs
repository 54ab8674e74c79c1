//! Load and splice costs of the module store for a state the size of the default model's
//! (Qwen2.5-0.5B: 24 layers, 2 KV heads, head dim 64) over 4,096 tokens, the cached document of
//! design §6: 101 MB stored in f32, 50 MB in f16 (the default). For each stored dtype: a RAM-tier
//! hit, a disk-tier hit (page cache warm: map, verify the checksum, decode; K and V stay in
//! the map), decoding the bytes alone (what a remote tier pays after the transfer), splicing the loaded state into the
//! engine's f32 KV cache, the disk hit and the splice together (what `pml run --mode reuse`
//! spends before computing), and a disk put. Then the checksum's hash alone over the f16 file: XXH3-128
//! on one core (the store hashes 8 MiB pieces of it side by side) and sha256 (store format 1's)
//! for comparison.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device, Tensor};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use pml_engine::kv_cache::{KvBlock, KvCache, KvLayout};
use pml_store::{
    ContextHash, DiskTier, MemoryTier, ModuleState, StateSpec, StoreKey, StoreKeyParts, Tier,
};
use sha2::{Digest, Sha256};

const N_TOKENS: usize = 4096;
/// Slots the splice leaves for the question and the answer.
const RESERVE: usize = 64;

const LAYOUT: KvLayout = KvLayout {
    n_layers: 24,
    n_kv_heads: 2,
    head_dim: 64,
    dtype: DType::F32,
};

fn default_model_state(state_dtype: DType) -> (StoreKey, StateSpec, Arc<ModuleState>) {
    let spec = StateSpec::new("bench", LAYOUT).with_state_dtype(state_dtype);
    let tokens: Vec<u32> = (0..N_TOKENS as u32).collect();
    let key = StoreKeyParts {
        model_fingerprint: &spec.model_fingerprint,
        weight_format: Default::default(),
        kv_dtype: LAYOUT.dtype,
        state_dtype,
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
    let state = ModuleState::new(kv, tokens)
        .and_then(|state| state.to_dtype(state_dtype))
        .expect("one token per row");
    (key, spec, Arc::new(state))
}

fn splice(state: &ModuleState) -> KvCache {
    KvCache::from_blocks(LAYOUT, &Device::Cpu, &[state.kv()], RESERVE).expect("splice")
}

fn store_load(criterion: &mut Criterion) {
    let mut f16_file = Vec::new();
    for state_dtype in [DType::F32, DType::F16] {
        let (key, spec, state) = default_model_state(state_dtype);
        let bytes = state.size_in_bytes() as u64;
        let root = tempfile::tempdir().expect("temporary directory");
        let disk = DiskTier::open(root.path(), spec.clone()).expect("disk tier");
        let memory = MemoryTier::new(4 * bytes);
        disk.put(&key, &state).expect("disk put");
        memory.put(&key, &state).expect("ram put");
        let encoded = Arc::new(state.to_safetensors(&key, &spec).expect("encode"));

        let name = format!("store_4k_tokens_qwen2.5_0.5b_{}", state_dtype.as_str());
        let mut group = criterion.benchmark_group(name);
        group.sample_size(10);
        group.measurement_time(Duration::from_secs(6));
        group.throughput(Throughput::Bytes(bytes));
        group.bench_function("ram_get", |bench| {
            bench.iter(|| black_box(memory.get(&key).expect("ram get")))
        });
        group.bench_function("disk_get", |bench| {
            bench.iter(|| black_box(disk.get(&key).expect("disk get")))
        });
        group.bench_function("decode_bytes", |bench| {
            bench.iter(|| {
                black_box(
                    ModuleState::from_safetensors(encoded.clone(), &key, &spec).expect("decode"),
                )
            })
        });
        group.bench_function("splice_into_f32_cache", |bench| {
            bench.iter(|| black_box(splice(&state)))
        });
        group.bench_function("disk_get_and_splice", |bench| {
            bench.iter(|| {
                let loaded = disk.get(&key).expect("disk get").expect("hit");
                black_box(splice(&loaded))
            })
        });
        group.bench_function("disk_put", |bench| {
            bench.iter(|| black_box(disk.put(&key, &state).expect("disk put")))
        });
        group.finish();
        if state_dtype == DType::F16 {
            f16_file = encoded.to_vec();
        }
    }

    let mut group = criterion.benchmark_group("checksum_of_the_4k_f16_file");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(f16_file.len() as u64));
    group.bench_function("xxh3_128_one_core", |bench| {
        bench.iter(|| black_box(xxhash_rust::xxh3::xxh3_128(&f16_file)))
    });
    group.bench_function("sha256", |bench| {
        bench.iter(|| black_box(Sha256::digest(&f16_file)))
    });
    group.finish();
}

criterion_group!(benches, store_load);
criterion_main!(benches);
