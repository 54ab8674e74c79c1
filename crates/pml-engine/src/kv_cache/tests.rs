use super::*;

pub(super) const LAYOUT: KvLayout = KvLayout {
    n_layers: 2,
    n_kv_heads: 2,
    head_dim: 3,
    dtype: DType::F32,
};

/// Rows whose every entry is `first_value + row`, `(n_rows, 2, 3)`.
pub(super) fn rows(first_value: f32, n_rows: usize) -> Tensor {
    let values: Vec<f32> = (0..n_rows)
        .flat_map(|row| std::iter::repeat_n(first_value + row as f32, 6))
        .collect();
    Tensor::from_vec(values, (n_rows, 2, 3), &Device::Cpu).unwrap()
}

/// First entry of every row of a `(n, heads, dim)` tensor.
pub(super) fn row_values(tensor: &Tensor) -> Vec<f32> {
    tensor
        .narrow(1, 0, 1)
        .and_then(|t| t.narrow(2, 0, 1))
        .and_then(|t| t.flatten_all())
        .and_then(|t| t.to_vec1::<f32>())
        .unwrap()
}

fn cache_with(n_rows: usize) -> KvCache {
    let mut cache = KvCache::new(LAYOUT, &Device::Cpu).unwrap();
    let slots: Vec<usize> = (0..n_rows).collect();
    let positions: Vec<u32> = (0..n_rows as u32).map(|p| p * 10).collect();
    for layer_idx in 0..LAYOUT.n_layers {
        let keys = rows(0.0, n_rows);
        let values = rows(100.0, n_rows);
        cache
            .write(layer_idx, &slots, &keys, &values, &positions)
            .unwrap();
    }
    cache
}

#[test]
fn appends_and_overwrites_by_slot() {
    let mut cache = cache_with(3);
    cache
        .write(0, &[1, 3, 4], &rows(50.0, 3), &rows(150.0, 3), &[7, 8, 9])
        .unwrap();
    let layer = cache.layer(0).unwrap();
    assert_eq!(
        row_values(&layer.keys().unwrap()),
        vec![0.0, 50.0, 2.0, 51.0, 52.0]
    );
    assert_eq!(
        row_values(&layer.values().unwrap()),
        vec![100.0, 150.0, 102.0, 151.0, 152.0]
    );
    assert_eq!(layer.positions(), &[0, 7, 20, 8, 9]);
    assert_eq!(cache.layer(1).unwrap().len(), 3, "other layers untouched");
    assert!(cache.check_consistent().is_err());
}

#[test]
fn a_cache_with_room_appends_in_place_until_full() {
    let mut cache = KvCache::with_capacity(LAYOUT, &Device::Cpu, 4).unwrap();
    assert_eq!((cache.len(), cache.capacity()), (0, 4));
    for slot in 0..4 {
        for layer_idx in 0..LAYOUT.n_layers {
            cache
                .write(
                    layer_idx,
                    &[slot],
                    &rows(slot as f32, 1),
                    &rows(100.0 + slot as f32, 1),
                    &[slot as u32],
                )
                .unwrap();
        }
        assert_eq!(cache.capacity(), 4, "slot {slot} appended in place");
    }
    assert_eq!(
        row_values(&cache.layer(1).unwrap().keys().unwrap()),
        vec![0.0, 1.0, 2.0, 3.0]
    );
    for layer_idx in 0..LAYOUT.n_layers {
        cache
            .write(layer_idx, &[4], &rows(4.0, 1), &rows(104.0, 1), &[4])
            .unwrap();
    }
    assert!(cache.capacity() > 4, "a full cache grows");
    assert_eq!(cache.positions(), &[0, 1, 2, 3, 4]);
}

