//! Caches that read rows shared with other caches ([`KvCache::from_shared_blocks`],
//! [`KvCache::share_rows`]) against caches that copied the same rows.

use std::collections::HashSet;
use std::sync::Arc;

use super::tests::{LAYOUT, row_values, rows};
use super::*;

/// A span of `n` rows (keys `first + row`, values `first + 1000 + row`, layer 1 shifted by
/// 0.5) at positions `first_position..`.
fn span(first: f32, n: usize, first_position: u32) -> Arc<KvBlock> {
    let layers = (0..LAYOUT.n_layers)
        .map(|layer| {
            let shift = layer as f32 * 0.5;
            (rows(first + shift, n), rows(first + 1000.0 + shift, n))
        })
        .collect();
    let positions = (first_position..first_position + n as u32).collect();
    Arc::new(KvBlock::new(layers, positions).unwrap())
}

/// `span` cut into views of `size` rows, as a prefix cache keeps it.
fn cut(span: &Arc<KvBlock>, size: usize) -> Vec<KvBlock> {
    (0..span.len())
        .step_by(size)
        .map(|start| KvBlock::view(span, start..span.len().min(start + size)).unwrap())
        .collect()
}

fn both(blocks: &[KvBlock], reserve: usize) -> (KvCache, KvCache) {
    let blocks: Vec<&KvBlock> = blocks.iter().collect();
    let shared = KvCache::from_shared_blocks(LAYOUT, &Device::Cpu, &blocks, reserve).unwrap();
    let copied = KvCache::from_blocks(LAYOUT, &Device::Cpu, &blocks, reserve).unwrap();
    (shared, copied)
}

fn assert_same(a: &KvCache, b: &KvCache) {
    assert_eq!(a.positions(), b.positions());
    for layer in 0..LAYOUT.n_layers {
        let (a, b) = (a.layer(layer).unwrap(), b.layer(layer).unwrap());
        assert_eq!(
            row_values(&a.keys().unwrap()),
            row_values(&b.keys().unwrap())
        );
        assert_eq!(
            row_values(&a.values().unwrap()),
            row_values(&b.values().unwrap())
        );
        let from_segments = KvSegment::joined(&a.segments().unwrap()).unwrap().unwrap();
        assert_eq!(row_values(&from_segments.0), row_values(&b.keys().unwrap()));
    }
}

#[test]
fn views_of_one_span_are_read_in_place_as_one_segment() {
    let span = span(0.0, 160, 0);
    let blocks = cut(&span, 16);
    let (shared, copied) = both(&blocks[..9], 4);
    assert_eq!(shared.shared_rows(), 144);
    assert_eq!(shared.layer(0).unwrap().segments().unwrap().len(), 1);
    assert_same(&shared, &copied);
    assert_eq!(
        shared.allocated_bytes(),
        4 * LAYOUT.slot_bytes(),
        "of its own, only the rows reserved"
    );

    // Two caches on the span hold it once; copies hold one each.
    let mut seen = HashSet::new();
    let first = shared.resident_bytes(&mut seen);
    let second = both(&blocks[..5], 4).0.resident_bytes(&mut seen);
    assert_eq!(first, span.size_in_bytes() + 4 * LAYOUT.slot_bytes());
    assert_eq!(
        second,
        4 * LAYOUT.slot_bytes(),
        "the same span, already counted"
    );
    let mut seen = HashSet::new();
    assert!(copied.resident_bytes(&mut seen) >= 144 * LAYOUT.slot_bytes());
}

#[test]
fn runs_past_the_most_and_blocks_of_no_span_are_copied() {
    // Ten spans of 16 rows each: eight are read in place, the last two copied.
    let spans: Vec<Arc<KvBlock>> = (0..10)
        .map(|index| span(100.0 * index as f32, 16, 16 * index as u32))
        .collect();
    let blocks: Vec<KvBlock> = spans.iter().flat_map(|span| cut(span, 16)).collect();
    let (shared, copied) = both(&blocks, 2);
    assert_eq!(shared.shared_rows(), 8 * 16);
    assert_eq!(shared.layer(1).unwrap().segments().unwrap().len(), 9);
    assert_same(&shared, &copied);

    let long = span(0.0, 96, 0);

    // A block that is no view ends the shared part; what follows is copied.
    let plain = KvBlock::new(
        (0..2).map(|_| (rows(7.0, 16), rows(8.0, 16))).collect(),
        (96..112).collect(),
    )
    .unwrap();
    let mut blocks = cut(&long, 16);
    blocks.push(plain);
    let (shared, copied) = both(&blocks, 2);
    assert_eq!(shared.shared_rows(), 96);
    assert_same(&shared, &copied);

    // Another dtype cannot be read in place.
    let f16_span = Arc::new(
        KvBlock::new(
            (0..2)
                .map(|_| {
                    let r = rows(1.0, 80).to_dtype(DType::F16).unwrap();
                    (r.clone(), r)
                })
                .collect(),
            (0..80).collect(),
        )
        .unwrap(),
    );
    let (shared, copied) = both(&cut(&f16_span, 16), 2);
    assert_eq!(shared.shared_rows(), 0);
    assert_same(&shared, &copied);
}

