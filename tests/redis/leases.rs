//! Leases against one real redis-server (the testkit's [`leases`] run): two leasing
//! Tollgates call Redis far less often than they admit, never admit past the limit when
//! pushed into overload, and give what they hold back when they drain. Redis counts the
//! script calls itself. `/explain` shows the block an instance holds.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tollgate_testkit::admin;
use tollgate_testkit::leases::{self, Store};
use tollgate_testkit::load::timed_check;
use tollgate_testkit::redis::{Engine, RedisServer};
use tollgate_testkit::serial;
use tollgate_testkit::tollgate::Serve;
use tollgate_testkit::wait::{self, room_in_window};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leasing_instances_call_redis_rarely_and_never_admit_past_the_limit() {
    let _timing = serial::timing().await;
    let redis = RedisServer::start();
    let serve = |rules: &str| Serve::rules(rules).redis("single", &redis.url());
    let calls = || redis.commandstats().scripts();
    leases::call_rarely_and_never_admit_past_the_limit(Store {
        serve: &serve,
        calls: &calls,
    })
    .await;
}

async fn explain_shows_the_block_an_instance_holds(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = Serve::rules(leases::RULES)
        .redis("single", &redis.url())
        .args(["--store-timeout", "1s"])
        .start_connected()
        .await;
    room_in_window(Duration::from_secs(3_600), Duration::from_secs(120)).await;
    // Traffic keeps the counter hot (a block idle for a few periods goes back) until the
    // block is seen.
    let busy = Arc::new(AtomicBool::new(true));
    let mut traffic = tokio::task::JoinSet::new();
    for _ in 0..leases::CALLERS {
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
        left <= Some(leases::HOT_LIMIT / 100),
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
on_each_engine!(
    explain_shows_the_block_an_instance_holds,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);
