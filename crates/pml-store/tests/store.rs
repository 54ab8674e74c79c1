//! The module store end to end in one process: states through bytes and through the disk tier
//! (tiny-model KV and hand-made tensors of every stored dtype), refusal of states for another
//! model, layout or stored dtype, corruption (XXH3 checksum, truncation, old formats) detected
//! and removed, memory-mapped loads that own their tensors, failed writes leaving nothing
//! behind, and the RAM-over-disk stack (read-through, promotion, write-through, f16 conversion,
//! manifests).

mod store_support;

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};
use pml_compiler::plan::EncodeMode;
use pml_engine::kv_cache::{KvBlock, KvLayout};
use pml_engine::model::tiny::random_model;
use pml_engine::model::{Arch, WeightFormat};
use pml_store::{
    ContextHash, DiskTier, KeepFraction, Manifest, ManifestLookup, ManifestUnit, MemoryTier,
    ModuleState, ModuleStore, PutOutcome, StateKind, StateSpec, StoreConfig, StoreError,
    StoreKeyParts, Tier,
};
use store_support::{
    FINGERPRINT, LAYOUT, STATE_DTYPE, assert_same_state, decode, files_under, key_of, spec, state,
    state_with, unit_tokens,
};

/// The KV of a tiny model's forward pass over 11 tokens, as a module state in `state_dtype`, with
/// its spec and key.
fn tiny_model_state(
    arch: Arch,
    state_dtype: DType,
) -> (StateSpec, pml_store::StoreKey, ModuleState) {
    let model = random_model(arch, 3, WeightFormat::F32, &Device::Cpu).expect("tiny model");
    let tokens: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % 256).collect();
    let positions: Vec<u32> = (4..15).collect();
    let mut kv = model.new_kv_cache().expect("cache");
    model
        .forward(&tokens, &positions, &mut kv)
        .expect("forward");
    let block = kv.to_block().expect("block");
    let spec =
        StateSpec::new(format!("tiny-{arch:?}"), model.kv_layout()).with_state_dtype(state_dtype);
    let key = StoreKeyParts {
        model_fingerprint: &spec.model_fingerprint,
        weight_format: model.weight_format(),
        kv_dtype: model.kv_layout().dtype,
        state_dtype,
        kind: Default::default(),
        encode_mode: EncodeMode::Isolated,
        tokens: &tokens,
        positions: &positions,
        context: ContextHash::NONE,
    }
    .key();
    let state = ModuleState::new(block, tokens)
        .and_then(|state| state.to_dtype(state_dtype))
        .expect("state");
    (spec, key, state)
}

#[test]
fn tiny_model_kv_round_trips_through_bytes_and_disk() {
    for arch in Arch::ALL {
        for state_dtype in [DType::F32, DType::F16] {
            let (spec, key, state) = tiny_model_state(arch, state_dtype);
            let bytes = state.to_safetensors(&key, &spec).expect("encode");
            let decoded = decode(&bytes, &key, &spec).expect("decode");
            assert_same_state(&decoded, &state);

            let root = tempfile::tempdir().expect("tempdir");
            let disk = DiskTier::open(root.path(), spec.clone()).expect("disk tier");
            assert!(disk.get(&key).expect("get").is_none());
            disk.put(&key, &Arc::new(state.clone())).expect("put");
            assert!(disk.contains(&key).expect("contains"));
            let loaded = disk.get(&key).expect("get").expect("hit");
            assert_same_state(&loaded, &state);
            let file_len = std::fs::metadata(disk.path_of(&key)).expect("file").len();
            assert_eq!(file_len, bytes.len() as u64);
            let stats = disk.stats();
            assert_eq!((stats.hits, stats.misses, stats.puts), (1, 1, 1));
            assert_eq!(stats.bytes_read, file_len);
        }
    }
}

