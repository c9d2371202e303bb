//! The Redis store against a 3-master Redis Cluster: limiting, sharing, keys spread over
//! all masters, accuracy under overload, and a node restart under load.

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use tollgate_testkit::grpc::Code;
use tollgate_testkit::load::{
    Load, assert_all, assert_latency, await_exact_limiting, exactly, in_sequence, round_robin,
    sent_between,
};
use tollgate_testkit::redis::Engine;
use tollgate_testkit::redis::cluster::{RedisCluster, key_slot};
use tollgate_testkit::serial;

use crate::support::{
    DOMAIN, PROBE_LIMIT, USER_LIMIT, assert_accurate_under_overload, await_exact_probe, blocking,
    connected, cut_connections, key, two_connected,
};

#[test]
fn cluster_forms_routes_and_restarts_nodes() {
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
        key("p:", "user", "ann"),
        key("", "probe", "x"),
    ];
    for key in &keys {
        let slot: u16 = cluster.nodes[0].query(&["CLUSTER", "KEYSLOT", key]);
        assert_eq!(key_slot(key), slot, "{key}");
        let owner = cluster.node_of(key);
        let () = cluster.nodes[owner].query(&["SET", key, "1"]);
        let count: u64 =
            cluster.nodes[owner].query(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]);
        assert_eq!(count, 1, "{key}");
    }

    let owner = cluster.node_of(&keys[1]);
    let took = cluster.restart_node(owner);
    eprintln!("node {owner} restarted, cluster ok after {took:?}");
    assert_eq!(cluster.nodes[owner].dbsize(), 0, "nothing is persisted");
    assert_eq!(cluster.node_of(&keys[1]), owner, "the node keeps its slots");
}

async fn limits_and_shares_counters_spread_over_all_masters(engine: Engine) {
    let cluster = RedisCluster::start_on(engine);
    let (_servers, mut clients) =
        two_connected("cluster", &cluster.url(), &["--store-timeout", "1s"]).await;

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

    let sizes: Vec<u64> = cluster.nodes.iter().map(|n| n.dbsize()).collect();
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
        let key = key("", "user", &format!("u{i}"));
        assert!(cluster.exists(&key), "{key} on the master serving its slot");
    }
}
on_each_engine!(limits_and_shares_counters_spread_over_all_masters);

/// The accuracy run of `single` with the counter on one of the cluster's masters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_stay_accurate_under_steady_overload() {
    let _timing = serial::timing().await;
    let cluster = RedisCluster::start();
    let args = ["--store-timeout", "1s", "--on-store-error", "error"];
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(connected("cluster", &cluster.url(), &args).await);
    }
    assert_accurate_under_overload(&servers, "cluster").await;
    let key = key("", "acc", "cluster");
    assert!(
        cluster.exists(&key),
        "the counter lives on its master: {key}"
    );
}

