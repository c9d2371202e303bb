//! The Redis store on Valkey 8.1 instead of Redis: a smoke test of one server and of a
//! 3-master Cluster. Which Redis tests also run on Valkey is decided apart (issue 59).

use tollgate_testkit::grpc::{Code, code};
use tollgate_testkit::load::{exactly, round_robin};
use tollgate_testkit::redis::cluster::RedisCluster;
use tollgate_testkit::redis::{Engine, RedisServer};

use crate::support::{
    DOMAIN, USER_LIMIT, assert_instances_share_exactly, blocking, key, two_connected,
};

const ARGS: [&str; 2] = ["--store-timeout", "1s"];

/// Two instances on one Valkey admit exactly the limit of a counter they share, and the
/// counter is where Redis would hold it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_a_counter_on_valkey() {
    let valkey = blocking(|| RedisServer::start_on(Engine::Valkey, "valkey", &[]));
    let version = valkey
        .info_field("server", "valkey_version")
        .expect("a Valkey server reports valkey_version");
    assert!(version.starts_with("8.1."), "Valkey {version}");
    let (_servers, mut clients) = two_connected("single", &valkey.url(), &ARGS).await;

    assert_instances_share_exactly(&mut clients, DOMAIN).await;
    for rls in &mut clients {
        let status = rls.check(DOMAIN, &[("user", "shared")]).await;
        assert_eq!(code(&status), Code::OverLimit, "{status:?}");
    }
    assert!(
        valkey.exists(&key("", "user", "shared")),
        "{:?}",
        valkey.keys("*")
    );
}

/// Two instances on a Cluster of three Valkey masters limit counters spread over all of
/// them exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_valkey_cluster_limits_counters_on_every_master() {
    let cluster = blocking(|| RedisCluster::start_on(Engine::Valkey));
    let (_servers, mut clients) = two_connected("cluster", &cluster.url(), &ARGS).await;

    for i in 0..30 {
        let value = format!("u{i}");
        let got = round_robin(&mut clients, DOMAIN, &[("user", &value)], USER_LIMIT + 1).await;
        assert_eq!(got, exactly(USER_LIMIT, 1), "user={value}");
    }
    let sizes: Vec<u64> = cluster.nodes.iter().map(|n| n.dbsize()).collect();
    assert_eq!(
        sizes.iter().sum::<u64>(),
        30,
        "one key per counter: {sizes:?}"
    );
    assert!(
        sizes.iter().all(|&n| n > 0),
        "every master holds counters: {sizes:?}"
    );
}
