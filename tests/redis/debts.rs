//! Admissions decided without Redis are a debt: charged to the shared counter once Redis
//! answers again, so that the outage does not hand out a second helping of the limit.

use std::time::Duration;

use tollgate_testkit::load::{Load, assert_admitted_within};
use tollgate_testkit::redis::{Engine, RedisServer};
use tollgate_testkit::shared_store::{
    a_stalled_batch_falls_back_for_every_request, admitted, await_settled,
};
use tollgate_testkit::tollgate::Server;

use crate::support::{DOMAIN, YEARLY_LIMIT, blocking, serve};

async fn connected(redis: &RedisServer) -> Server {
    serve("single", &redis.url())
        .args(["--store-timeout", "10ms", "--on-store-error", "local"])
        .start_connected()
        .await
}

/// One instance, Redis frozen (SIGSTOP) and thawed: what the instance admitted from its
/// local view while Redis did not answer counts once Redis is back, so the limit holds
/// across the freeze.
async fn admissions_during_a_freeze_are_charged_when_redis_is_back(engine: Engine) {
    let mut redis = RedisServer::start_engine(engine);
    let server = connected(&redis).await;
    let mut rls = server.client().await;

    assert_eq!(
        admitted(&mut rls, DOMAIN, ("yearly", "frozen"), 1).await,
        1,
        "through Redis"
    );
    blocking(|| redis.freeze());
    let during = admitted(&mut rls, DOMAIN, ("yearly", "frozen"), YEARLY_LIMIT + 3).await;
    assert_eq!(during, YEARLY_LIMIT - 1, "the local view holds the limit");
    blocking(|| redis.thaw());
    server
        .await_store_health(200, Duration::from_secs(10))
        .await;

    let after = admitted(&mut rls, DOMAIN, ("yearly", "frozen"), YEARLY_LIMIT + 3).await;
    assert_eq!(
        1 + during + after,
        YEARLY_LIMIT,
        "admitted {after} more after the freeze"
    );
}
on_each_engine!(
    admissions_during_a_freeze_are_charged_when_redis_is_back,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

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
async fn a_debt_reaches_redis_for_every_instance(engine: Engine) {
    let mut redis = RedisServer::start_engine(engine);
    let first = connected(&redis).await;
    let second = connected(&redis).await;
    let mut rls = first.client().await;
    let mut other = second.client().await;

    blocking(|| redis.freeze());
    assert_eq!(
        admitted(&mut rls, DOMAIN, ("yearly", "fresh"), YEARLY_LIMIT + 2).await,
        YEARLY_LIMIT,
        "decided locally while Redis is frozen"
    );
    blocking(|| redis.thaw());
    first.await_store_health(200, Duration::from_secs(10)).await;
    await_settled(&first).await;
    assert_eq!(
        admitted(&mut other, DOMAIN, ("yearly", "fresh"), 2).await,
        0,
        "the other instance sees the debt in Redis"
    );
}
on_each_engine!(
    a_debt_reaches_redis_for_every_instance,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// Writes paused (`CLIENT PAUSE WRITE`, as a failover or a reshard pauses them): the
/// server still answers reads and `TIME`, but holds every script call, so requests fall
/// back to the local view. When the pause ends the held calls run past their deadlines
/// and count nothing, and what the instance admitted meanwhile is charged as a debt: a
/// second instance, which never saw the pause, finds the counter full.
async fn admissions_during_a_write_pause_are_charged_when_it_ends(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let first = connected(&redis).await;
    let second = connected(&redis).await;
    let mut rls = first.client().await;
    let mut other = second.client().await;
    let entry = ("yearly", "paused");
    assert_eq!(
        admitted(&mut rls, DOMAIN, entry, 1).await,
        1,
        "through Redis"
    );

    blocking(|| redis.query::<()>(&["CLIENT", "PAUSE", "30000", "WRITE"]));
    let during = admitted(&mut rls, DOMAIN, entry, YEARLY_LIMIT + 2).await;
    assert_eq!(during, YEARLY_LIMIT - 1, "the local view holds the limit");
    let time: Vec<String> = blocking(|| redis.query(&["TIME"]));
    assert_eq!(
        time.len(),
        2,
        "reads are answered while writes wait: {time:?}"
    );
    blocking(|| redis.query::<()>(&["CLIENT", "UNPAUSE"]));

    await_settled(&first).await;
    assert_eq!(
        admitted(&mut other, DOMAIN, entry, 2).await,
        0,
        "the other instance sees the debt in Redis"
    );
    assert_eq!(
        admitted(&mut rls, DOMAIN, entry, 2).await,
        0,
        "nor more here"
    );
}
on_each_engine!(
    admissions_during_a_write_pause_are_charged_when_it_ends,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// Script calls Redis has run (EVALSHA, from `INFO commandstats`), asked at `url`.
fn script_calls(url: &str) -> u64 {
    let info: String = redis::Client::open(url)
        .and_then(|client| client.get_connection())
        .and_then(|mut conn| redis::cmd("INFO").arg("commandstats").query(&mut conn))
        .expect("INFO commandstats");
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|calls| calls.parse().ok())
        .unwrap_or(0)
}

/// Concurrent requests on fresh counters while Redis is frozen (SIGSTOP): see
/// [`a_stalled_batch_falls_back_for_every_request`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_that_times_out_falls_back_for_every_request_in_it() {
    let mut redis = RedisServer::start();
    let first = connected(&redis).await;
    let second = connected(&redis).await;
    let url = redis.url();
    let mut hold = |frozen| match frozen {
        true => redis.freeze(),
        false => redis.thaw(),
    };
    a_stalled_batch_falls_back_for_every_request((&first, &second), DOMAIN, &mut hold, &|| {
        script_calls(&url)
    })
    .await;
}