#[test]
fn every_stored_dtype_and_empty_states_round_trip() {
    for dtype in [DType::F32, DType::F16, DType::BF16] {
        let layout = KvLayout { dtype, ..LAYOUT };
        let spec = StateSpec::new(FINGERPRINT, LAYOUT).with_state_dtype(dtype);
        for n_tokens in [0, 1, 5] {
            let state = state_with(layout, 9, n_tokens);
            let key = key_of(9, n_tokens);
            let bytes = state.to_safetensors(&key, &spec).expect("encode");
            let decoded = decode(&bytes, &key, &spec).expect("decode");
            assert_same_state(&decoded, &state);
        }
    }
}

/// A compressed state (`pmlc compile --keep`): a subset of a unit's rows at their positions, gaps
/// and all, keeps its kind and fraction through bytes and the disk tier, under its own key.
#[test]
fn compressed_states_round_trip_with_their_fraction() {
    let spec = spec();
    let whole = state(4, 10);
    let rows = [0usize, 1, 4, 8, 9];
    let index = Tensor::new(&[0u32, 1, 4, 8, 9], &Device::Cpu).expect("index");
    let layers = whole
        .kv()
        .layers()
        .expect("tensors")
        .iter()
        .map(|(keys, values)| {
            (
                keys.index_select(&index, 0).expect("keys"),
                values.index_select(&index, 0).expect("values"),
            )
        })
        .collect();
    let positions = rows.iter().map(|&row| whole.positions()[row]).collect();
    let tokens = rows.iter().map(|&row| whole.tokens()[row]).collect();
    let keep = KeepFraction::new(0.5).expect("a fraction");
    let kept = ModuleState::kv_kept(
        keep,
        KvBlock::new(layers, positions).expect("block"),
        tokens,
    )
    .expect("state");
    assert_eq!(kept.kind(), StateKind::KvKept(keep));
    let (unit, unit_positions) = unit_tokens(4, 10);
    let key = StoreKeyParts {
        model_fingerprint: FINGERPRINT,
        weight_format: Default::default(),
        kv_dtype: LAYOUT.dtype,
        state_dtype: STATE_DTYPE,
        kind: kept.kind(),
        encode_mode: Default::default(),
        tokens: &unit,
        positions: &unit_positions,
        context: ContextHash::NONE,
    }
    .key();
    assert_ne!(
        key,
        key_of(4, 10),
        "a compressed state has a key of its own"
    );
    let bytes = kept.to_safetensors(&key, &spec).expect("encode");
    assert_same_state(&decode(&bytes, &key, &spec).expect("decode"), &kept);
    let root = tempfile::tempdir().expect("tempdir");
    let disk = DiskTier::open(root.path(), spec.clone()).expect("disk tier");
    disk.put(&key, &Arc::new(kept.clone())).expect("put");
    assert_same_state(&disk.get(&key).expect("get").expect("hit"), &kept);
    assert!(
        bytes.len()
            < whole
                .to_safetensors(&key_of(4, 10), &spec)
                .expect("encode")
                .len()
    );
}

#[test]
fn states_for_another_model_or_layout_are_refused() {
    let state = state(1, 4);
    let key = key_of(1, 4);
    let bytes = state.to_safetensors(&key, &spec()).expect("encode");

    let other_model = StateSpec {
        model_fingerprint: "another".to_string(),
        ..spec()
    };
    let other_state_dtype = spec().with_state_dtype(DType::F32);
    let other_heads = StateSpec {
        layout: KvLayout {
            n_kv_heads: 1,
            head_dim: 16,
            ..LAYOUT
        },
        ..spec()
    };
    let other_layers = StateSpec {
        layout: KvLayout {
            n_layers: 4,
            ..LAYOUT
        },
        ..spec()
    };
    let other_dtype = StateSpec {
        layout: KvLayout {
            dtype: DType::F16,
            ..LAYOUT
        },
        ..spec()
    };
    // The writer refuses what it can see in the state: its shape and stored dtype (the engine's
    // dtype and the model are the spec's word, recorded in the file and the key).
    for (other, what, writer_refuses) in [
        (&other_model, "model", false),
        (&other_heads, "KV layout", true),
        (&other_layers, "KV layout", true),
        (&other_dtype, "KV dtype", false),
        (&other_state_dtype, "state dtype", true),
    ] {
        let error = decode(&bytes, &key, other).expect_err("must refuse");
        assert!(
            matches!(&error, StoreError::Mismatch { what: found, .. } if found.starts_with(what)),
            "{what}: {error}"
        );
        if writer_refuses {
            assert!(matches!(
                state.to_safetensors(&key, other),
                Err(StoreError::Mismatch { .. })
            ));
        }
    }
    let error = decode(&bytes, &key_of(2, 4), &spec()).expect_err("key");
    assert!(matches!(error, StoreError::Malformed(_)), "{error}");

    // On disk a state for another model is reported but kept: it is valid for that model.
    let root = tempfile::tempdir().expect("tempdir");
    DiskTier::open(root.path(), spec())
        .and_then(|disk| disk.put(&key, &Arc::new(state)))
        .expect("put");
    let foreign = DiskTier::open(root.path(), other_model).expect("disk tier");
    assert!(matches!(
        foreign.get(&key),
        Err(StoreError::Mismatch { .. })
    ));
    assert!(foreign.contains(&key).expect("contains"), "file kept");
}

