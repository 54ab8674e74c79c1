//! Properties of the transformer engine checked on the tiny random models of both families:
//! incremental decoding, RoPE relativity, layer-wise subset recompute, KV splicing and
//! re-positioning, Gemma's sliding window, and K/V restore from hidden states.

use candle_core::{DType, Device, IndexOp, Tensor};
use pml_engine::kv_cache::{KvBlock, KvCache};
use pml_engine::model::tiny::{TINY_SLIDING_WINDOW, random_model};
use pml_engine::model::{
    Arch, AttentionObserver, AttentionView, EngineError, ForwardContext, ForwardOptions, LogitRows,
    Model, WeightFormat,
};
use pml_engine::testing::max_abs_diff;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const SEED: u64 = 7;
const ARCHES: [Arch; Arch::ALL.len()] = Arch::ALL;
/// f32 everywhere: differences are summation-order noise.
const TOLERANCE: f32 = 1e-4;

fn model(arch: Arch) -> Model {
    random_model(arch, SEED, WeightFormat::F32, &Device::Cpu).expect("tiny model builds")
}

fn random_tokens(n_tokens: usize, seed: u64) -> Vec<u32> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n_tokens).map(|_| rng.random_range(0..256)).collect()
}

fn assert_close(a: &Tensor, b: &Tensor, tolerance: f32, what: &str) {
    let diff = max_abs_diff(a, b);
    assert!(
        diff <= tolerance,
        "{what}: max abs diff {diff} > {tolerance}"
    );
}

/// Runs `tokens` at `positions` on an empty cache; logits of every row.
fn full_forward(
    model: &Model,
    tokens: &[u32],
    positions: &[u32],
) -> (Tensor, KvCache, Vec<Tensor>, Tensor) {
    let mut kv = model.new_kv_cache().expect("cache");
    let context = ForwardContext::appending(positions.to_vec(), &kv);
    let options = ForwardOptions {
        logits: LogitRows::All,
        keep_layer_inputs: true,
    };
    let output = model
        .forward_with(tokens, &context, &mut kv, &options)
        .expect("forward");
    (
        output.logits.expect("logits asked for"),
        kv,
        output.layer_inputs,
        output.hidden,
    )
}

fn assert_caches_close(a: &KvCache, b: &KvCache, what: &str) {
    assert_eq!(a.positions(), b.positions(), "{what}: positions");
    for layer_idx in 0..a.n_layers() {
        let (layer_a, layer_b) = (a.layer(layer_idx).unwrap(), b.layer(layer_idx).unwrap());
        assert_close(
            &layer_a.keys().unwrap(),
            &layer_b.keys().unwrap(),
            TOLERANCE,
            what,
        );
        assert_close(
            &layer_a.values().unwrap(),
            &layer_b.values().unwrap(),
            TOLERANCE,
            what,
        );
    }
}

#[test]
fn one_pass_equals_token_by_token_decoding() {
    for arch in ARCHES {
        let model = model(arch);
        // Longer than the tiny Gemma's window, so local layers drop keys while decoding.
        let tokens = random_tokens(3 * TINY_SLIDING_WINDOW, 1);
        let positions: Vec<u32> = (0..tokens.len() as u32).collect();
        let (full_logits, full_kv, _, _) = full_forward(&model, &tokens, &positions);

        let mut kv = model.new_kv_cache().unwrap();
        for (row, (&token, &position)) in tokens.iter().zip(&positions).enumerate() {
            let logits = model.forward(&[token], &[position], &mut kv).unwrap();
            assert_close(
                &logits,
                &full_logits.i(row).unwrap(),
                TOLERANCE,
                &format!("{arch:?} row {row}"),
            );
        }
        assert_caches_close(&kv, &full_kv, &format!("{arch:?} caches"));
    }
}

#[test]
fn shifting_every_position_leaves_logits_unchanged() {
    for arch in ARCHES {
        let model = model(arch);
        let tokens = random_tokens(2 * TINY_SLIDING_WINDOW + 3, 2);
        let at_zero: Vec<u32> = (0..tokens.len() as u32).collect();
        let shifted: Vec<u32> = at_zero.iter().map(|p| p + 1000).collect();
        let (logits, _, _, _) = full_forward(&model, &tokens, &at_zero);
        let (shifted_logits, _, _, _) = full_forward(&model, &tokens, &shifted);
        assert_close(&logits, &shifted_logits, 1e-3, &format!("{arch:?}"));
    }
}

