//! Leases against one real redis-server: two Tollgates with `LEASES=true` on one hot
//! counter call Redis far less often than they admit, never admit past the limit when
//! pushed into overload, and give what they hold back when they drain; `/explain` shows
//! the block an instance holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate_testkit::admin;
use tollgate_testkit::grpc::{Code, Rls};
use tollgate_testkit::load::timed_check;
use tollgate_testkit::process::Signal;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::serial;
use tollgate_testkit::tollgate::{Serve, Server};
use tollgate_testkit::wait::{self, room_in_window};

const RULES: &str = r#"
domain: rl
descriptors:
  # Far above any load: 1 % of it (10,000) is the largest block.
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: fixed_window}
  # Pushed into overload: blocks of at most 30.
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 3000, algorithm: fixed_window}
"#;
const HOT_LIMIT: u64 = 1_000_000;
const TIGHT_LIMIT: u64 = 3_000;
const TIGHT_BLOCK: u64 = 30;
const INSTANCES: usize = 2;
/// Concurrent callers per instance.
const CALLERS: usize = 4;

/// Tollgate on `redis` with leases on.
async fn leasing(redis: &RedisServer) -> Server {
    Serve::rules(RULES)
        .redis("single", &redis.url())
        .args(["--store-timeout", "1s"])
        .env("LEASES", "true")
        .start_connected()
        .await
}

/// `per_caller` requests for `key=value` from each of [`CALLERS`] tasks per client, one
/// after another; the admissions.
async fn admissions(clients: &[Rls], key: &'static str, per_caller: usize) -> u64 {
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        for _ in 0..CALLERS {
            let mut rls = client.clone();
            tasks.spawn(async move {
                let mut admitted = 0;
                for _ in 0..per_caller {
                    let answer = timed_check(&mut rls, "rl", &[(key, "one")]).await;
                    match answer.result {
                        Ok(Code::Ok) => admitted += 1,
                        Ok(Code::OverLimit) => {}
                        other => panic!("{key}: {other:?}"),
                    }
                }
                admitted
            });
        }
    }
    tasks.join_all().await.into_iter().sum()
}

/// The metric `name` summed over `servers`.
async fn total(servers: &[Server], name: &str) -> f64 {
    let mut sum = 0.0;
    for server in servers {
        sum += server
            .metric(name)
            .await
            .unwrap_or_else(|| panic!("no {name} in /metrics"));
    }
    sum
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leasing_instances_call_redis_rarely_and_never_admit_past_the_limit() {
    let _timing = serial::timing().await;
    let redis = RedisServer::start();
    let mut servers = Vec::new();
    for _ in 0..INSTANCES {
        servers.push(leasing(&redis).await);
    }
    let mut clients = Vec::new();
    for server in &servers {
        clients.push(server.client().await);
    }

    // A hot counter far from its limit: most admissions come from blocks.
    room_in_window(Duration::from_secs(3_600), Duration::from_secs(120)).await;
    let before = redis.commandstats();
    let hot = admissions(&clients, "hot", 500).await;
    let scripts = redis.commandstats().scripts() - before.scripts();
    assert_eq!(hot, (INSTANCES * CALLERS * 500) as u64);
    let local = total(&servers, "tollgate_store_lease_local_admissions_total").await;
    eprintln!(
        "hot: {hot} admissions, {scripts} script calls, {local} admitted from leases, {} blocks",
        total(&servers, "tollgate_store_lease_taken_total").await
    );
    assert!(
        scripts * 4 < hot,
        "{scripts} script calls for {hot} admissions"
    );
    assert!(
        local * 2.0 > hot as f64,
        "{local} of {hot} admitted from leases"
    );

    // Overload on a counter of 3,000 a minute: never past it, and at most one block per
    // instance left unused.
    room_in_window(Duration::from_secs(60), Duration::from_secs(40)).await;
    let tight = admissions(&clients, "tight", 1_000).await;
    eprintln!(
        "tight: {tight} admitted of {} requests",
        INSTANCES * CALLERS * 1_000
    );
    assert!(tight <= TIGHT_LIMIT, "{tight} admitted past {TIGHT_LIMIT}");
    assert!(
        tight >= TIGHT_LIMIT - INSTANCES as u64 * TIGHT_BLOCK,
        "only {tight} of {TIGHT_LIMIT} admitted"
    );

    // Idle blocks and, at the drain, every block still held go back: a fresh instance sees
    // exactly what was admitted.
    for mut server in servers {
        server.signal(Signal::Term);
        assert!(server.wait_exit(Duration::from_secs(10)).status.success());
    }
    let fresh = leasing(&redis).await;
    let status = fresh.client().await.check("rl", &[("hot", "one")]).await;
    assert_eq!(
        u64::from(status.limit_remaining),
        HOT_LIMIT - hot - 1,
        "units still counted after the drain"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_shows_the_block_an_instance_holds() {
    let redis = RedisServer::start();
    let server = leasing(&redis).await;
    room_in_window(Duration::from_secs(3_600), Duration::from_secs(120)).await;
    // Traffic keeps the counter hot (a block idle for a few periods goes back) until the
    // block is seen.
    let busy = Arc::new(AtomicBool::new(true));
    let mut traffic = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let (mut rls, busy) = (server.client().await, busy.clone());
        traffic.spawn(async move {
            while busy.load(Ordering::Relaxed) {
                timed_check(&mut rls, "rl", &[("hot", "one")]).await;
            }
        });
    }
    let body = admin::body("rl", "hot", "one");
    let (lease, _) =
        wait::until_async("a lease in /explain", Duration::from_secs(10), async || {
            let explained = admin::explain(&server, &body).await;
            let lease = &explained["descriptors"][0]["lease"];
            match lease["left"].as_u64() {
                Some(_) => Ok(lease.clone()),
                None => Err(explained.to_string()),
            }
        })
        .await;
    busy.store(false, Ordering::Relaxed);
    traffic.join_all().await;
    let (left, spendable) = (lease["left"].as_u64(), lease["spendable"].as_u64());
    assert!(
        left <= Some(HOT_LIMIT / 100),
        "at most 1 % of the limit: {lease}"
    );
    assert!(spendable <= left, "{lease}");
    // A fixed hour: the block ends with it.
    let ends: f64 = lease["ends"]
        .as_str()
        .and_then(|s| s.trim_end_matches('s').parse().ok())
        .unwrap_or_else(|| panic!("an end: {lease}"));
    assert!(ends > 0.0 && ends <= 3_600.0, "{lease}");
}