#[test]
fn corrupt_and_truncated_files_are_reported_removed_and_replaceable() {
    let root = tempfile::tempdir().expect("tempdir");
    let disk = DiskTier::open(root.path(), spec()).expect("disk tier");
    let state = Arc::new(state(3, 6));
    let key = key_of(3, 6);
    disk.put(&key, &state).expect("put");
    let path = disk.path_of(&key);
    let good = std::fs::read(&path).expect("read");

    let header_len = u64::from_le_bytes(good[..8].try_into().expect("8 bytes")) as usize;
    let flip_at = [
        0,
        3,
        8,
        8 + header_len / 2,
        8 + header_len + 5,
        good.len() - 1,
    ];
    let damaged: Vec<(String, Vec<u8>)> = flip_at
        .iter()
        .map(|&index| {
            let mut bytes = good.clone();
            bytes[index] ^= 0x40;
            (format!("byte {index} flipped"), bytes)
        })
        .chain(
            [0, 7, 8 + header_len, good.len() - 1]
                .iter()
                .map(|&len| (format!("truncated to {len} bytes"), good[..len].to_vec())),
        )
        .chain([(format!("{} zero bytes appended", 16), {
            let mut bytes = good.clone();
            bytes.extend([0; 16]);
            bytes
        })])
        .collect();
    for (expected_corrupt, (what, bytes)) in damaged.into_iter().enumerate() {
        std::fs::write(&path, &bytes).expect("write damaged file");
        match disk.get(&key) {
            Err(StoreError::Corrupt { key: reported, .. }) => assert_eq!(reported, key.as_str()),
            other => panic!("{what}: expected Corrupt, got {other:?}"),
        }
        assert!(!path.exists(), "{what}: corrupt file must be removed");
        assert!(disk.get(&key).expect("miss after removal").is_none());
        assert_eq!(disk.stats().corrupt, expected_corrupt as u64 + 1);
        disk.put(&key, &state).expect("re-put");
        assert_same_state(&disk.get(&key).expect("get").expect("hit"), &state);
    }
}

#[test]
fn failed_writes_leave_no_partial_files() {
    let root = tempfile::tempdir().expect("tempdir");
    let disk = DiskTier::open(root.path(), spec()).expect("disk tier");
    let key = key_of(4, 3);
    // A non-empty directory where the file should go makes the final rename fail after the
    // temporary file was written and synced.
    let path = disk.path_of(&key);
    std::fs::create_dir_all(path.join("blocker")).expect("blocking directory");
    let before = files_under(root.path());
    let error = disk
        .put(&key, &Arc::new(state(4, 3)))
        .expect_err("rename must fail");
    assert!(matches!(error, StoreError::Io { .. }), "{error}");
    assert_eq!(
        files_under(root.path()),
        before,
        "temporary file left behind"
    );
    assert_eq!(disk.stats().puts, 0);

    // A file where the shard directory should be: the write cannot even start.
    let key = key_of(5, 3);
    let shard = disk.path_of(&key).parent().expect("shard").to_path_buf();
    if !shard.exists() {
        std::fs::write(&shard, b"not a directory").expect("blocking file");
        let before = files_under(root.path());
        assert!(disk.put(&key, &Arc::new(state(5, 3))).is_err());
        assert_eq!(files_under(root.path()), before);
    }
}

