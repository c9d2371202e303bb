//! Admissions decided without Redis are a debt: charged to the shared counter once Redis
//! answers again, so that the outage does not hand out a second helping of the limit.

use std::time::Duration;

use tollgate_testkit::grpc::{Code, Rls, code};
use tollgate_testkit::load::{Load, assert_admitted_within};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::Server;
use tollgate_testkit::wait::until_async;

use crate::support::{DOMAIN, YEARLY_LIMIT, blocking, serve};

/// How many of `n` requests for `yearly=value` are admitted.
async fn admitted(rls: &mut Rls, value: &str, n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        if code(&rls.check(DOMAIN, &[("yearly", value)]).await) == Code::Ok {
            admitted += 1;
        }
    }
    admitted
}

async fn connected(redis: &RedisServer) -> Server {
    serve("single", &redis.url())
        .args(["--store-timeout", "10ms", "--on-store-error", "local"])
        .start_connected()
        .await
}

/// One instance, Redis frozen (SIGSTOP) and thawed: what the instance admitted from its
/// local view while Redis did not answer counts once Redis is back, so the limit holds
/// across the freeze.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_during_a_freeze_are_charged_when_redis_is_back() {
    let mut redis = RedisServer::start();
    let server = connected(&redis).await;
    let mut rls = server.client().await;

    assert_eq!(admitted(&mut rls, "frozen", 1).await, 1, "through Redis");
    blocking(|| redis.freeze());
    let during = admitted(&mut rls, "frozen", YEARLY_LIMIT + 3).await;
    assert_eq!(during, YEARLY_LIMIT - 1, "the local view holds the limit");
    blocking(|| redis.thaw());
    server
        .await_store_health(200, Duration::from_secs(10))
        .await;

    let after = admitted(&mut rls, "frozen", YEARLY_LIMIT + 3).await;
    assert_eq!(
        1 + during + after,
        YEARLY_LIMIT,
        "admitted {after} more after the freeze"
    );
}

/// One instance under steady load (400 requests a second on one key of 100 an hour),
/// Redis frozen for a moment before the limit is reached and thawed: requests keep
/// coming through the freeze, are decided from the local view, and what they admitted is
/// charged once Redis is back, so the instance admits no more than the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_freeze_under_load_never_admits_past_the_limit() {
    let _timing = tollgate_testkit::serial::timing().await;
    let mut redis = RedisServer::start();
    let server = connected(&redis).await;
    let clients = vec![server.client().await];
    let load = Load::on_one_counter(&clients, DOMAIN, "hundred", 400).await;
    load.await_answers_since(std::time::UNIX_EPOCH, 20, Duration::from_secs(30))
        .await;
    blocking(|| redis.freeze());
    let frozen = std::time::SystemTime::now();
    load.await_answers_since(frozen, 60, Duration::from_secs(30))
        .await;
    blocking(|| redis.thaw());
    let thawed = std::time::SystemTime::now();
    load.await_answers_since(thawed, 200, Duration::from_secs(30))
        .await;
    let answers = load.finish().await;
    let fallbacks = server.metric("tollgate_store_fallbacks_total").await;
    assert!(
        fallbacks >= Some(30.0),
        "decided locally while frozen: {fallbacks:?}"
    );
    assert_admitted_within(&answers, 100);
}

/// A fresh counter first seen while Redis is away, and a second instance that never saw
/// the outage: the first instance's local admissions reach Redis, and the second
/// instance then sees the counter full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_debt_reaches_redis_for_every_instance() {
    let mut redis = RedisServer::start();
    let first = connected(&redis).await;
    let second = connected(&redis).await;
    let mut rls = first.client().await;
    let mut other = second.client().await;

    blocking(|| redis.freeze());
    assert_eq!(
        admitted(&mut rls, "fresh", YEARLY_LIMIT + 2).await,
        YEARLY_LIMIT,
        "decided locally while Redis is frozen"
    );
    blocking(|| redis.thaw());
    first.await_store_health(200, Duration::from_secs(10)).await;
    // Settled: charged by the settler, or counted by the call that timed out if Redis
    // ran it within its deadline after all (then it owes nothing).
    until_async(
        "the debt is settled in Redis",
        Duration::from_secs(10),
        async || match first.metric("tollgate_store_debt_units").await {
            Some(n) if n <= 0.0 => Ok(()),
            other => Err(format!("units owed: {other:?}")),
        },
    )
    .await;
    assert_eq!(
        admitted(&mut other, "fresh", 2).await,
        0,
        "the other instance sees the debt in Redis"
    );
}