#[test]
fn refuses_gaps_duplicates_and_bad_shapes() {
    let mut cache = cache_with(2);
    let gap = cache.write(0, &[3], &rows(0.0, 1), &rows(0.0, 1), &[1]);
    assert!(matches!(
        gap,
        Err(KvCacheError::SlotNotContiguous {
            slot: 3,
            next_free: 2
        })
    ));
    let duplicate = cache.write(0, &[1, 1], &rows(0.0, 2), &rows(0.0, 2), &[1, 2]);
    assert!(matches!(
        duplicate,
        Err(KvCacheError::DuplicateSlot { slot: 1 })
    ));
    let short = cache.write(0, &[2, 3], &rows(0.0, 1), &rows(0.0, 1), &[1, 2]);
    assert!(matches!(short, Err(KvCacheError::Shape(_))));
    assert!(matches!(
        cache.gather(&[5]),
        Err(KvCacheError::SlotOutOfRange { slot: 5, len: 2 })
    ));
    assert_eq!(cache.len(), 2, "failed writes change nothing");
}

#[test]
fn views_never_change_after_they_are_taken() {
    let mut cache = cache_with(3);
    let keys_before = cache.layer(0).unwrap().keys().unwrap();
    cache
        .write(0, &[0, 3], &rows(70.0, 2), &rows(170.0, 2), &[1, 2])
        .unwrap();
    assert_eq!(row_values(&keys_before), vec![0.0, 1.0, 2.0]);

    // Truncation then append: the append must not land in the old view's rows.
    let view = cache.layer(1).unwrap().keys().unwrap();
    cache.truncate(1);
    cache
        .write(1, &[1, 2], &rows(90.0, 2), &rows(190.0, 2), &[5, 6])
        .unwrap();
    assert_eq!(row_values(&view), vec![0.0, 1.0, 2.0]);
    assert_eq!(
        row_values(&cache.layer(1).unwrap().keys().unwrap()),
        vec![0.0, 90.0, 91.0]
    );
}

#[test]
fn clones_append_independently() {
    let original = cache_with(2);
    let mut first = original.clone();
    let mut second = original.clone();
    first
        .write(0, &[2], &rows(10.0, 1), &rows(10.0, 1), &[1])
        .unwrap();
    second
        .write(0, &[2], &rows(20.0, 1), &rows(20.0, 1), &[1])
        .unwrap();
    let keys = |cache: &KvCache| row_values(&cache.layer(0).unwrap().keys().unwrap());
    assert_eq!(keys(&first), vec![0.0, 1.0, 10.0]);
    assert_eq!(keys(&second), vec![0.0, 1.0, 20.0]);
    assert_eq!(keys(&original), vec![0.0, 1.0]);
}

#[test]
fn gather_scatter_and_splice_round_trip() {
    let cache = cache_with(4);
    let block = cache.gather(&[3, 1]).unwrap();
    assert_eq!(block.positions(), &[30, 10]);
    assert_eq!(row_values(&block.layer(0).unwrap().0), vec![3.0, 1.0]);

    let mut target = cache_with(4);
    target.scatter(&[0, 4], &block).unwrap();
    assert_eq!(target.positions(), &[30, 10, 20, 30, 10]);
    assert_eq!(
        row_values(&target.layer(1).unwrap().values().unwrap()),
        vec![103.0, 101.0, 102.0, 103.0, 101.0]
    );

    let head = cache.slice(0..2).unwrap();
    let spliced = KvCache::from_blocks(LAYOUT, &Device::Cpu, &[&head, &block], 8).unwrap();
    assert_eq!(spliced.positions(), &[0, 10, 30, 10]);
    assert_eq!(
        row_values(&spliced.layer(0).unwrap().keys().unwrap()),
        vec![0.0, 1.0, 3.0, 1.0]
    );
    assert_eq!(spliced.size_in_bytes(), 4 * 2 * 2 * 6 * 4);
    let wrong_layers = KvBlock::new(vec![], vec![]).unwrap();
    assert!(KvCache::from_blocks(LAYOUT, &Device::Cpu, &[&wrong_layers], 0).is_err());
}

