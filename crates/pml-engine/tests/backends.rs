//! The candle path of the kernels seam (the only one on CUDA) against the native CPU kernels, on
//! the same weights: the tiny model of every family, prefill then decode, in f32 and with
//! quantized blocks; and the real models' last-position logits.
//!
//! The path under test is candle's on the CPU, or on `$PML_DEVICE` when it names another
//! device (`PML_DEVICE=cuda` on a GPU machine, scripts/gpu-check.sh); `PML_REQUIRE_GPU=1`
//! fails the run instead of testing the CPU when no GPU was selected.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

use candle_core::{IndexOp, Tensor};
use pml_engine::Tokenizer;
use pml_engine::device::{Backend, BackendChoice, Kernels, select_backend};
use pml_engine::gguf::GgufFile;
use pml_engine::model::tiny::random_model_on;
use pml_engine::model::{
    Arch, Linear, MatrixRole, Model, ModelConfig, Multiplier, TensorMap, WeightFormat,
};
use pml_engine::testing::{
    argmax, flash_and_ops_attention, last_position_logits, max_abs_diff, prefill_then_decode,
};
use pml_engine::tokenizer::GgufTokenizer;
use pml_kernels::AttentionCall;
use pml_testkit::fetched_model;

const SEED: u64 = 11;
/// f32 weights: only summation order differs (matmul blocking, softmax's reductions).
const F32_TOLERANCE: f32 = 2e-4;
/// Quantized weights: each path quantizes the activations its own way (our kernels to 8 bits
/// per block, candle's CPU kernels to Q8_0 too, its CUDA ones to Q8_1 or not at all), so logits
/// move by up to a few percent of the largest logit.
const QUANTIZED_RELATIVE_TOLERANCE: f32 = 0.03;

/// The backend whose kernels are tested against the native CPU ones.
fn backend_under_test() -> Backend {
    let choice = BackendChoice::resolve(None, None).expect("PML_DEVICE / PML_KERNELS parse");
    let backend = select_backend(choice).expect("the device opens");
    if std::env::var_os("PML_REQUIRE_GPU").is_some_and(|value| value != "0") {
        assert!(
            !backend.device.is_cpu(),
            "PML_REQUIRE_GPU is set but PML_DEVICE selects the CPU"
        );
    }
    match backend.kernels {
        Kernels::Candle => backend,
        Kernels::Native => Backend::candle_cpu(),
    }
}