#[test]
fn gaps_in_positions_change_the_result() {
    // The mask and RoPE really use the positions: the same tokens with a gap differ.
    for arch in ARCHES {
        let model = model(arch);
        let tokens = random_tokens(6, 3);
        let dense: Vec<u32> = (0..6).collect();
        let gapped: Vec<u32> = vec![0, 1, 2, 40, 41, 42];
        let (logits, _, _, _) = full_forward(&model, &tokens, &dense);
        let (gapped_logits, _, _, _) = full_forward(&model, &tokens, &gapped);
        assert!(max_abs_diff(&logits, &gapped_logits) > 1e-3, "{arch:?}");
    }
}

#[test]
fn layerwise_subset_recompute_over_the_cache_equals_the_full_pass() {
    for arch in ARCHES {
        let model = model(arch);
        let tokens = random_tokens(2 * TINY_SLIDING_WINDOW + 4, 4);
        let n_tokens = tokens.len();
        let positions: Vec<u32> = (0..n_tokens as u32).collect();
        let (full_logits, full_kv, layer_inputs, full_hidden) =
            full_forward(&model, &tokens, &positions);

        // Start from a cache whose subset slots hold garbage: recompute must replace them
        // before any query of the layer reads them.
        let subset = [0, 3, 9, n_tokens - 2, n_tokens - 1];
        let mut kv = full_kv.clone();
        let garbage = random_block(&model, &subset.map(|row| positions[row]), 5);
        kv.scatter(&subset, &garbage).unwrap();

        let context = ForwardContext::new(positions.clone(), (0..n_tokens).collect())
            .and_then(|context| context.select(&subset))
            .unwrap();
        let rows = Tensor::new(&subset.map(|row| row as u32), &Device::Cpu).unwrap();
        let mut hidden = layer_inputs[0].index_select(&rows, 0).unwrap();
        for layer_idx in 0..model.config().n_layers {
            hidden = model
                .forward_layer(layer_idx, &hidden, &context, &mut kv)
                .unwrap();
        }
        let expected_hidden = full_hidden.index_select(&rows, 0).unwrap();
        assert_close(
            &hidden,
            &expected_hidden,
            TOLERANCE,
            &format!("{arch:?} hidden"),
        );
        let logits = model.logits(&hidden, &[subset.len() - 1]).unwrap();
        assert_close(
            &logits,
            &full_logits.i(n_tokens - 1..n_tokens).unwrap(),
            TOLERANCE,
            &format!("{arch:?} logits"),
        );
        assert_caches_close(&kv, &full_kv, &format!("{arch:?} rewritten cache"));
    }
}

/// Random K/V for `positions` in every layer of `model`'s cache.
fn random_block(model: &Model, positions: &[u32], seed: u64) -> KvBlock {
    let layout = model.kv_layout();
    let shape = (positions.len(), layout.n_kv_heads, layout.head_dim);
    let layers = (0..layout.n_layers)
        .map(|layer_idx| {
            let device = Device::Cpu;
            let seed = seed * 100 + layer_idx as u64;
            let values: Vec<f32> = {
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                (0..shape.0 * shape.1 * shape.2 * 2)
                    .map(|_| rng.random_range(-5.0..5.0))
                    .collect()
            };
            let both = Tensor::from_vec(values, (2, shape.0, shape.1, shape.2), &device).unwrap();
            (both.i(0).unwrap(), both.i(1).unwrap())
        })
        .collect();
    KvBlock::new(layers, positions.to_vec()).unwrap()
}

#[test]
fn blocks_computed_separately_splice_into_the_concatenations_cache() {
    for arch in ARCHES {
        let model = model(arch);
        let first = random_tokens(7, 5);
        let second = random_tokens(9, 6);
        let all: Vec<u32> = first.iter().chain(&second).copied().collect();
        let positions: Vec<u32> = (0..all.len() as u32).collect();
        let (_, concatenated_kv, _, _) = full_forward(&model, &all, &positions);

        let (_, first_kv, _, _) = full_forward(&model, &first, &positions[..first.len()]);
        let first_block = first_kv.to_block().unwrap();
        // The second block is encoded with the first as its past, then cut out.
        let mut with_past =
            KvCache::from_blocks(model.kv_layout(), &Device::Cpu, &[&first_block], 0).unwrap();
        model
            .forward(&second, &positions[first.len()..], &mut with_past)
            .unwrap();
        let second_block = with_past.slice(first.len()..all.len()).unwrap();

        let mut spliced = KvCache::from_blocks(
            model.kv_layout(),
            &Device::Cpu,
            &[&first_block, &second_block],
            4,
        )
        .unwrap();
        assert_caches_close(&spliced, &concatenated_kv, &format!("{arch:?} spliced"));

        // And a new token on the spliced cache sees what it would see after a full prefill.
        let mut reference = concatenated_kv.clone();
        let next = all.len() as u32;
        let spliced_logits = model.forward(&[17], &[next], &mut spliced).unwrap();
        let reference_logits = model.forward(&[17], &[next], &mut reference).unwrap();
        assert_close(
            &spliced_logits,
            &reference_logits,
            TOLERANCE,
            &format!("{arch:?} next"),
        );
    }
}