#[test]
fn blocks_of_stored_dtypes_are_widened_straight_into_the_cache() {
    // Values exact in f16, so widening must give them back bit for bit.
    let f16_rows = |first: f32, n_rows: usize| rows(first, n_rows).to_dtype(DType::F16).unwrap();
    let stored = KvBlock::new(
        vec![(f16_rows(0.5, 3), f16_rows(100.25, 3)); 2],
        vec![0, 1, 2],
    )
    .unwrap();
    let computed = KvBlock::new(vec![(rows(7.0, 2), rows(107.0, 2)); 2], vec![3, 4]).unwrap();
    // A view that is not contiguous (every other row of a larger tensor) takes the slow
    // path and must land in the same place.
    let strided = rows(20.0, 4)
        .reshape((2, 2, 2, 3))
        .and_then(|t| t.narrow(1, 0, 1))
        .and_then(|t| t.squeeze(1))
        .unwrap();
    assert!(!strided.is_contiguous());
    let sparse = KvBlock::new(vec![(strided.clone(), strided); 2], vec![5, 6]).unwrap();
    let spliced =
        KvCache::from_blocks(LAYOUT, &Device::Cpu, &[&stored, &computed, &sparse], 3).unwrap();
    let layer = spliced.layer(1).unwrap();
    assert_eq!(layer.keys().unwrap().dtype(), DType::F32);
    assert_eq!(
        row_values(&layer.keys().unwrap()),
        vec![0.5, 1.5, 2.5, 7.0, 8.0, 20.0, 22.0]
    );
    assert_eq!(
        row_values(&layer.values().unwrap()),
        vec![100.25, 101.25, 102.25, 107.0, 108.0, 20.0, 22.0]
    );
    assert_eq!(layer.capacity(), 7 + 3);
    // Every value of every row, not only the first: the whole row was converted.
    let all = layer
        .keys()
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1::<f32>()
        .unwrap();
    assert_eq!(&all[..6], &[0.5; 6]);
    // The spare rows are zeros.
    assert_eq!(abs_sum(&layer.key_buffer.narrow(0, 7, 3).unwrap()), 0.0);
}

/// The sum of `tensor`'s absolute values (f32).
pub(super) fn abs_sum(tensor: &Tensor) -> f32 {
    tensor
        .abs()
        .and_then(|abs| abs.sum_all())
        .and_then(|sum| sum.to_scalar::<f32>())
        .unwrap()
}

/// The little-endian bytes of `tensors` one after another, each tensor's byte range, and the
/// whole as shared bytes starting `lead` bytes in (an odd `lead` misaligns every f16 value).
fn bytes_of(tensors: &[Tensor], lead: usize) -> (SharedBytes, Vec<Range<usize>>) {
    let mut bytes = vec![0xAB; lead];
    let mut ranges = Vec::new();
    for tensor in tensors {
        let start = bytes.len();
        let flat = tensor.flatten_all().unwrap();
        match tensor.dtype() {
            DType::F16 => flat
                .to_vec1::<half::f16>()
                .unwrap()
                .iter()
                .for_each(|value| bytes.extend(value.to_le_bytes())),
            DType::F32 => flat
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .for_each(|value| bytes.extend(value.to_le_bytes())),
            other => panic!("no bytes for {other:?}"),
        }
        ranges.push(start..bytes.len());
    }
    (std::sync::Arc::new(bytes), ranges)
}