/// The native backend's quantized matrices: our kernels where the CPU has AVX2 (and they are
/// not turned off), else candle's SIMD kernels (NEON on aarch64), never our scalar loops. On an
/// aarch64 build (scripts/test-aarch64.sh, under qemu) this must be candle's.
#[test]
fn quantized_matrices_take_our_kernels_only_with_avx2() {
    use candle_core::quantized::{GgmlDType, QTensor};
    let weights = Tensor::randn(0f32, 1.0, (64, 256), &candle_core::Device::Cpu).expect("randn");
    for dtype in [
        GgmlDType::Q5_0,
        GgmlDType::Q4K,
        GgmlDType::Q8_0,
        GgmlDType::Q6K,
    ] {
        let mut source = TensorMap::default();
        let qtensor = QTensor::quantize(&weights, dtype).expect("quantize");
        source.0.insert("w".to_string(), qtensor);
        let linear = Linear::load(
            &mut source,
            "w",
            None,
            MatrixRole::Projection,
            WeightFormat::Quantized,
            &native(),
        )
        .expect("loads");
        let avx2 = std::env::var_os("PML_NO_AVX2")
            .is_none_or(|value| value.is_empty() || value == "0")
            && cpu_has_avx2();
        let expected = if avx2 {
            Multiplier::Ours
        } else {
            Multiplier::Candle
        };
        eprintln!("{dtype:?}: {:?}", linear.multiplied_by());
        assert_eq!(linear.multiplied_by(), expected, "{dtype:?}");
        if cfg!(target_arch = "aarch64") {
            assert_eq!(
                linear.multiplied_by(),
                Multiplier::Candle,
                "{dtype:?} on ARM"
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn cpu_has_avx2() -> bool {
    is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c")
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_has_avx2() -> bool {
    false
}

fn native() -> Backend {
    Backend::on(&candle_core::Device::Cpu)
}

fn largest_magnitude(logits: &Tensor) -> f32 {
    logits
        .abs()
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.max(0))
        .and_then(|t| t.to_scalar::<f32>())
        .expect("max")
}

#[test]
fn tiny_models_agree_with_the_native_kernels() {
    let under_test = backend_under_test();
    let tokens: Vec<u32> = (0..37u32).map(|i| (i * 53 + 7) % 256).collect();
    for arch in Arch::ALL {
        for format in [WeightFormat::F32, WeightFormat::Quantized] {
            let reference = random_model_on(arch, SEED, format, &native()).expect("native model");
            let tested = random_model_on(arch, SEED, format, &under_test).expect("tested model");
            assert_eq!(tested.kernels(), Kernels::Candle);
            // Decode steps feed the native model's own greedy tokens to both.
            let prefill = prefill_then_decode(&reference, &tokens, &[]);
            let last = prefill.i(tokens.len() - 1).expect("last row");
            let first = argmax(&last.to_vec1::<f32>().expect("row")) as u32;
            let chosen = [first, (first + 1) % 256, 3, 250];
            let expected = prefill_then_decode(&reference, &tokens, &chosen);
            let actual = prefill_then_decode(&tested, &tokens, &chosen);
            let difference = max_abs_diff(&expected, &actual);
            let tolerance = match format {
                WeightFormat::F32 => F32_TOLERANCE,
                _ => QUANTIZED_RELATIVE_TOLERANCE * largest_magnitude(&expected),
            };
            assert!(
                difference <= tolerance,
                "{arch:?} {format:?}: max |Δlogit| {difference} > {tolerance}"
            );
        }
    }
}

/// Half-precision caches on the path under test against its f32 cache, tiny models of every
/// family, prefill then decode. On the CPU K and V are rounded as written and attention runs in
/// f32; on CUDA the attention's products and softmax run in the cache's dtype too (tensor
/// cores, the masked-softmax kernel). The bound is the real models' (`engine_real`'s
/// `f16_cache_stays_close_to_f32`): far below what a wrong row, head or dtype gives.
#[test]
fn half_precision_caches_track_the_f32_cache() {
    use candle_core::DType;
    let under_test = backend_under_test();
    let tokens: Vec<u32> = (0..41u32).map(|i| (i * 37 + 5) % 256).collect();
    let chosen = [9u32, 200, 3, 77];
    for arch in Arch::ALL {
        let exact = random_model_on(arch, SEED, WeightFormat::F32, &under_test).expect("model");
        let expected = prefill_then_decode(&exact, &tokens, &chosen);
        let scale = largest_magnitude(&expected);
        for dtype in [DType::F16, DType::BF16] {
            let backend = under_test.clone().with_kv_dtype(dtype);
            let half = random_model_on(arch, SEED, WeightFormat::F32, &backend).expect("model");
            let actual = prefill_then_decode(&half, &tokens, &chosen);
            let difference = max_abs_diff(&expected, &actual);
            eprintln!("{arch:?} {dtype:?} cache: max |Δlogit| {difference:.3e} of {scale:.2}");
            assert!(
                difference <= 0.3 * scale,
                "{arch:?} {dtype:?}: max |Δlogit| {difference} of {scale}"
            );
        }
    }
}

/// A cache whose first rows are a span shared with other caches (as the prefix cache hands
/// out) computes what a cache that copied them computes: a prompt's last chunk, then decode
/// steps alone and batched, on every tiny family, with the native kernels (which read each
/// segment in place) and the path under test (which joins them for candle's ops), f32 and f16
/// caches.
#[test]
fn shared_rows_compute_what_copied_rows_do() {
    use candle_core::DType;
    use pml_engine::kv_cache::{KvBlock, KvCache};
    use pml_engine::model::BatchSlot;
    use std::sync::Arc;
    let tokens: Vec<u32> = (0..150u32).map(|i| (i * 37 + 5) % 256).collect();
    let (prefix, rest) = tokens.split_at(144);
    for backend in [native(), backend_under_test()] {
        for dtype in [DType::F32, DType::F16] {
            let backend = backend.clone().with_kv_dtype(dtype);
            for arch in Arch::ALL {
                let model =
                    random_model_on(arch, SEED, WeightFormat::F32, &backend).expect("model");
                let mut first = model.new_kv_cache().expect("cache");
                let positions: Vec<u32> = (0..144).collect();
                model
                    .forward(prefix, &positions, &mut first)
                    .expect("prefix");
                let span = Arc::new(first.to_block().expect("block"));
                let blocks: Vec<KvBlock> = (0..144)
                    .step_by(16)
                    .map(|start| KvBlock::view(&span, start..start + 16).expect("view"))
                    .collect();
                let blocks: Vec<&KvBlock> = blocks.iter().collect();
                let (layout, device) = (model.kv_layout(), model.device());
                let run = |mut kv: KvCache| {
                    let positions: Vec<u32> = (144..150).collect();
                    let mut logits = vec![model.forward(rest, &positions, &mut kv).expect("rest")];
                    // Two sequences on the same rows decode together.
                    let mut other = kv.clone();
                    for (step, token) in [9u32, 200].into_iter().enumerate() {
                        let position = [150 + step as u32];
                        let mut batch = [
                            BatchSlot {
                                tokens: &[token],
                                positions: &position,
                                kv: &mut kv,
                            },
                            BatchSlot {
                                tokens: &[3],
                                positions: &position,
                                kv: &mut other,
                            },
                        ];
                        logits.push(model.forward_batch(&mut batch).expect("step"));
                    }
                    logits
                        .iter()
                        .flat_map(|l| l.flatten_all().unwrap().to_vec1::<f32>().unwrap())
                        .collect::<Vec<f32>>()
                };
                let shared =
                    KvCache::from_shared_blocks(layout, device, &blocks, 8).expect("shared");
                assert_eq!(shared.shared_rows(), 144, "{arch:?}: read in place");
                let copied = KvCache::from_blocks(layout, device, &blocks, 8).expect("copied");
                let (shared, copied) = (run(shared), run(copied));
                let difference = max_difference(&shared, &copied);
                eprintln!(
                    "{arch:?} {dtype:?} {:?}: max |Δlogit| {difference:.2e}",
                    backend.kernels
                );
                assert!(
                    difference < 1e-4,
                    "{arch:?} {dtype:?} {:?}: {difference}",
                    backend.kernels
                );
            }
        }
    }
}

/// The flash-attention kernel (CUDA, half-precision caches) against the ops path on the same
/// operands and against f32 attention on the CPU: prefills whose tiles and row blocks end
/// part-way, a sliding window, keys out of position order with a gap and a repeat (spliced
/// modules), a query that sees no key, a few queries over many keys (a cached prompt's new
/// text), both head sizes the kernel has and both half dtypes. Off CUDA the kernel must not
/// apply and the ops path is checked against f32 alone.
#[test]
fn flash_attention_matches_the_ops_path() {
    use candle_core::{DType, Device};
    let under_test = backend_under_test();
    let device = &under_test.device;
    // (dtype, head_dim, n_heads, n_kv_heads, n_queries, n_keys, window, keys shuffled, rows of
    // the cache before the keys: read at an offset, as a window's visible slots are)
    let cases = [
        (DType::F16, 64, 9, 3, 300, 300, None, false, 0),
        (DType::BF16, 64, 9, 3, 300, 300, None, false, 0),
        (DType::F16, 64, 14, 2, 130, 250, Some(50), false, 0),
        (DType::F16, 64, 9, 3, 256, 600, Some(200), false, 0),
        (DType::F16, 128, 8, 2, 5, 1000, None, true, 0),
        (DType::BF16, 128, 4, 4, 70, 197, None, true, 0),
        (DType::BF16, 64, 9, 3, 40, 300, None, false, 72),
        (DType::F16, 64, 9, 3, 1, 4100, None, false, 0),
    ];
    for (dtype, head_dim, n_heads, n_kv_heads, n_queries, n_keys, window, shuffled, offset) in cases
    {
        let random = |rows: usize, heads: usize, seed: u64| {
            let cpu = &Device::Cpu;
            let values: Vec<f32> = (0..rows * heads * head_dim)
                .map(|i| {
                    let x = (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15 ^ seed);
                    ((x >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
                })
                .collect();
            Tensor::from_vec(values, (rows, heads, head_dim), cpu).expect("tensor")
        };
        // Queries pre-scaled as the model's are.
        let queries =
            (random(n_queries, n_heads, 1) * (head_dim as f64).powf(-0.5)).expect("scale");
        let rows = |seed: u64| {
            random(offset + n_keys, n_kv_heads, seed)
                .to_dtype(dtype)
                .and_then(|rows| rows.to_device(device))
                .and_then(|rows| rows.narrow(0, offset, n_keys))
                .expect("rows")
        };
        let (keys, values) = (rows(2), rows(3));
        let mut key_positions: Vec<u32> = (0..n_keys as u32).collect();
        if shuffled {
            // Two modules laid out apart (a gap of 40), the second written first, and one
            // repeated position.
            let half = n_keys / 2;
            key_positions = (0..n_keys as u32)
                .map(|k| {
                    if (k as usize) < half {
                        k + half as u32 + 40
                    } else {
                        k - half as u32
                    }
                })
                .collect();
            key_positions[3] = key_positions[4];
        }
        let latest = key_positions.iter().copied().max().unwrap_or(0);
        let mut query_positions: Vec<u32> = (0..n_queries as u32)
            .map(|q| latest + 1 + q - n_queries.min(n_keys) as u32)
            .collect();
        if n_queries > 2 {
            query_positions[1] = 0; // sees the key at 0 only (or nothing, when shuffled)
        }
        let (flash, by_ops) = flash_and_ops_attention(AttentionCall {
            queries: &queries.to_device(device).expect("to device"),
            query_positions: &query_positions,
            keys: &keys,
            values: &values,
            key_positions: &key_positions,
            window,
        });
        let on_host = |rows: &Tensor| {
            rows.to_device(&Device::Cpu)
                .and_then(|rows| rows.to_dtype(DType::F32))
                .expect("f32 on the host")
        };
        let (_, exact) = flash_and_ops_attention(AttentionCall {
            queries: &queries,
            query_positions: &query_positions,
            keys: &on_host(&keys),
            values: &on_host(&values),
            key_positions: &key_positions,
            window,
        });
        let bound = if dtype == DType::F16 { 1e-2 } else { 6e-2 };
        let ops_error = max_abs_diff(&exact, &by_ops.to_device(&Device::Cpu).expect("to host"));
        let case = format!(
            "{dtype:?} head {head_dim}, {n_heads}/{n_kv_heads} heads, {n_queries}×{n_keys} at \
             row {offset}, window {window:?}, shuffled {shuffled}"
        );
        if !device.is_cuda() {
            assert!(flash.is_none(), "{case}: the flash kernel applies off CUDA");
            assert!(ops_error <= bound, "{case}: ops path {ops_error}");
            continue;
        }
        let flash = flash.expect("the flash kernel applies on CUDA to a half-precision cache");
        let flash_error = max_abs_diff(&exact, &flash.to_device(&Device::Cpu).expect("to host"));
        eprintln!("{case}: max |Δ| from f32: flash {flash_error:.2e}, ops {ops_error:.2e}");
        assert!(
            flash_error <= bound,
            "{case}: flash {flash_error} > {bound}"
        );
    }
}

/// A fixed text through each registered model on both paths. With f32 weights the paths agree to
/// summation noise and on the greedy token; with the file's quantized blocks each path
/// approximates the f32 logits its own way, and the candle path's deviation from them must stay
/// within twice the native kernels' (both are printed).
#[test]
fn real_models_agree_with_the_native_kernels() {
    let under_test = backend_under_test();
    let text = "Prompt modules are declared once and their attention states are reused by every \
                prompt that imports them, so only the new text is computed. The capital of \
                France is";
    for id in ["smollm2-135m", "qwen2.5-0.5b", "gemma3-270m"] {
        let Some(path) = fetched_model(id) else {
            continue;
        };
        let gguf = GgufFile::open(&path).expect("opens");
        let tokenizer = GgufTokenizer::from_gguf(&gguf).expect("tokenizer");
        let mut ids: Vec<u32> = tokenizer.bos_token().into_iter().collect();
        ids.extend(tokenizer.encode(text, false).expect("encodes"));
        let logits = |format: WeightFormat, backend: &Backend| {
            let config = ModelConfig::from_gguf(&gguf).expect("config");
            let model =
                Model::from_source_on(config, &mut &gguf, format, backend).expect("model loads");
            last_position_logits(&model, &ids)
        };
        let exact = logits(WeightFormat::F32, &native());
        let exact_tested = logits(WeightFormat::F32, &under_test);
        let f32_difference = max_difference(&exact, &exact_tested);
        assert_eq!(
            argmax(&exact),
            argmax(&exact_tested),
            "{id}: greedy token, f32"
        );
        assert!(
            f32_difference <= F32_REAL_TOLERANCE,
            "{id}: f32 weights, max |Δlogit| {f32_difference} > {F32_REAL_TOLERANCE}"
        );
        let native_deviation = max_difference(&exact, &logits(WeightFormat::default(), &native()));
        let tested_deviation =
            max_difference(&exact, &logits(WeightFormat::default(), &under_test));
        let largest = exact.iter().map(|value| value.abs()).fold(0f32, f32::max);
        eprintln!(
            "{id}: {} tokens; f32 weights max |Δlogit| {f32_difference:.5}; quantized, max \
             |Δlogit| from f32: native {native_deviation:.3}, {} {tested_deviation:.3} \
             (largest logit {largest:.2})",
            ids.len(),
            if under_test.device.is_cpu() {
                "candle"
            } else {
                "candle on the device"
            },
        );
        // On a GPU candle's kernels quantize activations to Q8_1 in the MMQ/MMVQ kernels:
        // SmolLM2 on an H200 deviates 1.61 of a largest logit of 17.1 (9.4%), against the
        // native kernels' 0.94 on an AVX2 CPU and 0.60 on an AVX-512 one: so the device's bound is a share of the largest logit, still far below
        // what a wrong block type or row gives (unrelated logits, order 100%).
        let bound = if under_test.device.is_cpu() {
            2.0 * native_deviation
        } else {
            DEVICE_QUANTIZED_RELATIVE_TOLERANCE * largest
        };
        assert!(
            tested_deviation <= bound,
            "{id}: quantized logits deviate {tested_deviation} from f32 (bound {bound}), native \
             {native_deviation}"
        );
    }
}

/// Quantized weights on a GPU: the largest deviation from the f32 logits, as a share of the
/// largest logit.
const DEVICE_QUANTIZED_RELATIVE_TOLERANCE: f32 = 0.15;

/// Weights in f32, real model: matmuls of a few hundred terms summed in other orders.
const F32_REAL_TOLERANCE: f32 = 2e-3;

fn max_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}
