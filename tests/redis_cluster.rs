//! The Redis store against a 3-master Redis Cluster: limiting, sharing, keys spread over
//! all masters, accuracy under overload, and a node restart under load.

mod common;
mod redis_harness;

use std::time::{Duration, SystemTime};

use common::*;
use redis_harness::*;

fn on_cluster(cluster: &RedisCluster, extra: &[&str]) -> Server {
    start_connected(RULES, "cluster", &cluster.url(), extra)
}

#[test]
fn harness_cluster_forms_routes_and_restarts_nodes() {
    let mut cluster = RedisCluster::start();
    assert!(cluster.nodes.iter().all(|n| n.port() != 6379));
    let ranges = cluster.slot_ranges();
    for node in 0..3 {
        assert!(
            ranges.iter().any(|r| r.2 == node),
            "node {node} serves no slot: {ranges:?}"
        );
    }

    let keys = [
        "plain".to_owned(),
        redis_key("p:", DOMAIN, &[("user", "ann")], USER_SHAPE),
        redis_key("", DOMAIN, &[("probe", "x")], PROBE_SHAPE),
    ];
    for key in &keys {
        let slot: u16 = cluster.nodes[0].query(&["CLUSTER", "KEYSLOT", key]);
        assert_eq!(key_slot(key), slot, "{key}");
        let owner = cluster.node_of(key);
        let _: () = cluster.nodes[owner].query(&["SET", key, "1"]);
        let count: u64 =
            cluster.nodes[owner].query(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
        assert_eq!(count, 1, "{key}");
    }
    // Keys under one hash tag share a slot.
    assert_eq!(key_slot("a{tag}"), key_slot("b{tag}"));

    let owner = cluster.node_of(&keys[1]);
    let took = cluster.restart_node(owner);
    eprintln!("node {owner} restarted, cluster ok after {took:?}");
    assert_eq!(cluster.nodes[owner].dbsize(), 0, "nothing is persisted");
    assert_eq!(cluster.node_of(&keys[1]), owner, "the node keeps its slots");
}

#[tokio::test]
async fn limits_and_shares_counters_spread_over_all_masters() {
    let cluster = RedisCluster::start();
    let a = on_cluster(&cluster, &["--store-timeout", "1s"]);
    let b = on_cluster(&cluster, &["--store-timeout", "1s"]);
    let mut clients = [a.client().await, b.client().await];

    const VALUES: usize = 60;
    for i in 0..VALUES {
        let value = format!("u{i}");
        let got = round_robin(&mut clients, DOMAIN, &[("user", &value)], USER_LIMIT + 1).await;
        assert_eq!(
            got,
            exactly(USER_LIMIT, 1),
            "user={value} over two instances"
        );
    }

    let sizes: Vec<u64> = cluster.nodes.iter().map(RedisServer::dbsize).collect();
    assert_eq!(
        sizes.iter().sum::<u64>(),
        VALUES as u64,
        "one key per counter: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|&n| n > 0),
        "every master holds counters: {sizes:?}"
    );
    for i in 0..VALUES {
        let key = redis_key("", DOMAIN, &[("user", &format!("u{i}"))], USER_SHAPE);
        let node = &cluster.nodes[cluster.node_of(&key)];
        let exists: u64 = node.query(&["EXISTS", &key]);
        assert_eq!(exists, 1, "{key} on the master serving its slot");
        let in_slot: u64 = node.query(&["CLUSTER", "COUNTKEYSINSLOT", &key_slot(&key).to_string()]);
        assert!(in_slot >= 1, "{key}");
    }
}

/// The accuracy run of redis_single.rs (see there for the derivation of the bounds) with
/// the counter on one of the cluster's masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_stay_accurate_under_steady_overload() {
    let cluster = RedisCluster::start();
    let servers = [
        on_cluster(&cluster, &["--store-timeout", "1s"]),
        on_cluster(&cluster, &["--store-timeout", "1s"]),
        on_cluster(&cluster, &["--store-timeout", "1s"]),
    ];
    assert_accurate_under_overload(&servers, "cluster").await;
    let key = redis_key("", DOMAIN, &[("acc", "cluster")], ACC_SHAPE);
    let exists: u64 = cluster.nodes[cluster.node_of(&key)].query(&["EXISTS", &key]);
    assert_eq!(exists, 1, "the counter lives on its master: {key}");
}

/// One master is killed and started again (empty, same port, same nodes.conf) while two
/// instances serve steady load over counters on all masters. No call may hang (each
/// answers within 1 s: the store timeout is 10 ms) and limiting must be exact again — on
/// the restarted master too — within a few seconds of the cluster being whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_restart_under_load_neither_hangs_nor_lingers() {
    const CALL_LIMIT: Duration = Duration::from_secs(1);
    const RECOVERY: Duration = Duration::from_secs(5);
    let mut cluster = RedisCluster::start();
    let args = ["--store-timeout", "10ms", "--on-store-error", "local"];
    let a = on_cluster(&cluster, &args);
    let b = on_cluster(&cluster, &args);
    let mut clients = vec![a.client().await, b.client().await];

    let ranges = cluster.slot_ranges();
    let node_of = |key: &str| {
        let slot = key_slot(key);
        ranges
            .iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|r| r.2)
            .expect("slot served")
    };
    let victim = 0;
    let probe_key = |v: &str| redis_key("", DOMAIN, &[("probe", v)], PROBE_SHAPE);
    let on_victim: Vec<String> = (0..)
        .map(|i| format!("after-{i}"))
        .filter(|v| node_of(&probe_key(v)) == victim)
        .take(200)
        .collect();
    let busy: Vec<String> = (0..30).map(|i| format!("b{i}")).collect();
    let busy_nodes: std::collections::BTreeSet<usize> = busy
        .iter()
        .map(|v| node_of(&redis_key("", DOMAIN, &[("busy", v)], BUSY_SHAPE)))
        .collect();
    assert_eq!(busy_nodes.len(), 3, "the load reaches every master");

    let load = Load::start(&clients, DOMAIN, "busy", busy, Duration::from_millis(2));
    load.await_answers_since(SystemTime::UNIX_EPOCH, 50, Duration::from_secs(30))
        .await;
    let restart_at = SystemTime::now();
    let whole_after = tokio::task::block_in_place(|| cluster.restart_node(victim));
    eprintln!("node {victim} restarted; cluster ok again after {whole_after:?}");

    let (took, rounds) =
        await_exact_limiting_with(&mut clients, DOMAIN, "probe", PROBE_LIMIT, RECOVERY, |r| {
            on_victim[r - 1].clone()
        })
        .await;
    eprintln!("exact on the restarted master {took:?} after the cluster was ok, {rounds} rounds");
    let last = probe_key(&on_victim[rounds - 1]);
    let exists: u64 = cluster.nodes[victim].query(&["EXISTS", &last]);
    assert_eq!(
        exists, 1,
        "the probe counter {last} is on the restarted master"
    );
    await_exact_limiting(
        &mut clients,
        DOMAIN,
        "probe",
        "anywhere",
        PROBE_LIMIT,
        RECOVERY,
    )
    .await;

    let answers = load.finish().await;
    let during = sent_between(&answers, restart_at, SystemTime::now());
    assert!(!during.is_empty(), "load ran during the restart");
    assert_all_within(&answers, CALL_LIMIT, "cluster node restart");
    assert_all_ok(&answers);
    eprintln!(
        "{} answers ({} after the restart began), slowest {:?}",
        answers.len(),
        during.len(),
        answers.iter().map(|a| a.took).max().unwrap_or_default()
    );
}
