//! All or none on Redis: a refused request moves no counter, on one server and on a
//! Cluster whose organisation, team and member counters live on three different masters,
//! and while the store misses its deadlines.

use std::time::Duration;

use tollgate_testkit::all_or_none::{
    assert_hierarchy_exact, assert_refused_while_stalled_move_nothing, await_given_back, hit, left,
    levels,
};
use tollgate_testkit::grpc::Code;
use tollgate_testkit::keys::{Shape, redis_key};
use tollgate_testkit::process::blocking;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::redis::cluster::RedisCluster;

use crate::support::{DOMAIN, connected, two_connected};

/// The counters of `org`'s three levels for member `m` of team `t`, as Redis keys.
fn level_keys(org: &str) -> [String; 3] {
    let year = [Shape::sliding(Duration::from_secs(365 * 86_400))];
    [
        redis_key("", DOMAIN, &[("org", org)], &year),
        redis_key("", DOMAIN, &[("org", org), ("team", "t")], &year),
        redis_key(
            "",
            DOMAIN,
            &[("org", org), ("team", "t"), ("member", "m")],
            &year,
        ),
    ]
}

/// An organisation whose three levels (member `m` of team `t`) live on three masters.
fn spread_org(cluster: &RedisCluster) -> String {
    (0..1_000)
        .map(|i| format!("org{i}"))
        .find(|org| {
            let nodes = level_keys(org).map(|k| cluster.node_of(&k));
            nodes[0] != nodes[1] && nodes[1] != nodes[2] && nodes[0] != nodes[2]
        })
        .expect("an organisation whose levels hash to three masters")
}

#[tokio::test]
async fn the_hierarchy_is_exact_across_two_instances_on_one_server() {
    let redis = RedisServer::start();
    let (_servers, mut clients) =
        two_connected("single", &redis.url(), &["--store-timeout", "1s"]).await;
    assert_hierarchy_exact(&mut clients, DOMAIN, "acme").await;
}

/// The three levels on three masters: no one script reaches them all, so each is counted
/// on its own master and given back there.
#[tokio::test]
async fn the_hierarchy_is_exact_on_a_cluster_with_each_level_on_another_master() {
    let cluster = RedisCluster::start();
    let org = spread_org(&cluster);
    let (_servers, mut clients) =
        two_connected("cluster", &cluster.url(), &["--store-timeout", "1s"]).await;
    assert_hierarchy_exact(&mut clients, DOMAIN, &org).await;
    for key in level_keys(&org) {
        assert!(cluster.exists(&key), "{key} on the master of its slot");
    }
}

/// Refused requests while the server is frozen (SIGSTOP) past a 50 ms store timeout,
/// decided from the local view or answered with an error: once it answers, nothing they
/// counted is left counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_requests_while_the_server_is_frozen_leave_no_count() {
    for (i, on_error) in ["local", "error"].into_iter().enumerate() {
        let mut redis = RedisServer::start();
        let args = ["--store-timeout", "50ms", "--on-store-error", on_error];
        let first = connected("single", &redis.url(), &args).await;
        let second = connected("single", &redis.url(), &["--store-timeout", "1s"]).await;
        let mut hold = |held: bool| {
            if held {
                redis.freeze();
            } else {
                redis.thaw();
            }
        };
        let org = format!("frozen-{i}");
        assert_refused_while_stalled_move_nothing((&first, &second), DOMAIN, &org, &mut hold).await;
    }
}

/// The organisation's master frozen past a 50 ms store timeout, with `--on-store-error
/// error`: a member with room is answered with an error, and what team and member counted
/// on their own masters is given back; once the master answers, every level reads as
/// before. (Before all or none, the error left team and member counted.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_whose_master_misses_its_deadline_leaves_the_others_uncounted() {
    let mut cluster = RedisCluster::start();
    let org = spread_org(&cluster);
    let org_master = cluster.node_of(&level_keys(&org)[0]);
    let args = ["--store-timeout", "50ms", "--on-store-error", "error"];
    let first = connected("cluster", &cluster.url(), &args).await;
    let second = connected("cluster", &cluster.url(), &["--store-timeout", "1s"]).await;
    let (mut rls, mut other) = (first.client().await, second.client().await);
    let m = (org.as_str(), "t", "m");
    for _ in 0..3 {
        assert_eq!(hit(&mut rls, DOMAIN, m).await.0, Code::Ok);
    }
    blocking(|| cluster.nodes[org_master].freeze());
    for i in 0..5 {
        let failed = rls.call(levels(DOMAIN, m, 1, false)).await;
        let status = failed.expect_err("the organisation's counter is out of reach");
        assert_eq!(status.code(), tonic::Code::Unavailable, "request {i}");
    }
    blocking(|| cluster.nodes[org_master].thaw());
    first.await_store_health(200, Duration::from_secs(10)).await;
    await_given_back(&first).await;
    let doubted = first.metric("tollgate_store_calls_in_doubt_total").await;
    eprintln!("calls in doubt: {doubted:?}");
    assert_eq!(left(&mut other, DOMAIN, m).await, [97, 47, 7]);
    assert_eq!(left(&mut rls, DOMAIN, m).await, [97, 47, 7]);
}