/// One master is killed and started again (empty, same port, same nodes.conf) while two
/// instances serve steady load over counters on all masters. No call may hang, 95 % are
/// answered within [`P95`] (the store timeout is 10 ms), every answer is OK (decided
/// locally while the master is away), and limiting is exact again — on the restarted
/// master too — within a few seconds of the cluster being whole.
async fn node_restart_under_load_neither_hangs_nor_lingers(engine: Engine) {
    const P95: Duration = Duration::from_secs(1);
    const RECOVERY: Duration = Duration::from_secs(5);
    let _timing = serial::timing().await;
    let mut cluster = RedisCluster::start_on(engine);
    let args = ["--store-timeout", "10ms", "--on-store-error", "local"];
    let (_servers, mut clients) = two_connected("cluster", &cluster.url(), &args).await;

    let ranges = cluster.slot_ranges();
    let victim = 0;
    let on_victim: Vec<String> = (0..)
        .map(|i| format!("after-{i}"))
        .filter(|v| RedisCluster::node_in(&ranges, &key("", "probe", v)) == victim)
        .take(200)
        .collect();
    let busy: Vec<String> = (0..30).map(|i| format!("b{i}")).collect();
    let busy_nodes: BTreeSet<usize> = busy
        .iter()
        .map(|v| RedisCluster::node_in(&ranges, &key("", "busy", v)))
        .collect();
    assert_eq!(busy_nodes.len(), 3, "the load reaches every master");

    let load = Load::start(&clients, DOMAIN, "busy", busy, Duration::from_millis(2)).await;
    let restart_at = SystemTime::now();
    let whole_after = blocking(|| cluster.restart_node(victim));
    eprintln!("node {victim} restarted; cluster ok again after {whole_after:?}");

    let (took, rounds) =
        await_exact_limiting(&mut clients, DOMAIN, "probe", PROBE_LIMIT, RECOVERY, |r| {
            on_victim[r - 1].clone()
        })
        .await;
    eprintln!("exact on the restarted master {took:?} after the cluster was ok, {rounds} rounds");
    let last = key("", "probe", &on_victim[rounds - 1]);
    assert!(
        cluster.nodes[victim].exists(&last),
        "the probe counter {last} is on the restarted master"
    );
    await_exact_probe(&mut clients, DOMAIN, "anywhere", RECOVERY).await;

    let answers = load.finish().await;
    let during = sent_between(&answers, restart_at, SystemTime::now());
    assert!(!during.is_empty(), "load ran during the restart");
    assert_latency(&answers, 0.95, P95, "cluster node restart");
    assert_all(
        &answers,
        Ok(Code::Ok),
        "--on-store-error local, counters far from their limit",
    );
    eprintln!(
        "{} answers, {} after the restart began",
        answers.len(),
        during.len()
    );
}
on_each_engine!(
    node_restart_under_load_neither_hangs_nor_lingers,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// Every master closes Tollgate's connection while no request is under way: each is
/// replaced as soon as it closes, so the requests that follow at once, on keys of every
/// master, are counted in Redis and none fails.
async fn connections_the_masters_close_while_idle_are_replaced_before_the_next_request(
    engine: Engine,
) {
    let cluster = RedisCluster::start_on(engine);
    let args = ["--store-timeout", "1s", "--on-store-error", "error"];
    let server = connected("cluster", &cluster.url(), &args).await;
    let mut rls = server.client().await;
    let warm = in_sequence(&mut rls, DOMAIN, &[("user", "warm")], 1).await;
    assert_eq!(warm, exactly(1, 0), "counted before the cut");
    let ups = server.store_ups().await;

    let nodes: Vec<_> = cluster.nodes.iter().collect();
    blocking(|| cut_connections(&nodes));

    let ranges = cluster.slot_ranges();
    let mut masters = BTreeSet::new();
    for value in (0..).map(|i| format!("after-cut-{i}")) {
        if masters.len() == cluster.nodes.len() {
            break;
        }
        if !masters.insert(RedisCluster::node_in(&ranges, &key("", "user", &value))) {
            continue;
        }
        let got = in_sequence(&mut rls, DOMAIN, &[("user", &value)], USER_LIMIT + 1).await;
        assert_eq!(got, exactly(USER_LIMIT, 1), "{value} after the cut");
    }
    server.assert_never_down_since(ups).await;
}
on_each_engine!(
    connections_the_masters_close_while_idle_are_replaced_before_the_next_request,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// A counter's slot moves to another master while two instances count (a reshard). While
/// it migrates, a counter the old master still holds is counted there, and a new one in
/// the same slot on the new master (ASK); once moved, both are counted on the new master
/// (MOVED), from the counts they had: each admits exactly its limit in all.
async fn counters_follow_their_slot_to_another_master(engine: Engine) {
    let cluster = RedisCluster::start_on(engine);
    let args = ["--store-timeout", "1s", "--on-store-error", "error"];
    let (_servers, mut clients) = two_connected("cluster", &cluster.url(), &args).await;
    let (held, fresh) = ("moving-0".to_owned(), same_slot_as("moving-0"));
    let user = |value: &str| key("", "user", value);
    let slot = key_slot(&user(&held));
    let mut count = async |value: &str, n: usize| {
        round_robin(&mut clients, DOMAIN, &[("user", value)], n).await
    };
    assert_eq!(count(&held, 2).await, exactly(2, 0), "before the move");

    let to = (RedisCluster::node_in(&cluster.slot_ranges(), &user(&held)) + 1) % 3;
    let from = blocking(|| cluster.begin_moving(slot, to));
    assert_eq!(
        count(&held, 1).await,
        exactly(1, 0),
        "held by the old master"
    );
    assert_eq!(
        count(&fresh, 2).await,
        exactly(2, 0),
        "asked of the new master"
    );
    // The slot's keys per master (the importing one answers EXISTS with MOVED).
    let in_slot = |node: usize| -> u64 {
        cluster.nodes[node].query(&["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()])
    };
    assert_eq!((in_slot(from), in_slot(to)), (1, 1), "{fresh} went by ASK");
    assert!(cluster.nodes[from].exists(&user(&held)), "{held} stays");

    blocking(|| cluster.finish_moving(slot, from, to));
    let rest = count(&held, USER_LIMIT - 3 + 1).await;
    assert_eq!(rest, exactly(USER_LIMIT - 3, 1), "{held} after the move");
    let rest = count(&fresh, USER_LIMIT - 2 + 1).await;
    assert_eq!(rest, exactly(USER_LIMIT - 2, 1), "{fresh} after the move");
    assert_eq!((in_slot(from), in_slot(to)), (0, 2), "both moved");
    assert!(cluster.nodes[to].exists(&user(&held)));
}
on_each_engine!(
    counters_follow_their_slot_to_another_master,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// A `user` value other than `value` whose counter's key hashes to the same slot.
fn same_slot_as(value: &str) -> String {
    let slot = key_slot(&key("", "user", value));
    (1..)
        .map(|i| format!("{value}-{i}"))
        .find(|other| key_slot(&key("", "user", other)) == slot)
        .expect("a value in every slot")
}
