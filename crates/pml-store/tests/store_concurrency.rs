//! Concurrent writers leave a valid store. Two OS processes (this test binary re-invoked in child
//! mode) compile the same schema into one store at once, writing the same keys and manifest,
//! while this process keeps reading: no read ever sees a damaged entry, and afterwards every
//! entry loads and verifies. Then many threads do the same through shared and separate handles.
// The test reports what it measured or skipped.
#![allow(clippy::print_stderr)]

mod store_support;

use std::path::Path;
use std::sync::Arc;

use pml_compiler::plan::EncodeMode;
use pml_store::{DiskTier, Manifest, ManifestUnit, ModuleStore, PutOutcome, StoreConfig, Tier};
use pml_testkit::child_process::{ChildTest, ready_then_wait_for_go, start_together};
use store_support::{FINGERPRINT, assert_same_state, files_under, key_of, spec, state};

/// Set in a child process to the store root it must compile into.
const CHILD_ENV: &str = "PML_STORE_TEST_CHILD_ROOT";
const N_UNITS: u32 = 40;
const ROUNDS: u32 = 3;
const SCHEMA: &str = "travel";
const CHILD_TEST: &str = "two_processes_compile_the_same_schema_at_once";

fn n_tokens(seed: u32) -> usize {
    1 + (seed as usize % 7) * 3
}

fn config(root: &Path) -> StoreConfig {
    StoreConfig::local(root.to_path_buf(), 1 << 20)
}

/// What `pmlc compile` does to the store: put every unit, then write the manifest.
fn compile_schema(store: &ModuleStore, first_seed: u32) {
    let mut units = Vec::new();
    for offset in 0..N_UNITS {
        let seed = (first_seed + offset) % N_UNITS;
        let key = key_of(seed, n_tokens(seed));
        let outcomes = store
            .put(&key, state(seed, n_tokens(seed)))
            .expect("put during compile");
        let Some(PutOutcome::Stored { bytes }) = outcomes.last().map(|put| put.outcome) else {
            panic!("disk refused unit {seed}");
        };
        units.push(ManifestUnit {
            unit_id: seed,
            path: vec![format!("module-{seed}")],
            key,
            n_tokens: n_tokens(seed),
            bytes,
        });
    }
    units.sort_by_key(|unit| unit.unit_id);
    let manifest = Manifest::new(SCHEMA, FINGERPRINT, EncodeMode::Scaffolded, units);
    store.write_manifest(&manifest).expect("manifest");
}

/// Every unit is present, loads and verifies, and the manifest lists them all.
fn assert_store_complete(root: &Path) {
    let disk = DiskTier::open(root, spec()).expect("disk tier");
    for seed in 0..N_UNITS {
        let key = key_of(seed, n_tokens(seed));
        let loaded = disk
            .get(&key)
            .unwrap_or_else(|error| panic!("unit {seed}: {error}"))
            .unwrap_or_else(|| panic!("unit {seed} missing"));
        assert_same_state(&loaded, &state(seed, n_tokens(seed)));
    }
    let store = ModuleStore::open(&config(root), spec()).expect("store");
    let manifest = store
        .read_manifest(SCHEMA)
        .found()
        .expect("manifest readable");
    assert_eq!(manifest.units.len(), N_UNITS as usize);
    for unit in &manifest.units {
        let file = disk.path_of(&unit.key);
        assert_eq!(
            std::fs::metadata(&file).expect("unit file").len(),
            unit.bytes
        );
    }
    let leftovers: Vec<String> = files_under(root)
        .into_iter()
        .filter(|path| path.contains(".tmp-"))
        .collect();
    assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
}

fn spawn_child(root: &Path) -> ChildTest {
    ChildTest::spawn(CHILD_TEST, CHILD_ENV, root)
}

fn run_as_child(root: &Path) {
    ready_then_wait_for_go();
    let store = ModuleStore::open(&config(root), spec()).expect("store");
    for round in 0..ROUNDS {
        compile_schema(&store, round * 13 + std::process::id() % N_UNITS);
    }
}

#[test]
fn two_processes_compile_the_same_schema_at_once() {
    if let Some(root) = std::env::var_os(CHILD_ENV) {
        run_as_child(Path::new(&root));
        return;
    }
    let root = tempfile::tempdir().expect("tempdir");
    let mut children = [spawn_child(root.path()), spawn_child(root.path())];
    start_together(&mut children);

    // Read while they write: an entry is either absent or whole.
    let reader = DiskTier::open(root.path(), spec()).expect("disk tier");
    let mut statuses = [None, None];
    let mut hits_while_writing = 0;
    while statuses.iter().any(Option::is_none) {
        for seed in 0..N_UNITS {
            match reader.get(&key_of(seed, n_tokens(seed))) {
                Ok(Some(loaded)) => {
                    assert_same_state(&loaded, &state(seed, n_tokens(seed)));
                    hits_while_writing += 1;
                }
                Ok(None) => {}
                Err(error) => panic!("read during concurrent writes failed: {error}"),
            }
        }
        for (child, status) in children.iter_mut().zip(statuses.iter_mut()) {
            if status.is_none() {
                *status = child.try_wait();
            }
        }
    }
    for status in statuses.into_iter().flatten() {
        assert!(status.success(), "child failed: {status}");
    }
    assert_eq!(reader.stats().corrupt, 0);
    eprintln!("{hits_while_writing} verified reads while the children wrote");
    assert_store_complete(root.path());
}

#[test]
fn many_threads_write_and_read_the_same_keys() {
    let root = tempfile::tempdir().expect("tempdir");
    let shared = Arc::new(ModuleStore::open(&config(root.path()), spec()).expect("store"));
    std::thread::scope(|scope| {
        for thread in 0..8u32 {
            let shared = Arc::clone(&shared);
            let root = root.path();
            scope.spawn(move || {
                // Half the threads share one store (and its RAM tier), half open their own.
                let own;
                let store = if thread % 2 == 0 {
                    &*shared
                } else {
                    own = ModuleStore::open(&config(root), spec()).expect("store");
                    &own
                };
                compile_schema(store, thread * 5);
                for seed in 0..N_UNITS {
                    let hit = store
                        .get(&key_of(seed, n_tokens(seed)))
                        .expect("get")
                        .expect("every unit was put");
                    assert_same_state(&hit.state, &state(seed, n_tokens(seed)));
                }
            });
        }
    });
    assert_store_complete(root.path());
    let disk_stats = &shared.stats().tiers[1];
    assert_eq!(disk_stats.corrupt, 0);
}