#[test]
fn repositioned_block_equals_the_block_encoded_at_the_new_positions() {
    for arch in ARCHES {
        let model = model(arch);
        let tokens = random_tokens(10, 7);
        let at_zero: Vec<u32> = (0..10).collect();
        let elsewhere: Vec<u32> = (300..310).collect();
        let (_, kv_at_zero, _, _) = full_forward(&model, &tokens, &at_zero);
        let (_, kv_elsewhere, _, _) = full_forward(&model, &tokens, &elsewhere);
        let moved = model
            .reposition(&kv_at_zero.to_block().unwrap(), &elsewhere)
            .unwrap();
        let moved = KvCache::from_blocks(model.kv_layout(), &Device::Cpu, &[&moved], 0).unwrap();
        assert_caches_close(&moved, &kv_elsewhere, &format!("{arch:?}"));
    }
}

#[test]
fn gemma_local_layers_ignore_tokens_beyond_the_window() {
    let model = model(Arch::Gemma3);
    let local_layers = model
        .config()
        .layers
        .iter()
        .take_while(|layer| layer.sliding_window.is_some())
        .count();
    assert_eq!(
        local_layers, 2,
        "the tiny Gemma opens with two local layers"
    );
    let n_tokens = 3 * TINY_SLIDING_WINDOW;
    let last = n_tokens - 1;
    let positions: Vec<u32> = (0..n_tokens as u32).collect();
    let tokens = random_tokens(n_tokens, 8);
    let (logits, _, inputs, _) = full_forward(&model, &tokens, &positions);

    // Token 0 is more than two windows before the last token: invisible to it through both
    // local layers, visible through the global one.
    let mut far_changed = tokens.clone();
    far_changed[0] = (tokens[0] + 1) % 256;
    let (far_logits, _, far_inputs, _) = full_forward(&model, &far_changed, &positions);
    for layer_idx in 1..=local_layers {
        assert_close(
            &inputs[layer_idx].i(last).unwrap(),
            &far_inputs[layer_idx].i(last).unwrap(),
            0.0,
            &format!("output of local layer {}", layer_idx - 1),
        );
    }
    assert!(max_abs_diff(&logits.i(last).unwrap(), &far_logits.i(last).unwrap()) > 1e-4);

    // A token inside the window does reach it through the first local layer.
    let mut near_changed = tokens.clone();
    near_changed[last - 2] = (tokens[last - 2] + 1) % 256;
    let (_, _, near_inputs, _) = full_forward(&model, &near_changed, &positions);
    assert!(
        max_abs_diff(
            &inputs[1].i(last).unwrap(),
            &near_inputs[1].i(last).unwrap()
        ) > 1e-4
    );
}