#[test]
fn stale_temporaries_of_crashed_writers_are_swept() {
    let root = tempfile::tempdir().expect("tempdir");
    let disk = DiskTier::open(root.path(), spec()).expect("disk tier");
    let key = key_of(2, 3);
    disk.put(&key, &Arc::new(state(2, 3))).expect("put");
    let shard = disk.path_of(&key).parent().expect("shard").to_path_buf();
    let stale = shard.join(".tmp-crashed");
    let fresh = root.path().join("manifests").join(".tmp-writing");
    std::fs::create_dir_all(root.path().join("manifests")).expect("manifests dir");
    for path in [&stale, &fresh] {
        std::fs::write(path, b"partial").expect("temporary file");
    }
    let an_hour_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    std::fs::File::options()
        .write(true)
        .open(&stale)
        .and_then(|file| file.set_modified(an_hour_ago))
        .expect("age the file");

    let removed = disk
        .remove_stale_temporaries(std::time::Duration::from_secs(600))
        .expect("sweep");
    assert_eq!(removed, 1);
    assert!(!stale.exists());
    assert!(fresh.exists(), "a write in progress must survive");
    assert!(
        disk.contains(&key).expect("contains"),
        "entries are not temporaries"
    );
}

/// The device tier (`device:SIZE`) over RAM over disk: a put lands in all three, a new process
/// finds the state on disk and promotes it into both memory tiers, and the next get is the
/// device tier's. On the CPU the device is host memory; scripts/gpu-check.sh runs this file on
/// CUDA too (`PML_DEVICE`), where the device tier's copy lives in the GPU's memory.
#[test]
fn the_device_tier_holds_states_on_the_models_device() {
    let device = pml_engine::device::select_backend(
        pml_engine::device::BackendChoice::resolve(None, None).expect("PML_DEVICE parses"),
    )
    .expect("the device opens")
    .device;
    let root = tempfile::tempdir().expect("tempdir");
    let spec_text = format!("device:1MiB,ram:1MiB,disk:{}", root.path().display());
    let config = StoreConfig::parse(&spec_text, root.path()).expect("spec");
    let key = key_of(6, 5);
    let state = state(6, 5);
    {
        let store = ModuleStore::open_on(&config, spec(), &device).expect("store");
        let tiers: Vec<_> = store
            .put(&key, state.clone())
            .expect("put")
            .iter()
            .map(|put| put.tier)
            .collect();
        assert_eq!(tiers, ["device", "ram", "disk"]);
        let hit = store.get(&key).expect("get").expect("hit");
        assert_eq!(hit.tier, "device");
        assert!(
            hit.state.kv().layers().expect("layers")[0]
                .0
                .device()
                .same_device(&device)
        );
        assert_same_state(&hit.state, &state);
    }
    let store = ModuleStore::open_on(&config, spec(), &device).expect("store");
    assert_eq!(store.get(&key).expect("get").expect("hit").tier, "disk");
    let again = store.get(&key).expect("get").expect("hit");
    assert_eq!(again.tier, "device");
    assert_same_state(&again.state, &state);
    let device_stats = &store.stats().tiers[0];
    assert_eq!(
        (device_stats.tier, device_stats.hits, device_stats.misses),
        ("device", 1, 1)
    );
    assert!(device_stats.resident_bytes.is_some_and(|bytes| bytes > 0));
}

