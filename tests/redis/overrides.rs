//! Runtime overrides kept in Redis (single and Cluster): set through one instance and
//! enforced by another, kept across restarts, deleted through one; written past an announcement, read within
//! a second, up to `OVERRIDES_MAX`; refused with 503 while Redis is down.

use std::time::Duration;

use tollgate_testkit::admin::{self, TOKEN, override_body};
use tollgate_testkit::http::Method;
use tollgate_testkit::overrides::{
    assert_an_expired_override_frees_its_place, assert_overrides_spread,
    assert_refused_while_the_store_is_down, assert_the_maximum_holds_under_races, await_listed,
};
use tollgate_testkit::redis::cluster::RedisCluster;
use tollgate_testkit::redis::{Engine, RedisServer};

use crate::support::{DOMAIN, USER_LIMIT, admin_instance as instance, serve};

async fn an_override_set_on_one_instance_is_enforced_by_the_other_and_kept(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let limit = u32::try_from(USER_LIMIT).expect("a small limit");
    assert_overrides_spread(
        async || instance(&redis).await,
        DOMAIN,
        ("user", "ann"),
        limit,
    )
    .await;
}
on_each_engine!(an_override_set_on_one_instance_is_enforced_by_the_other_and_kept);

async fn overrides_spread_over_a_cluster(engine: Engine) {
    let cluster = RedisCluster::start_on(engine);
    let start = async || {
        serve("cluster", &cluster.url())
            .args(["--store-timeout", "1s"])
            .env("ADMIN_TOKEN", TOKEN)
            .start_connected()
            .await
    };
    let limit = u32::try_from(USER_LIMIT).expect("a small limit");
    assert_overrides_spread(start, DOMAIN, ("user", "ann"), limit).await;
}
on_each_engine!(overrides_spread_over_a_cluster);

#[tokio::test]
async fn a_change_while_redis_is_down_is_refused_with_a_reason() {
    let mut redis = RedisServer::start();
    let server = instance(&redis).await;
    redis.stop();
    assert_refused_while_the_store_is_down(&server, DOMAIN).await;
}

async fn overrides_written_around_the_log_are_read_whole_at_start_up_to_the_bound(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let spec = |value: &str| override_body(DOMAIN, ("user", value), "9", "minute");
    // Straight into the hash, as an older Tollgate writes them, under the ids they name.
    let id = |value: &str| format!("{DOMAIN}|user={value}#");
    let _: i64 = redis.query(&[
        "HSET",
        "tollgate-overrides",
        &id("ann"),
        &spec("ann"),
        &id("bob"),
        &spec("bob"),
    ]);
    let server = serve("single", &redis.url())
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_MAX", "1")
        .start_connected()
        .await;
    await_listed(&server, "ann", true).await;
    let refused = server
        .stderr()
        .wait_for(|l| l.contains("OVERRIDES_MAX"), Duration::from_secs(5));
    assert!(refused.is_ok_and(|l| l.contains("more than 1 overrides")));
    let listed = admin::overrides(&server, Method::GET, "/overrides", "", Some(TOKEN)).await;
    assert!(!listed.body.contains("bob"), "past the bound: {listed:?}");
}
on_each_engine!(overrides_written_around_the_log_are_read_whole_at_start_up_to_the_bound);

#[tokio::test]
async fn forged_log_entries_change_nothing_and_a_forged_version_is_refused_with_a_reason() {
    let redis = RedisServer::start();
    let server = instance(&redis).await;
    let put = async |value: &str| {
        let body = override_body(DOMAIN, ("user", value), "9", "minute");
        admin::overrides(&server, Method::PUT, "/overrides", &body, Some(TOKEN)).await
    };
    assert_eq!(put("ann").await.status, 200);
    let (log, meta) = ("{tollgate-overrides}:log", "{tollgate-overrides}:meta");
    // An entry naming JSON stored under another id, one past the version, one for an id
    // the hash does not hold: none may add an override.
    let _: i64 = redis.query(&[
        "HSET",
        "tollgate-overrides",
        "forged",
        &override_body(DOMAIN, ("user", "bob"), "1", "minute"),
    ]);
    let _: i64 = redis.query(&["ZADD", log, "2", "forged", "1e15", "later", "2", "gone"]);
    assert_eq!(put("cat").await.status, 200);
    await_listed(&server, "cat", true).await;
    let listed = admin::overrides(&server, Method::GET, "/overrides", "", Some(TOKEN)).await;
    assert!(
        listed.body.contains("ann") && !listed.body.contains("bob"),
        "{listed:?}"
    );
    let warned = server.stderr().wait_for(
        |l| l.contains("another descriptor's id"),
        Duration::from_secs(5),
    );
    assert!(warned.is_ok(), "the forged entry is named in the log");

    let _: i64 = redis.query(&["HSET", meta, "version", "abc"]);
    let refused = put("dan").await;
    assert_eq!(refused.status, 503, "{refused:?}");
    assert!(
        refused.body.contains("is not a version: abc"),
        "{refused:?}"
    );
    let _: i64 = redis.query(&["HSET", meta, "version", "40"]);
    assert_eq!(put("dan").await.status, 200);
    await_listed(&server, "dan", true).await;
}

async fn two_instances_racing_never_pass_the_maximum(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let start = async || {
        serve("single", &redis.url())
            .env("ADMIN_TOKEN", TOKEN)
            .env("OVERRIDES_MAX", "5")
            .start_connected()
            .await
    };
    let (a, b) = (start().await, start().await);
    assert_the_maximum_holds_under_races(&a, &b, DOMAIN, "user").await;
    let stored: i64 = redis.query(&["HLEN", "tollgate-overrides"]);
    assert_eq!(stored, 4, "the four kept, every winner deleted");
}
on_each_engine!(two_instances_racing_never_pass_the_maximum);

async fn an_expired_override_is_purged_from_redis(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = serve("single", &redis.url())
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_MAX", "1")
        .start_connected()
        .await;
    assert_an_expired_override_frees_its_place(&server, DOMAIN, "user").await;
    let fields: Vec<String> = redis.query(&["HKEYS", "tollgate-overrides"]);
    assert_eq!(fields.len(), 1, "only the one set after: {fields:?}");
    assert!(fields[0].contains("=b#"), "{fields:?}");
}
on_each_engine!(an_expired_override_is_purged_from_redis);