/// A prefix spliced for the queries that follow it: Gemma's local layers hold only the window
/// those queries see, and the new tokens and the decoding after them get the logits of the
/// cache holding every row.
#[test]
fn a_splice_for_later_queries_holds_the_window_and_answers_alike() {
    let model = model(Arch::Gemma3);
    let (n_prefix, n_new) = (4 * TINY_SLIDING_WINDOW, TINY_SLIDING_WINDOW);
    let tokens = random_tokens(n_prefix + n_new + 3, 11);
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let mut prefix_kv = model.new_kv_cache().unwrap();
    model
        .forward(&tokens[..n_prefix], &positions[..n_prefix], &mut prefix_kv)
        .unwrap();
    let block = prefix_kv.to_block().unwrap();

    let mut every_row =
        KvCache::from_blocks(model.kv_layout(), &Device::Cpu, &[&block], n_new + 3).unwrap();
    let mut windowed = model
        .splice_for_queries(&[&block], n_new + 3, n_prefix as u32)
        .unwrap();
    for (layer_idx, layer) in model.config().layers.iter().enumerate() {
        let held = windowed.layer(layer_idx).unwrap();
        let expected = match layer.sliding_window {
            Some(window) => n_prefix + 1 - window,
            None => 0,
        };
        assert_eq!(held.first_held(), expected, "layer {layer_idx}");
    }
    assert!(windowed.size_in_bytes() < every_row.size_in_bytes());

    let new = n_prefix..n_prefix + n_new;
    let expected = model
        .forward(
            &tokens[new.clone()],
            &positions[new.clone()],
            &mut every_row,
        )
        .unwrap();
    let got = model
        .forward(&tokens[new.clone()], &positions[new], &mut windowed)
        .unwrap();
    assert_close(&got, &expected, TOLERANCE, "the new tokens' logits");
    for step in n_prefix + n_new..tokens.len() {
        let expected = model
            .forward(
                &tokens[step..=step],
                &positions[step..=step],
                &mut every_row,
            )
            .unwrap();
        let got = model
            .forward(&tokens[step..=step], &positions[step..=step], &mut windowed)
            .unwrap();
        assert_close(&got, &expected, TOLERANCE, &format!("decode step {step}"));
    }
    // A row before the horizon is refused, not computed over missing rows.
    let earlier = n_prefix - 1;
    assert!(
        model
            .forward(&tokens[..1], &[earlier as u32], &mut windowed)
            .is_err()
    );
}

#[test]
fn kv_projected_from_layer_inputs_equals_the_stored_kv() {
    for arch in ARCHES {
        let model = model(arch);
        let tokens = random_tokens(12, 9);
        let positions: Vec<u32> = (5..17).collect();
        let (_, kv, layer_inputs, _) = full_forward(&model, &tokens, &positions);
        let context = ForwardContext::new(positions.clone(), (0..positions.len()).collect())
            .expect("context");
        for (layer_idx, input) in layer_inputs.iter().enumerate() {
            let (keys, values) = model.project_kv(layer_idx, input, &context).unwrap();
            let stored = kv.layer(layer_idx).unwrap();
            assert_close(
                &keys,
                &stored.keys().unwrap(),
                TOLERANCE,
                &format!("{arch:?} K{layer_idx}"),
            );
            assert_close(
                &values,
                &stored.values().unwrap(),
                TOLERANCE,
                &format!("{arch:?} V{layer_idx}"),
            );
        }
    }
}

#[test]
fn quantized_formats_stay_close_to_f32() {
    for arch in ARCHES {
        let tokens = random_tokens(20, 10);
        let positions: Vec<u32> = (0..20).collect();
        let (reference, _, _, _) = full_forward(&model(arch), &tokens, &positions);
        let scale = reference
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        for format in [
            WeightFormat::Quantized,
            WeightFormat::F16,
            WeightFormat::QuantizedAndF16,
        ] {
            let other = random_model(arch, SEED, format, &Device::Cpu).unwrap();
            let (logits, _, _, _) = full_forward(&other, &tokens, &positions);
            assert_eq!(logits.dtype(), DType::F32);
            let diff = max_abs_diff(&logits, &reference);
            assert!(
                diff < 0.05 * scale,
                "{arch:?} {format:?}: max abs diff {diff} with logits up to {scale}"
            );
        }
    }
}

#[test]
fn the_same_seed_builds_the_same_model() {
    for arch in ARCHES {
        let tokens = random_tokens(5, 11);
        let positions: Vec<u32> = (0..5).collect();
        let (a, _, _, _) = full_forward(&model(arch), &tokens, &positions);
        let (b, _, _, _) = full_forward(&model(arch), &tokens, &positions);
        assert_close(&a, &b, 0.0, &format!("{arch:?}"));
        let other = random_model(arch, SEED + 1, WeightFormat::F32, &Device::Cpu).unwrap();
        let (c, _, _, _) = full_forward(&other, &tokens, &positions);
        assert!(max_abs_diff(&a, &c) > 1e-3);
    }
}

#[test]
fn models_and_caches_can_move_between_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Model>();
    assert_send_sync::<KvCache>();
    assert_send_sync::<KvBlock>();
}

