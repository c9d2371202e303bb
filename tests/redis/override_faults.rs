//! A change of the overrides through a slow or stalled link to Redis (Toxiproxy between
//! the instance and Redis): an answer that says error means nothing changed, ever, and
//! one that says done means it was made. Redis is read directly to tell.

use std::time::Duration;

use tollgate_testkit::admin::{self, TOKEN, override_body};
use tollgate_testkit::http::{Method, Response};
use tollgate_testkit::overrides::await_listed;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{Listening, Server};
use tollgate_testkit::toxiproxy::{Direction, Proxy, Toxiproxy};

use crate::support::{DOMAIN, blocking, serve};

/// More than a change's deadline (5 s) and the second its answer is then awaited.
const SLOW: Duration = Duration::from_millis(6_500);

/// Redis, a proxy in front of it, and an instance reaching Redis through the proxy.
async fn behind_a_proxy(toxiproxy: &Toxiproxy) -> (RedisServer, Proxy, Server) {
    let redis = blocking(RedisServer::start);
    let proxy = toxiproxy.proxy("redis", &redis.host_port()).await;
    let server = serve("single", &proxy.redis_url())
        .args(["--store-timeout", "1s"])
        .env("ADMIN_TOKEN", TOKEN)
        .start_connected()
        .await;
    (redis, proxy, server)
}

async fn put(server: &Listening, value: &str) -> Response {
    let body = override_body(DOMAIN, ("user", value), "9", "minute");
    admin::overrides(server, Method::PUT, "/overrides", &body, Some(TOKEN)).await
}

/// The override of `value` as Redis holds it.
fn stored(redis: &RedisServer, value: &str) -> Option<String> {
    let id = format!("{DOMAIN}|user={value}#");
    redis.query(&["HGET", "tollgate-overrides", &id])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_redis_takes_after_its_deadline_is_refused_and_never_made() {
    let toxiproxy = Toxiproxy::start().await;
    let (redis, proxy, server) = behind_a_proxy(&toxiproxy).await;
    let slow = proxy
        .latency(Direction::Upstream, SLOW, Duration::ZERO)
        .await;
    let refused = put(&server, "ann").await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(refused.body.contains("timed out"), "{refused:?}");
    // The refusal was Redis' own answer: the script ran, past its deadline.
    assert_eq!(blocking(|| stored(&redis, "ann")), None);
    proxy.remove(&slow).await;
    server
        .await_store_health(200, Duration::from_secs(30))
        .await;
    assert_eq!(put(&server, "bob").await.status, 200);
    await_listed(&server, "bob", true).await;
    assert_eq!(blocking(|| stored(&redis, "ann")), None, "never made");
}

/// A change of about 6 KB trickling to Redis at 1 KB/s (its reads, small, go through):
/// it reaches Redis after its deadline, is refused there, and the answer is an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_change_trickling_to_redis_past_its_deadline_is_never_made() {
    let toxiproxy = Toxiproxy::start().await;
    let (redis, proxy, server) = behind_a_proxy(&toxiproxy).await;
    let value = "v".repeat(3_000);
    let slow = proxy.bandwidth(Direction::Upstream, 1).await;
    let refused = put(&server, &value).await;
    assert!([503, 504].contains(&refused.status), "{refused:?}");
    proxy.remove(&slow).await;
    server
        .await_store_health(200, Duration::from_secs(30))
        .await;
    // On the same connection, after the one refused.
    assert_eq!(put(&server, "bob").await.status, 200);
    assert_eq!(blocking(|| stored(&redis, &value)), None, "never made");
    await_listed(&server, "bob", true).await;
    let listed = admin::overrides(&server, Method::GET, "/overrides", "", Some(TOKEN)).await;
    assert!(!listed.body.contains(&value), "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_whose_answer_is_slow_is_answered_as_made() {
    let toxiproxy = Toxiproxy::start().await;
    let (redis, proxy, server) = behind_a_proxy(&toxiproxy).await;
    proxy
        .latency(Direction::Downstream, SLOW, Duration::ZERO)
        .await;
    let made = put(&server, "ann").await;
    assert_eq!(made.status, 200, "{made:?}");
    assert!(blocking(|| stored(&redis, "ann")).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_held_until_after_its_deadline_is_never_made() {
    let toxiproxy = Toxiproxy::start().await;
    let (redis, proxy, server) = behind_a_proxy(&toxiproxy).await;
    let held = proxy.timeout(Direction::Upstream, None).await;
    let unknown = put(&server, "ann").await;
    assert_eq!(unknown.status, 504, "{unknown:?}");
    assert!(unknown.body.contains("not known"), "{unknown:?}");
    assert!(unknown.body.contains("cannot be made after"), "{unknown:?}");
    // Released, the held change reaches Redis on its connection, before the next one.
    proxy.remove(&held).await;
    server
        .await_store_health(200, Duration::from_secs(30))
        .await;
    assert_eq!(put(&server, "bob").await.status, 200);
    assert_eq!(blocking(|| stored(&redis, "ann")), None, "refused, late");
    await_listed(&server, "bob", true).await;
    await_listed(&server, "ann", false).await;
}
