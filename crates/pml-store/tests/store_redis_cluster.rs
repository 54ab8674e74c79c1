//! The Redis tier on a three-node Redis Cluster started by the test (`?cluster=1`): states put
//! through one node are read through another (another process, in effect), a namespace's keys
//! share one slot (its hash tag) so the multi-key commands are legal, the shared byte budget
//! still evicts the least recently used entry, and another model's namespace is kept apart.

mod store_support;

use std::sync::Arc;
use std::time::Duration;

use pml_store::{PutOutcome, RedisConfig, RedisTier, StateSpec, Tier};
use pml_testkit::redis_server::{RedisCluster, start_redis_cluster};
use store_support::{
    FINGERPRINT, LAYOUT, assert_same_state, assert_shared_budget_evicts_least_recently_used,
    key_of, spec, state, state_bytes,
};

/// A cluster tier seeded at node `seed`, with small chunks so every state spans several values.
fn tier(cluster: &RedisCluster, seed: usize, spec: StateSpec, budget: Option<u64>) -> RedisTier {
    let mut config = RedisConfig::new(cluster.nodes[seed].url());
    config.cluster = true;
    config.chunk_bytes = 1000;
    config.budget_bytes = budget;
    config.timeout = Duration::from_millis(2000);
    RedisTier::open(config, spec).expect("cluster tier")
}

fn slot(connection: &mut redis::cluster::ClusterConnection, key: &str) -> i64 {
    redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(connection)
        .expect("keyslot")
}

#[test]
fn states_round_trip_across_nodes_under_one_hash_tag() {
    let Some(cluster) = start_redis_cluster() else {
        return;
    };
    let writer = tier(&cluster, 0, spec(), None);
    let reader = tier(&cluster, 2, spec(), None);
    for index in 1..=4 {
        let outcome = writer
            .put(&key_of(index, 10), &Arc::new(state(index, 10)))
            .expect("put");
        assert!(matches!(outcome, PutOutcome::Stored { .. }), "{outcome:?}");
    }
    for index in 1..=4 {
        let hit = reader.get(&key_of(index, 10)).expect("get").expect("hit");
        assert_same_state(&hit, &state(index, 10));
    }
    assert_eq!(reader.stats().hits, 4);

    // Every key of the namespace hashes to the slot of its tag.
    let namespace = RedisTier::namespace(&spec());
    let mut connection = cluster.connection();
    let tag_slot = slot(&mut connection, &format!("{namespace}:lru"));
    for suffix in [
        format!("m:{}", key_of(1, 10)),
        "clock".into(),
        "bytes".into(),
    ] {
        assert_eq!(
            slot(&mut connection, &format!("{namespace}:{suffix}")),
            tag_slot
        );
    }
    // Exactly one node holds them.
    let holding: Vec<i64> = cluster
        .nodes
        .iter()
        .map(|node| {
            redis::cmd("DBSIZE")
                .query(&mut node.connection())
                .expect("dbsize")
        })
        .collect();
    assert_eq!(
        holding.iter().filter(|&&keys| keys > 0).count(),
        1,
        "{holding:?}"
    );

    // Another model: another namespace, so a miss.
    let other = tier(
        &cluster,
        1,
        StateSpec::new(format!("{FINGERPRINT}ff"), LAYOUT),
        None,
    );
    assert!(other.get(&key_of(1, 10)).expect("get").is_none());
    assert!(writer.remove(&key_of(1, 10)).expect("remove"));
    assert!(!reader.contains(&key_of(1, 10)).expect("contains"));
}

#[test]
fn the_budget_evicts_least_recently_used_on_a_cluster() {
    let Some(cluster) = start_redis_cluster() else {
        return;
    };
    let budget = Some(state_bytes() * 5 / 2);
    let first = tier(&cluster, 0, spec(), budget);
    let second = tier(&cluster, 1, spec(), budget);
    assert_shared_budget_evicts_least_recently_used(&first, &second);
}
