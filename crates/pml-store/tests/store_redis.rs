//! The Redis tier against a real `redis-server` started by the test: chunked round trips, keys of
//! other models kept apart, damaged chunks detected and dropped, the shared byte budget evicting
//! least recently used entries, RAM over Redis reading through and promoting, and a server killed
//! mid-run degrading to misses and skipped puts (one warning, no error) while RAM keeps serving.

mod store_support;

use std::sync::Arc;
use std::time::Duration;

use pml_store::{
    ManifestStore, MemoryTier, ModuleStore, PutOutcome, RedisConfig, RedisTier, StateSpec,
    StoreError, Tier,
};
use pml_testkit::redis_server::start_redis;
use store_support::{
    FINGERPRINT, LAYOUT, assert_same_state, assert_shared_budget_evicts_least_recently_used,
    key_of, spec, state, state_bytes,
};

/// A tier on `url` with small chunks, so every state spans several values.
/// Small enough that every test state spans several chunks.
const CHUNK_BYTES: usize = 1000;

fn tier(url: &str, budget_bytes: Option<u64>) -> RedisTier {
    let mut config = RedisConfig::new(url);
    config.chunk_bytes = CHUNK_BYTES;
    config.budget_bytes = budget_bytes;
    config.timeout = Duration::from_millis(500);
    RedisTier::open(config, spec()).expect("redis tier")
}

#[test]
fn chunked_round_trip_with_counters_and_namespaces() {
    let Some(server) = start_redis() else { return };
    let redis = tier(&server.url(), None);
    let key = key_of(1, 10);
    let original = state(1, 10);
    assert!(redis.get(&key).expect("get").is_none());
    let outcome = redis.put(&key, &Arc::new(original.clone())).expect("put");
    let PutOutcome::Stored { bytes } = outcome else {
        panic!("not stored: {outcome:?}");
    };
    assert!(
        bytes > 2 * CHUNK_BYTES as u64,
        "a {bytes}-byte value would not span several chunks"
    );
    assert!(redis.contains(&key).expect("contains"));
    assert_same_state(&redis.get(&key).expect("get").expect("hit"), &original);
    // Writing the key again (its bytes may differ: metadata order) leaves it readable.
    for _ in 0..3 {
        redis
            .put(&key, &Arc::new(original.clone()))
            .expect("put again");
        assert_same_state(&redis.get(&key).expect("get").expect("hit"), &original);
    }

    let mut connection = server.connection();
    let namespace = RedisTier::namespace(&spec());
    let chunks: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{namespace}:c:{key}:*"))
        .query(&mut connection)
        .expect("keys");
    assert_eq!(chunks.len() as u64, bytes.div_ceil(CHUNK_BYTES as u64));

    let stats = redis.stats();
    assert_eq!((stats.hits, stats.misses, stats.puts), (4, 1, 4));
    assert_eq!(redis.held_bytes().expect("held"), Some(bytes));

    // Same key, another model: another namespace, so a miss.
    let other_model = StateSpec::new(format!("{FINGERPRINT}ff"), LAYOUT);
    assert_ne!(RedisTier::namespace(&other_model), namespace);
    let other = RedisTier::open(RedisConfig::new(server.url()), other_model).expect("tier");
    assert!(other.get(&key).expect("get").is_none());

    assert!(redis.remove(&key).expect("remove"));
    assert!(!redis.contains(&key).expect("contains"));
    assert_eq!(redis.held_bytes().expect("held"), Some(0));
}

#[test]
fn a_damaged_chunk_is_detected_and_dropped() {
    let Some(server) = start_redis() else { return };
    let redis = tier(&server.url(), None);
    let key = key_of(2, 10);
    redis.put(&key, &Arc::new(state(2, 10))).expect("put");
    let mut connection = server.connection();
    let chunks: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:c:{key}:*:1", RedisTier::namespace(&spec())))
        .query(&mut connection)
        .expect("keys");
    let chunk = chunks.first().expect("chunk 1").clone();
    let mut bytes: Vec<u8> = redis::cmd("GET")
        .arg(&chunk)
        .query(&mut connection)
        .expect("chunk");
    bytes[10] ^= 0x40;
    redis::cmd("SET")
        .arg(&chunk)
        .arg(bytes)
        .exec(&mut connection)
        .expect("set");
    let error = redis.get(&key).expect_err("damage goes unnoticed");
    assert!(matches!(error, StoreError::Corrupt { .. }), "{error}");
    assert!(!redis.contains(&key).expect("contains"), "entry kept");
    assert_eq!(redis.stats().corrupt, 1);

    // A missing chunk (evicted by the server) is a plain miss.
    redis.put(&key, &Arc::new(state(2, 10))).expect("put");
    let chunks: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{}:c:{key}:*:1", RedisTier::namespace(&spec())))
        .query(&mut connection)
        .expect("keys");
    redis::cmd("DEL")
        .arg(chunks.first().expect("chunk 1"))
        .exec(&mut connection)
        .expect("del");
    assert!(redis.get(&key).expect("get").is_none());
    assert!(!redis.contains(&key).expect("contains"));
}