#[test]
fn empty_and_malformed_calls_are_errors() {
    let model = model(Arch::Qwen2);
    let mut kv = model.new_kv_cache().unwrap();
    assert!(model.forward(&[], &[], &mut kv).is_err());
    assert!(model.forward(&[1, 2], &[0], &mut kv).is_err());
    assert!(
        model.forward(&[256], &[0], &mut kv).is_err(),
        "token outside the vocabulary"
    );
    let hidden = model.embed(&[1, 2]).unwrap();
    let context = ForwardContext::new(vec![0, 1], vec![0, 5]).unwrap();
    assert!(
        model.forward_layer(0, &hidden, &context, &mut kv).is_err(),
        "slot 5 would leave a gap"
    );
    assert!(model.forward_layer(9, &hidden, &context, &mut kv).is_err());
    assert!(model.logits(&hidden, &[2]).is_err());
    assert_eq!(kv.len(), 0, "failed calls leave the cache as it was");
}

#[test]
fn long_calls_attending_in_query_chunks_match_two_short_calls() {
    // 1100 tokens x 4 heads x 1100 keys exceeds the most attention scores the engine materialises
    // at once (4M), so the one-call pass splits its queries; the two calls below stay under it.
    let model = model(Arch::Qwen2);
    let tokens = random_tokens(1100, 12);
    let positions: Vec<u32> = (0..1100).collect();
    let (logits, _, _, _) = full_forward(&model, &tokens, &positions);

    let mut kv = model.new_kv_cache().unwrap();
    let options = ForwardOptions {
        logits: LogitRows::All,
        keep_layer_inputs: false,
    };
    let mut parts = Vec::new();
    for range in [0..600, 600..1100] {
        let context = ForwardContext::appending(positions[range.clone()].to_vec(), &kv);
        let output = model
            .forward_with(&tokens[range], &context, &mut kv, &options)
            .unwrap();
        parts.push(output.logits.unwrap());
    }
    assert_close(
        &logits,
        &Tensor::cat(&parts, 0).unwrap(),
        TOLERANCE,
        "chunked",
    );
}

/// What an observer of a layer step is shown ([`Model::forward_layer_observed`], the seam
/// blend's attention ranking uses): softmax rows over every slot, one unit per query and head,
/// none on keys after a query's position.
#[test]
fn an_observer_sees_softmax_rows_under_the_position_mask() {
    struct Summed {
        per_slot: Vec<f32>,
        slots: usize,
    }
    impl AttentionObserver for Summed {
        fn observe(&mut self, attention: &AttentionView<'_>) -> Result<(), EngineError> {
            self.slots = attention.n_slots();
            self.per_slot = vec![0.0; attention.n_slots()];
            attention.for_each_weights(|weights| {
                let summed = weights.sum(1)?.sum(0)?.to_vec1::<f32>()?;
                for (total, value) in self.per_slot.iter_mut().zip(summed) {
                    *total += value;
                }
                Ok(())
            })
        }
    }
    for arch in ARCHES {
        let model = model(arch);
        let tokens = random_tokens(12, 3);
        let positions: Vec<u32> = (0..12).collect();
        let (_, kv, layer_inputs, _) = full_forward(&model, &tokens, &positions);
        let n_heads = model.config().n_heads as f32;
        // Rows 2 and 3 run their layer again over the full prefill's cache (rewriting their own
        // K/V with the same values).
        let context = ForwardContext::new(positions[2..4].to_vec(), vec![2, 3]).expect("context");
        for (layer_idx, input) in layer_inputs.iter().enumerate() {
            let queries = input.narrow(0, 2, 2).expect("rows 2 and 3");
            let mut observer = Summed {
                per_slot: Vec::new(),
                slots: 0,
            };
            let observed = model
                .forward_layer_observed(
                    layer_idx,
                    &queries,
                    &context,
                    &mut kv.clone(),
                    &mut observer,
                )
                .expect("observed step");
            let plain = model
                .forward_layer(layer_idx, &queries, &context, &mut kv.clone())
                .expect("plain step");
            assert_close(&observed, &plain, 0.0, "an observer changes nothing");
            assert_eq!(observer.slots, 12);
            let mass = observer.per_slot;
            let total: f32 = mass.iter().sum();
            assert!(
                (total - 2.0 * n_heads).abs() < 1e-3,
                "{arch:?} layer {layer_idx}: total {total}"
            );
            assert!(
                mass[4..].iter().all(|&value| value == 0.0),
                "{arch:?} layer {layer_idx}: later keys read: {mass:?}"
            );
            assert!(mass[..4].iter().all(|&value| value > 0.0));
        }
    }
}