/// Appends, overwrites (of shared slots too) and truncations keep a shared cache equal to a
/// copied one, and never change the span or another cache reading it.
#[test]
fn writes_go_to_rows_of_its_own_and_leave_the_span_alone() {
    let span = span(0.0, 128, 0);
    let blocks = cut(&span, 16);
    let (mut shared, mut copied) = both(&blocks[..6], 8);
    let (neighbour, _) = both(&blocks[..6], 8);
    let append = |cache: &mut KvCache, first: f32, at: usize| {
        for layer in 0..LAYOUT.n_layers {
            cache
                .write(
                    layer,
                    &[at, at + 1],
                    &rows(first, 2),
                    &rows(first + 1000.0, 2),
                    &[at as u32, at as u32 + 1],
                )
                .unwrap();
        }
    };
    append(&mut shared, 9000.0, 96);
    append(&mut copied, 9000.0, 96);
    assert_eq!(shared.shared_rows(), 96);
    assert_eq!(shared.layer(0).unwrap().segments().unwrap().len(), 2);
    assert_same(&shared, &copied);

    // Truncating into the shared rows narrows them; appending after that is its own.
    shared.truncate(70);
    copied.truncate(70);
    assert_eq!(shared.shared_rows(), 70);
    append(&mut shared, 7000.0, 70);
    append(&mut copied, 7000.0, 70);
    assert_same(&shared, &copied);

    // Overwriting a shared slot (blend's recompute) copies every row first.
    for cache in [&mut shared, &mut copied] {
        for layer in 0..LAYOUT.n_layers {
            cache
                .write(layer, &[5], &rows(-1.0, 1), &rows(-2.0, 1), &[5])
                .unwrap();
        }
    }
    assert_eq!(shared.shared_rows(), 0);
    assert_same(&shared, &copied);
    assert_eq!(
        row_values(&span.layer(0).unwrap().0.narrow(0, 5, 1).unwrap()),
        [5.0]
    );
    assert_eq!(neighbour.shared_rows(), 96);
    assert_eq!(
        row_values(&neighbour.layer(0).unwrap().keys().unwrap())[..7],
        [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    );

    // Blocks cut out of a shared cache are its rows.
    let (shared, copied) = both(&blocks[..6], 8);
    let slice = shared.slice(10..90).unwrap();
    let expected = copied.slice(10..90).unwrap();
    assert_eq!(
        row_values(&slice.layer(1).unwrap().1),
        row_values(&expected.layer(1).unwrap().1)
    );
    let gathered = shared.gather(&[95, 3, 40]).unwrap();
    assert_eq!(row_values(&gathered.layer(0).unwrap().0), [95.0, 3.0, 40.0]);
}

/// Forked choices of one prompt read its rows once and append each to rows of its own.
#[test]
fn forks_share_the_prompt_and_append_apart() {
    let mut prompt = KvCache::with_capacity(LAYOUT, &Device::Cpu, 64).unwrap();
    let slots: Vec<usize> = (0..20).collect();
    let positions: Vec<u32> = (0..20).collect();
    for layer in 0..LAYOUT.n_layers {
        prompt
            .write(layer, &slots, &rows(0.0, 20), &rows(1000.0, 20), &positions)
            .unwrap();
    }
    let copied = prompt.clone();
    // A server reserves each choice's prompt and answer (one token here).
    prompt.limit_rows(21);
    prompt.share_rows().unwrap();
    assert_eq!(prompt.shared_rows(), 20);
    assert_same(&prompt, &copied);

    let mut forks = [prompt.clone(), prompt.clone(), prompt];
    for (index, fork) in forks.iter_mut().enumerate() {
        for layer in 0..LAYOUT.n_layers {
            let first = 100.0 * (index + 1) as f32;
            fork.write(layer, &[20], &rows(first, 1), &rows(first, 1), &[20])
                .unwrap();
        }
    }
    for (index, fork) in forks.iter().enumerate() {
        let keys = row_values(&fork.layer(0).unwrap().keys().unwrap());
        assert_eq!(keys.len(), 21);
        assert_eq!(keys[19], 19.0);
        assert_eq!(keys[20], 100.0 * (index + 1) as f32);
    }
    // The prompt's rows are held once: three forks hold them plus one row of their own each.
    let mut seen = HashSet::new();
    let together: usize = forks
        .iter()
        .map(|fork| fork.resident_bytes(&mut seen))
        .sum();
    let prompt_bytes = 20 * LAYOUT.slot_bytes();
    let own: usize = forks.iter().map(KvCache::allocated_bytes).sum();
    assert_eq!(together, prompt_bytes + own);
    assert!(together < 2 * prompt_bytes, "{together} bytes");
}