#[test]
fn blocks_on_shared_bytes_splice_as_their_tensors_do() {
    for dtype in [DType::F16, DType::F32] {
        // Misaligned bytes (lead 1) take candle's byte conversion, aligned ones the direct one.
        for lead in [0, 1, 2] {
            let keys = rows(0.5, 3).to_dtype(dtype).unwrap();
            let values = rows(100.25, 3).to_dtype(dtype).unwrap();
            let other_keys = rows(9.0, 3).to_dtype(dtype).unwrap();
            let tensors = [
                keys.clone(),
                values.clone(),
                other_keys.clone(),
                values.clone(),
            ];
            let (bytes, ranges) = bytes_of(&tensors, lead);
            let layer_ranges = vec![
                (ranges[0].clone(), ranges[1].clone()),
                (ranges[2].clone(), ranges[3].clone()),
            ];
            let mapped =
                KvBlock::from_bytes(bytes, dtype, (2, 3), layer_ranges, vec![4, 5, 6]).unwrap();
            let held = KvBlock::new(
                vec![(keys.clone(), values.clone()), (other_keys, values)],
                vec![4, 5, 6],
            )
            .unwrap();
            assert_eq!(mapped.dtype(), Some(dtype));
            assert_eq!(mapped.row_shape(), Some((2, 3)));
            assert_eq!(mapped.size_in_bytes(), held.size_in_bytes());
            let computed = KvBlock::new(vec![(rows(7.0, 1), rows(107.0, 1)); 2], vec![9]).unwrap();
            let from_mapped =
                KvCache::from_blocks(LAYOUT, &Device::Cpu, &[&computed, &mapped], 2).unwrap();
            let from_held =
                KvCache::from_blocks(LAYOUT, &Device::Cpu, &[&computed, &held], 2).unwrap();
            assert_eq!(from_mapped.positions(), &[9, 4, 5, 6]);
            for layer_idx in 0..2 {
                let (a, b) = (
                    from_mapped.layer(layer_idx).unwrap(),
                    from_held.layer(layer_idx).unwrap(),
                );
                for (x, y) in [
                    (a.keys().unwrap(), b.keys().unwrap()),
                    (a.values().unwrap(), b.values().unwrap()),
                ] {
                    let flat = |t: Tensor| t.flatten_all().unwrap().to_vec1::<f32>().unwrap();
                    assert_eq!(
                        flat(x),
                        flat(y),
                        "{dtype:?}, lead {lead}, layer {layer_idx}"
                    );
                }
            }
            // The tensors a caller may ask for are the same values too.
            let (mapped_keys, _) = mapped.layer(0).unwrap();
            assert_eq!(
                mapped_keys
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_vec3::<f32>()
                    .unwrap(),
                keys.to_dtype(DType::F32).unwrap().to_vec3::<f32>().unwrap()
            );
        }
    }
}

#[test]
fn blocks_on_shared_bytes_refuse_ranges_that_do_not_fit() {
    let (bytes, ranges) = bytes_of(&[rows(0.0, 2), rows(1.0, 2)], 0);
    let block = |ranges: Vec<(Range<usize>, Range<usize>)>, n_rows: usize, dtype: DType| {
        KvBlock::from_bytes(
            bytes.clone(),
            dtype,
            (2, 3),
            ranges,
            (0..n_rows as u32).collect(),
        )
    };
    let good = (ranges[0].clone(), ranges[1].clone());
    assert!(block(vec![good.clone()], 2, DType::F32).is_ok());
    // One row too many for the bytes of two.
    assert!(block(vec![good.clone()], 3, DType::F32).is_err());
    // Past the end of the bytes.
    let end = ranges[1].end;
    assert!(block(vec![(ranges[0].clone(), end - 24..end + 24)], 2, DType::F32).is_err());
    // Not a K/V dtype.
    assert!(block(vec![good], 2, DType::U32).is_err());
}