#[test]
fn ram_over_disk_reads_through_promotes_and_writes_through() {
    let root = tempfile::tempdir().expect("tempdir");
    let config = StoreConfig::local(root.path().to_path_buf(), 1 << 20);
    let key = key_of(6, 5);
    let state = state(6, 5);
    {
        let store = ModuleStore::open(&config, spec()).expect("store");
        let outcomes = store.put(&key, state.clone()).expect("put");
        let file_bytes = state.to_safetensors(&key, &spec()).expect("encode").len() as u64;
        let names: Vec<_> = outcomes.iter().map(|put| (put.tier, put.outcome)).collect();
        assert_eq!(
            names,
            [
                (
                    "ram",
                    PutOutcome::Stored {
                        bytes: state.size_in_bytes() as u64
                    }
                ),
                ("disk", PutOutcome::Stored { bytes: file_bytes })
            ]
        );
        for tier in store.tiers() {
            assert!(tier.contains(&key).expect("contains"), "{}", tier.name());
        }
        let hit = store.get(&key).expect("get").expect("hit");
        assert_eq!(hit.tier, "ram");
    }
    // A new process: RAM is empty, the disk answers and the state is promoted.
    let store = ModuleStore::open(&config, spec()).expect("store");
    let first = store.get(&key).expect("get").expect("hit");
    assert_eq!(first.tier, "disk");
    assert_same_state(&first.state, &state);
    let second = store.get(&key).expect("get").expect("hit");
    assert_eq!(second.tier, "ram");
    assert!(
        Arc::ptr_eq(&first.state, &second.state),
        "promoted copy is shared"
    );
    let stats = store.stats();
    let counts: Vec<_> = stats
        .tiers
        .iter()
        .map(|tier| (tier.tier, tier.hits, tier.misses, tier.puts))
        .collect();
    assert_eq!(counts, [("ram", 1, 1, 1), ("disk", 1, 0, 0)]);
    assert_eq!(stats.promotion_failures, 0);

    assert!(store.get(&key_of(7, 5)).expect("get").is_none());
    assert!(store.remove(&key).expect("remove"));
    assert!(!store.contains(&key).expect("contains"));

    // A state of another layout never enters the store.
    let wrong = state_with(
        KvLayout {
            n_layers: 2,
            ..LAYOUT
        },
        6,
        5,
    );
    assert!(matches!(
        store.put(&key, wrong),
        Err(StoreError::Mismatch { .. })
    ));
}

#[test]
fn states_over_the_ram_budget_still_reach_disk() {
    let root = tempfile::tempdir().expect("tempdir");
    let memory = MemoryTier::new(100);
    let disk = DiskTier::open(root.path(), spec()).expect("disk tier");
    let store = ModuleStore::with_tiers(
        spec(),
        vec![Box::new(memory), Box::new(disk)],
        pml_store::ManifestStore::new(root.path()),
    );
    let key = key_of(8, 4);
    let outcomes = store.put(&key, state(8, 4)).expect("put");
    assert!(matches!(outcomes[0].outcome, PutOutcome::TooLarge { .. }));
    assert!(matches!(outcomes[1].outcome, PutOutcome::Stored { .. }));
    // Every get comes from disk; a refused promotion is not a failure.
    for _ in 0..2 {
        assert_eq!(store.get(&key).expect("get").expect("hit").tier, "disk");
    }
    assert_eq!(store.stats().promotion_failures, 0);
}

#[test]
fn manifests_go_through_the_store() {
    let root = tempfile::tempdir().expect("tempdir");
    let config = StoreConfig::local(root.path().to_path_buf(), 1 << 20);
    let store = ModuleStore::open(&config, spec()).expect("store");
    assert_eq!(store.read_manifest("travel"), ManifestLookup::Missing);
    let key = key_of(1, 2);
    let manifest = Manifest::new(
        "travel",
        FINGERPRINT,
        EncodeMode::Scaffolded,
        vec![ManifestUnit {
            unit_id: 1,
            path: vec!["travel-plan".to_string()],
            key,
            n_tokens: 2,
            bytes: 1234,
        }],
    );
    let path = store.write_manifest(&manifest).expect("write");
    assert!(path.starts_with(root.path().join("manifests")));
    assert_eq!(
        store.read_manifest("travel").found(),
        Some(manifest.clone())
    );

    let foreign = Manifest {
        model_fingerprint: "another".to_string(),
        ..manifest
    };
    assert!(matches!(
        store.write_manifest(&foreign),
        Err(StoreError::Mismatch { .. })
    ));
}

