//! Runtime overrides kept in Redis (single and Cluster): set through one instance and
//! enforced by another, kept across restarts, deleted through one; written past an announcement, read within
//! a second, up to `OVERRIDES_MAX`; refused with 503 while Redis is down.

use std::time::Duration;

use tollgate_testkit::admin::{self, TOKEN, override_body};
use tollgate_testkit::http::Method;
use tollgate_testkit::overrides::{
    assert_overrides_spread, assert_refused_while_the_store_is_down, await_listed,
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

async fn overrides_written_unannounced_are_read_within_a_second_up_to_the_bound(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = serve("single", &redis.url())
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_MAX", "1")
        .start_connected()
        .await;
    let spec = |value: &str| override_body(DOMAIN, ("user", value), "9", "minute");
    // Straight into the hash, as if the announcement had been missed.
    let _: i64 = redis.query(&[
        "HSET",
        "tollgate-overrides",
        "a",
        &spec("ann"),
        "b",
        &spec("bob"),
    ]);
    await_listed(&server, "ann", true).await;
    let refused = server
        .stderr()
        .wait_for(|l| l.contains("OVERRIDES_MAX"), Duration::from_secs(5));
    assert!(refused.is_ok_and(|l| l.contains("more than 1 overrides")));
    let listed = admin::overrides(&server, Method::GET, "/overrides", "", Some(TOKEN)).await;
    assert!(!listed.body.contains("bob"), "past the bound: {listed:?}");
}
on_each_engine!(overrides_written_unannounced_are_read_within_a_second_up_to_the_bound);