/// A splice for queries at position 8 or later over slots at positions 0..=7: layer 1's window
/// of 3 sees positions 6 and 7 only, so it holds slots 6.. and refuses every use of the others.
#[test]
fn sliding_window_layers_hold_only_the_slots_later_queries_see() {
    let windows = [None, Some(3)];
    let horizon = QueryHorizon {
        first_query: 8,
        windows: &windows,
    };
    let flat = |t: Tensor| {
        t.to_dtype(DType::F32)
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap()
    };
    // f16 and f32 bytes, aligned (the direct conversion) or not (candle's), into f32 and f16
    // caches; a bf16 cache takes the general path devices take.
    for (stored, cache_dtype) in [
        (DType::F16, DType::F32),
        (DType::F32, DType::F32),
        (DType::F32, DType::F16),
        (DType::F16, DType::BF16),
    ] {
        for lead in [0, 1] {
            let layout = KvLayout {
                dtype: cache_dtype,
                ..LAYOUT
            };
            let tensors: Vec<Tensor> = [0.5, 100.5, 20.5, 120.5]
                .iter()
                .map(|&first| rows(first, 6).to_dtype(stored).unwrap())
                .collect();
            let (bytes, ranges) = bytes_of(&tensors, lead);
            let layer_ranges = vec![
                (ranges[0].clone(), ranges[1].clone()),
                (ranges[2].clone(), ranges[3].clone()),
            ];
            let mapped =
                KvBlock::from_bytes(bytes, stored, (2, 3), layer_ranges, (2..8).collect()).unwrap();
            let computed =
                KvBlock::new(vec![(rows(7.0, 2), rows(107.0, 2)); 2], vec![0, 1]).unwrap();
            let blocks = [&computed, &mapped];
            let full = KvCache::from_blocks(layout, &Device::Cpu, &blocks, 2).unwrap();
            let held =
                KvCache::from_blocks_for(layout, &Device::Cpu, &blocks, 2, Some(horizon)).unwrap();
            let case = format!("{stored:?} into {cache_dtype:?}, lead {lead}");

            assert_eq!(held.positions(), full.positions(), "{case}");
            held.check_consistent().unwrap();
            let (whole, windowed) = (held.layer(0).unwrap(), held.layer(1).unwrap());
            assert_eq!(
                (whole.first_held(), windowed.first_held()),
                (0, 6),
                "{case}"
            );
            assert_eq!(windowed.held_positions(), &[6, 7], "{case}");
            let full_windowed = full.layer(1).unwrap();
            assert_eq!(
                flat(windowed.keys().unwrap()),
                flat(full_windowed.keys().unwrap().narrow(0, 6, 2).unwrap()),
                "{case}"
            );
            assert_eq!(
                flat(windowed.values().unwrap()),
                flat(full_windowed.values().unwrap().narrow(0, 6, 2).unwrap()),
                "{case}"
            );
            assert_eq!(
                flat(whole.keys().unwrap()),
                flat(full.layer(0).unwrap().keys().unwrap()),
                "{case}"
            );
            assert_eq!(
                held.capacity(),
                10,
                "{case}: room for the reserve in every layer"
            );
            let row_bytes = 2 * 6 * cache_dtype.size_in_bytes();
            assert_eq!(held.size_in_bytes(), (8 + 2) * row_bytes, "{case}");
        }
    }

    let mut held =
        KvCache::from_blocks_for(LAYOUT, &Device::Cpu, &[&rows_block(8)], 2, Some(horizon))
            .unwrap();
    // A row before the horizon would attend rows that were left out.
    assert!(matches!(
        held.write(1, &[8], &rows(50.0, 1), &rows(150.0, 1), &[7]),
        Err(KvCacheError::BeforeHorizon { position: 7, .. })
    ));
    assert!(matches!(
        held.write(1, &[5], &rows(50.0, 1), &rows(150.0, 1), &[9]),
        Err(KvCacheError::NotHeld { slot: 5, .. })
    ));
    for layer_idx in 0..2 {
        held.write(layer_idx, &[8], &rows(50.0, 1), &rows(150.0, 1), &[8])
            .unwrap();
    }
    assert_eq!(held.layer(1).unwrap().held_positions(), &[6, 7, 8]);
    assert!(matches!(
        held.gather(&[5, 8]),
        Err(KvCacheError::NotHeld { slot: 5, .. })
    ));
    assert!(held.slice(0..9).is_err());
    let tail = held.gather(&[6, 8]).unwrap();
    assert_eq!(tail.positions(), &[6, 8]);
    assert_eq!(row_values(&tail.layer(1).unwrap().0), vec![6.0, 50.0]);
    // Gathered where the window left slot 5 out, its row there is zeros, in the other layer
    // what it holds.
    let visible = held.gather_visible(&[5, 6, 8]).unwrap();
    assert_eq!(visible.positions(), &[5, 6, 8]);
    assert_eq!(
        row_values(&visible.layer(1).unwrap().0),
        vec![0.0, 6.0, 50.0]
    );
    assert_eq!(
        row_values(&visible.layer(1).unwrap().1),
        vec![0.0, 106.0, 150.0]
    );
    assert_eq!(
        row_values(&visible.layer(0).unwrap().0),
        vec![5.0, 6.0, 50.0]
    );
    assert_eq!(held.slice(7..9).unwrap().positions(), &[7, 8]);

    // Cut below the first held slot, the layer holds nothing and appends from its first row.
    held.truncate(4);
    for layer_idx in 0..2 {
        held.write(layer_idx, &[4], &rows(60.0, 1), &rows(160.0, 1), &[9])
            .unwrap();
    }
    let windowed = held.layer(1).unwrap();
    assert_eq!(
        (windowed.first_held(), windowed.held_positions()),
        (4, &[9][..])
    );
    assert_eq!(row_values(&windowed.keys().unwrap()), vec![60.0]);
    assert_eq!(held.positions(), &[0, 1, 2, 3, 9]);
}