#[test]
fn f16_and_f32_states_live_apart_and_an_f32_file_is_a_mismatch_for_an_f16_store() {
    let f16_spec = spec();
    let f32_spec = spec().with_state_dtype(DType::F32);
    let exact = state_with(LAYOUT, 12, 6);
    let key_in = |state_dtype| store_support::key_of_dtype(12, 6, state_dtype);
    assert_ne!(
        key_in(DType::F16),
        key_in(DType::F32),
        "the dtype is part of the key"
    );

    // An f32 file under a key an f16 store asks for (copied by hand): refused, kept, not converted.
    let root = tempfile::tempdir().expect("tempdir");
    let key = key_in(DType::F32);
    DiskTier::open(root.path(), f32_spec.clone())
        .and_then(|disk| disk.put(&key, &Arc::new(exact.clone())))
        .expect("f32 put");
    let f16_disk = DiskTier::open(root.path(), f16_spec.clone()).expect("f16 tier");
    let error = f16_disk.get(&key).expect_err("another dtype");
    assert!(
        matches!(&error, StoreError::Mismatch { what: "state dtype", expected, found }
            if expected == "f16" && found == "f32"),
        "{error}"
    );
    assert!(f16_disk.contains(&key).expect("contains"), "file kept");
    // And the other way round.
    let key = key_in(DType::F16);
    f16_disk
        .put(&key, &Arc::new(exact.to_dtype(DType::F16).expect("f16")))
        .expect("f16 put");
    let f32_disk = DiskTier::open(root.path(), f32_spec.clone()).expect("f32 tier");
    assert!(matches!(
        f32_disk.get(&key),
        Err(StoreError::Mismatch {
            what: "state dtype",
            ..
        })
    ));

    // A store converts what it is given: RAM and disk both hold f16, the rounding of the input.
    let stack_root = tempfile::tempdir().expect("tempdir");
    let config = StoreConfig::local(stack_root.path(), 1 << 20);
    assert_eq!(config.state_dtype, DType::F16);
    let rounded = exact.to_dtype(DType::F16).expect("f16");
    let store = ModuleStore::open(&config, f16_spec.clone()).expect("store");
    store.put(&key, exact.clone()).expect("put converts");
    assert_same_state(&store.get(&key).expect("get").expect("hit").state, &rounded);
    let reopened = ModuleStore::open(&config, f16_spec).expect("store");
    let from_disk = reopened.get(&key).expect("get").expect("hit");
    assert_eq!(from_disk.tier, "disk");
    assert_same_state(&from_disk.state, &rounded);
    // Half the bytes of the f32 file, headers aside.
    let f16_bytes = rounded.to_safetensors(&key, &spec()).expect("encode").len();
    let f32_bytes = exact.to_safetensors(&key, &f32_spec).expect("encode").len();
    let tensor_bytes = exact.kv().size_in_bytes();
    assert!(
        f32_bytes - f16_bytes >= tensor_bytes / 2 - 64,
        "{f32_bytes} vs {f16_bytes}"
    );
}

#[test]
fn a_flipped_byte_fails_the_checksum_and_a_truncated_file_is_malformed() {
    let state = state(13, 7);
    let key = key_of(13, 7);
    let bytes = state.to_safetensors(&key, &spec()).expect("encode");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + header_len]).expect("JSON header");
    assert!(header.contains("\"checksum_xxh3\":\""), "{header}");
    assert!(!header.contains("sha256"), "{header}");
    // A value byte: the structure still parses, only the checksum can tell.
    for index in [8 + header_len, 8 + header_len + 100, bytes.len() - 1] {
        let mut flipped = bytes.clone();
        flipped[index] ^= 0x01;
        match decode(&flipped, &key, &spec()) {
            Err(StoreError::Malformed(reason)) => {
                assert!(
                    reason.contains("checksum mismatch"),
                    "byte {index}: {reason}"
                )
            }
            other => panic!("byte {index}: expected a checksum mismatch, got {other:?}"),
        }
    }
    for len in [
        0,
        1,
        7,
        8,
        8 + header_len / 2,
        8 + header_len,
        bytes.len() - 1,
    ] {
        let error = decode(&bytes[..len], &key, &spec()).expect_err("truncated file");
        assert!(
            matches!(error, StoreError::Malformed(_)),
            "cut at {len}: {error}"
        );
    }
}