#[test]
fn the_budget_evicts_least_recently_used_across_tiers_of_one_namespace() {
    let Some(server) = start_redis() else { return };
    let budget = Some(state_bytes() * 5 / 2);
    let first = tier(&server.url(), budget);
    let second = tier(&server.url(), budget);
    assert_shared_budget_evicts_least_recently_used(&first, &second);
    assert_eq!(first.stats().evictions, 1);
}

#[test]
fn ram_over_redis_reads_through_and_promotes_across_stores() {
    let Some(server) = start_redis() else { return };
    let manifests = tempfile::tempdir().expect("tempdir");
    let open = || {
        ModuleStore::with_tiers(
            spec(),
            vec![
                Box::new(MemoryTier::new(1 << 20)),
                Box::new(tier(&server.url(), None)),
            ],
            ManifestStore::new(manifests.path()),
        )
    };
    let writer = open();
    let outcomes = writer.put(&key_of(4, 6), state(4, 6)).expect("put");
    assert_eq!(
        outcomes.iter().map(|put| put.tier).collect::<Vec<_>>(),
        ["ram", "redis"]
    );
    // A second store (another process, in effect) has nothing in RAM: Redis serves, RAM is filled.
    let reader = open();
    let hit = reader.get(&key_of(4, 6)).expect("get").expect("hit");
    assert_eq!(hit.tier, "redis");
    assert_same_state(&hit.state, &state(4, 6));
    assert_eq!(
        reader.get(&key_of(4, 6)).expect("get").expect("hit").tier,
        "ram"
    );
    let stats = reader.stats();
    assert_eq!((stats.tiers[0].hits, stats.tiers[0].puts), (1, 1));
    assert_eq!((stats.tiers[1].hits, stats.tiers[1].misses), (1, 0));
}

#[test]
fn a_killed_server_degrades_to_local_tiers_without_errors() {
    let Some(mut server) = start_redis() else {
        return;
    };
    let manifests = tempfile::tempdir().expect("tempdir");
    let store = ModuleStore::with_tiers(
        spec(),
        vec![
            Box::new(MemoryTier::new(1 << 20)),
            Box::new(tier(&server.url(), None)),
        ],
        ManifestStore::new(manifests.path()),
    );
    store.put(&key_of(5, 6), state(5, 6)).expect("put");
    server.kill();

    // RAM still serves what it holds; Redis answers nothing and errors nowhere. It is asked
    // once: after the first failure the tier stays down until its retry time, so the 25
    // lookups below cost no connection attempt each (counted, not timed: timings are
    // benchmarks').
    assert_eq!(
        store.get(&key_of(5, 6)).expect("get").expect("hit").tier,
        "ram"
    );
    assert!(store.get(&key_of(6, 6)).expect("get").is_none());
    assert!(!store.contains(&key_of(6, 6)).expect("contains"));
    let outcomes = store.put(&key_of(6, 6), state(6, 6)).expect("put");
    assert_eq!(outcomes[1].outcome, PutOutcome::Unavailable);
    assert_eq!(
        store.get(&key_of(6, 6)).expect("get").expect("hit").tier,
        "ram"
    );
    for seed in 7..30 {
        assert!(store.get(&key_of(seed, 6)).expect("get").is_none());
    }
    let redis = &store.stats().tiers[1];
    assert_eq!(redis.tier, "redis");
    assert!(redis.unavailable >= 25, "{redis:?}");
    assert_eq!(redis.hits, 0);
}

#[test]
fn a_down_server_is_tried_once_per_retry_period_not_per_lookup() {
    let Some(mut server) = start_redis() else {
        return;
    };
    let redis = tier(&server.url(), None);
    redis
        .put(&key_of(8, 6), &Arc::new(state(8, 6)))
        .expect("put");
    assert_eq!(redis.connection_attempts(), 1);
    server.kill();
    for seed in 8..40 {
        assert!(redis.get(&key_of(seed, 6)).expect("get").is_none());
    }
    assert_eq!(
        redis
            .put(&key_of(9, 6), &Arc::new(state(9, 6)))
            .expect("put"),
        PutOutcome::Unavailable
    );
    // The open connection failed once; within the retry period nothing reconnects.
    assert_eq!(redis.connection_attempts(), 1);
    assert_eq!(redis.stats().unavailable, 33);
}