/// Spliced for later queries, a block whose rows sit before and after another's (a scaffold
/// around a document) is laid out in position order, so the window's rows are the last slots.
#[test]
fn a_splice_for_later_queries_orders_rows_by_position() {
    let windows = [None, Some(3)];
    let horizon = QueryHorizon {
        first_query: 8,
        windows: &windows,
    };
    let around = KvBlock::new(vec![(rows(0.0, 2), rows(100.0, 2)); 2], vec![0, 7]).unwrap();
    let inside = KvBlock::new(vec![(rows(11.0, 6), rows(111.0, 6)); 2], (1..7).collect()).unwrap();
    let held =
        KvCache::from_blocks_for(LAYOUT, &Device::Cpu, &[&around, &inside], 1, Some(horizon))
            .unwrap();
    assert_eq!(held.positions(), &[0, 1, 2, 3, 4, 5, 6, 7]);
    let whole = held.layer(0).unwrap();
    assert_eq!(
        row_values(&whole.keys().unwrap()),
        vec![0.0, 11.0, 12.0, 13.0, 14.0, 15.0, 16.0, 1.0]
    );
    let windowed = held.layer(1).unwrap();
    assert_eq!(windowed.first_held(), 6);
    assert_eq!(row_values(&windowed.keys().unwrap()), vec![16.0, 1.0]);
    assert_eq!(row_values(&windowed.values().unwrap()), vec![116.0, 101.0]);
    // Without a horizon the blocks stay block by block.
    let in_order = KvCache::from_blocks(LAYOUT, &Device::Cpu, &[&around, &inside], 1).unwrap();
    assert_eq!(in_order.positions(), &[0, 7, 1, 2, 3, 4, 5, 6]);
}

/// `n` slots at positions `0..n` whose key rows hold their slot index.
fn rows_block(n: usize) -> KvBlock {
    KvBlock::new(
        vec![(rows(0.0, n), rows(100.0, n)); LAYOUT.n_layers],
        (0..n as u32).collect(),
    )
    .unwrap()
}

/// Appends one slot to every layer.
fn append_slot(cache: &mut KvCache) {
    let slot = cache.len();
    for layer_idx in 0..LAYOUT.n_layers {
        cache
            .write(
                layer_idx,
                &[slot],
                &rows(slot as f32, 1),
                &rows(slot as f32, 1),
                &[slot as u32],
            )
            .unwrap();
    }
}

#[test]
fn a_row_limit_caps_growth_and_forks_keep_their_capacity() {
    let slot_bytes = LAYOUT.slot_bytes();
    assert_eq!(slot_bytes, 2 * 2 * 2 * 3 * 4);
    let mut cache = KvCache::with_capacity(LAYOUT, &Device::Cpu, 10).unwrap();
    cache.limit_rows(12);
    for _ in 0..10 {
        append_slot(&mut cache);
    }
    assert_eq!(cache.allocated_bytes(), 10 * slot_bytes);
    append_slot(&mut cache);
    assert_eq!(
        cache.capacity(),
        12,
        "grown to the limit, not geometrically to 64"
    );
    assert_eq!(cache.allocated_bytes(), 12 * slot_bytes);
    // A fork copies on its first append into a buffer of the same capacity.
    let mut fork = cache.clone();
    append_slot(&mut fork);
    assert_eq!((fork.capacity(), fork.len(), cache.len()), (12, 12, 11));
    // Past the limit an append still gets the room it needs.
    append_slot(&mut fork);
    assert_eq!(fork.len(), 13);
    assert!(fork.capacity() >= 13);
}
