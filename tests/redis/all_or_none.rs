//! All or none on Redis: a refused request moves no counter, on one server and on a
//! Cluster whose organisation, team and member counters live on three different masters,
//! while the store misses its deadlines, and across a fleet behind faulty links.

use std::collections::BTreeMap;
use std::time::Duration;

use tollgate_testkit::all_or_none::{
    LEVEL_LIMITS, assert_hierarchy_exact, assert_refused_while_stalled_move_nothing,
    await_given_back, hit, left, levels,
};
use tollgate_testkit::grpc::{Code, code, descriptor, overall};
use tollgate_testkit::keys::{Shape, redis_key};
use tollgate_testkit::process::blocking;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::redis::cluster::RedisCluster;
use tollgate_testkit::rng::Rng;
use tollgate_testkit::toxiproxy::{Direction, Toxiproxy};

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
/// error`: a member with room, taking an in-flight slot too, is answered with an error,
/// and what team, member and slot counted on their own masters is given back; once the
/// master answers, every level reads as before and both slots are free. (Before all or
/// none, the error left team and member counted.)
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
    // Through the instance whose timeout a loaded machine does not miss.
    for _ in 0..3 {
        assert_eq!(hit(&mut other, DOMAIN, m).await.0, Code::Ok);
    }
    blocking(|| cluster.nodes[org_master].freeze());
    for i in 0..5 {
        let mut with_slot = levels(DOMAIN, m, 1, false);
        with_slot
            .descriptors
            .push(descriptor(&[("slots", "frozen")]));
        let failed = rls.call(with_slot).await;
        let status = failed.expect_err("the organisation's counter is out of reach");
        assert_eq!(status.code(), tonic::Code::Unavailable, "request {i}");
    }
    blocking(|| cluster.nodes[org_master].thaw());
    first.await_store_health(200, Duration::from_secs(10)).await;
    await_given_back(&first).await;
    assert_eq!(left(&mut other, DOMAIN, m).await, [97, 47, 7]);
    let slots: Vec<Code> = [
        other
            .check_own_hits(DOMAIN, &[("slots", "frozen")], 1, false)
            .await,
        other
            .check_own_hits(DOMAIN, &[("slots", "frozen")], 1, false)
            .await,
    ]
    .iter()
    .map(code)
    .collect();
    assert_eq!(slots, [Code::Ok, Code::Ok], "no slot left taken");
}

/// Requests of three levels through three instances, each behind a Toxiproxy link of its
/// own, while seeded faults hold requests or answers past a 50 ms store timeout (the
/// instances decide from their views with `--on-store-error local`, and answer an error
/// with `error`). Once every link heals and every instance has settled, each counter
/// holds exactly the hits of the requests answered OK: no refused or failed request moved
/// one. Latency never breaks a connection, so no call is in doubt and the counts must be
/// exact. `ALL_OR_NONE_SEEDS=N` runs seeds 1 to N in each mode.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_behind_faulty_links_counts_only_requests_answered_ok() {
    const INSTANCES: usize = 3;
    const STEPS: usize = 70;
    const HELD: Duration = Duration::from_millis(200);
    let seeds = std::env::var("ALL_OR_NONE_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(1_u64);
    for (seed, on_error) in (1..=seeds).flat_map(|seed| [(seed, "local"), (seed, "error")]) {
        let redis = RedisServer::start();
        let toxiproxy = Toxiproxy::start().await;
        let args = ["--store-timeout", "50ms", "--on-store-error", on_error];
        let mut links = Vec::new();
        let mut servers = Vec::new();
        let mut clients = Vec::new();
        for i in 0..INSTANCES {
            let link = toxiproxy
                .proxy(&format!("instance-{i}"), &redis.host_port())
                .await;
            let server = connected("single", &link.redis_url(), &args).await;
            clients.push(server.client().await);
            servers.push(server);
            links.push(link);
        }
        let reader = connected("single", &redis.url(), &["--store-timeout", "1s"]).await;
        let mut rng = Rng::new(seed);
        let mut truth: BTreeMap<Vec<(&str, &str)>, u64> = BTreeMap::new();
        let (mut admitted, mut refused) = (0, 0);
        for _ in 0..STEPS {
            let i = rng.below(INSTANCES);
            let who = (
                "fleet",
                ["t0", "t1"][rng.below(2)],
                ["m0", "m1", "m2", "m3"][rng.below(4)],
            );
            let hits = rng.below(2) as u64 + 1;
            let toxic = match rng.below(10) {
                0..2 => Some(
                    links[i]
                        .latency(Direction::Upstream, HELD, Duration::ZERO)
                        .await,
                ),
                2..4 => Some(
                    links[i]
                        .latency(Direction::Downstream, HELD, Duration::ZERO)
                        .await,
                ),
                _ => None,
            };
            let answer = clients[i].call(levels(DOMAIN, who, hits, false)).await;
            if let Some(toxic) = toxic {
                links[i].remove(&toxic).await;
            }
            if let Err(status) = &answer {
                assert_eq!(
                    status.code(),
                    tonic::Code::Unavailable,
                    "{on_error}: {status:?}"
                );
            }
            if answer.is_ok_and(|resp| overall(&resp) == Code::Ok) {
                admitted += 1;
                for level in level_entries(who) {
                    *truth.entry(level).or_default() += hits;
                }
            } else {
                refused += 1;
            }
        }
        assert!(
            admitted > 0 && refused > 0,
            "seed {seed}, {on_error}: {admitted} admitted, {refused} refused or failed"
        );
        for server in &servers {
            server
                .await_store_health(200, Duration::from_secs(10))
                .await;
            await_given_back(server).await;
        }
        let mut rls = reader.client().await;
        for team in ["t0", "t1"] {
            for member in ["m0", "m1", "m2", "m3"] {
                let who = ("fleet", team, member);
                let expected: Vec<u32> = level_entries(who)
                    .into_iter()
                    .zip(LEVEL_LIMITS)
                    .map(|(level, limit)| {
                        let counted = truth.get(&level).copied().unwrap_or(0);
                        limit.saturating_sub(u32::try_from(counted).unwrap_or(u32::MAX))
                    })
                    .collect();
                assert_eq!(
                    left(&mut rls, DOMAIN, who).await.to_vec(),
                    expected,
                    "seed {seed}, {on_error}: {who:?} after {admitted} admitted, {refused} refused or failed"
                );
            }
        }
    }
}

/// The entries of `who`'s three levels.
fn level_entries<'a>(
    (org, team, member): (&'a str, &'a str, &'a str),
) -> [Vec<(&'a str, &'a str)>; 3] {
    [
        vec![("org", org)],
        vec![("org", org), ("team", team)],
        vec![("org", org), ("team", team), ("member", member)],
    ]
}