#[test]
fn files_of_the_previous_format_say_re_encode() {
    let root = tempfile::tempdir().expect("tempdir");
    let disk = DiskTier::open(root.path(), spec()).expect("disk tier");
    let key = key_of(14, 3);
    let current = state(14, 3).to_safetensors(&key, &spec()).expect("encode");
    // Format 2 as it was written: version 2, a BLAKE3 field of 64 hex digits in place of the
    // XXH3 one (the data offsets are relative to the header's end, so its length may change).
    let header_len = u64::from_le_bytes(current[..8].try_into().expect("8 bytes")) as usize;
    let header = std::str::from_utf8(&current[8..8 + header_len]).expect("JSON header");
    let field = "\"checksum_xxh3\":\"";
    let start = header.find(field).expect("checksum field") + field.len();
    let old_header = format!(
        "{}\"checksum_blake3\":\"{}{}",
        &header[..start - field.len()],
        "0".repeat(64),
        &header[start + 32..]
    )
    .replace("\"format_version\":\"3\"", "\"format_version\":\"2\"");
    assert!(
        old_header.contains("\"format_version\":\"2\""),
        "{old_header}"
    );
    let mut old = (old_header.len() as u64).to_le_bytes().to_vec();
    old.extend_from_slice(old_header.as_bytes());
    old.extend_from_slice(&current[8 + header_len..]);

    match decode(&old, &key, &spec()) {
        Err(StoreError::Malformed(reason)) => {
            assert!(reason.contains("store format 2"), "{reason}");
            assert!(reason.contains("re-encode"), "{reason}");
        }
        other => panic!("expected Malformed, got {other:?}"),
    }
    let path = disk.path_of(&key);
    std::fs::create_dir_all(path.parent().expect("shard")).expect("shard dir");
    std::fs::write(&path, &old).expect("old file");
    let message = disk.get(&key).expect_err("old format").to_string();
    assert!(
        message.contains("store format 2") && message.contains("re-encode"),
        "{message}"
    );
    assert!(
        !path.exists(),
        "an unreadable old file is removed like a corrupt one"
    );
}

#[test]
fn mapped_loads_own_their_tensors_after_the_file_is_replaced_or_removed() {
    let root = tempfile::tempdir().expect("tempdir");
    let disk = DiskTier::open(root.path(), spec()).expect("disk tier");
    let key = key_of(15, 9);
    let first = state(15, 9);
    disk.put(&key, &Arc::new(first.clone())).expect("put");
    let loaded = disk.get(&key).expect("get").expect("hit");
    assert_same_state(&loaded, &first);
    let file_len = std::fs::metadata(disk.path_of(&key)).expect("file").len();
    assert_eq!(disk.stats().bytes_read, file_len, "the map covers the file");

    // Another writer renames different bytes over the entry (tokens and positions as the key
    // says, other values), then it is removed: the state in hand never changes.
    let second =
        ModuleState::new(state(16, 9).kv().clone(), first.tokens().to_vec()).expect("state");
    assert_ne!(
        second.kv().layers().expect("tensors")[0]
            .0
            .to_vec3::<half::f16>()
            .expect("values"),
        first.kv().layers().expect("tensors")[0]
            .0
            .to_vec3::<half::f16>()
            .expect("values"),
    );
    disk.put(&key, &Arc::new(second.clone()))
        .expect("overwrite");
    assert_same_state(&loaded, &first);
    assert_same_state(&disk.get(&key).expect("get").expect("hit"), &second);
    assert!(disk.remove(&key).expect("remove"));
    assert_same_state(&loaded, &first);

    // Files too short to hold a header are refused before mapping (an empty map is an error on
    // some platforms).
    for len in [0, 7] {
        disk.put(&key, &Arc::new(first.clone())).expect("put");
        let path = disk.path_of(&key);
        let bytes = std::fs::read(&path).expect("read");
        std::fs::write(&path, &bytes[..len]).expect("truncate");
        assert!(matches!(disk.get(&key), Err(StoreError::Corrupt { .. })));
    }
}
