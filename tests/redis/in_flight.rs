//! In-flight rules on one real redis-server, two instances: slots taken, refused past
//! `max`, a release on one instance seen by the other at once, and leaked slots freeing
//! themselves after `expire_after` (a short one: the store keeps the time); explain
//! shows the slots held.

use tollgate_testkit::admin;
use tollgate_testkit::in_flight::{
    assert_in_flight_series, assert_leaked_slots_free_themselves, assert_slots_shared,
};
use tollgate_testkit::redis::{Engine, RedisServer};

use crate::support::{DOMAIN, two_connected};

async fn slots_are_shared_by_instances_and_leaked_ones_free_themselves(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let (servers, mut clients) =
        two_connected("single", &redis.url(), &["--store-timeout", "1s"]).await;
    assert_slots_shared(&mut clients, DOMAIN, "ann").await;
    let ann = admin::body(DOMAIN, "slots", "ann");
    let explained = &admin::explain(&servers[1], &ann).await["descriptors"][0];
    let store = &explained["store"]["limits"][0];
    assert_eq!(store["inFlight"], 2, "{explained}");
    assert_eq!(store["slotsHeld"], 2, "{explained}");
    assert_eq!(explained["decision"], "OVER_LIMIT", "{explained}");
    assert!(
        explained.get("local").is_none(),
        "no view holds slots: {explained}"
    );
    assert_leaked_slots_free_themselves(&mut clients, DOMAIN, "bob").await;
}
on_each_engine!(slots_are_shared_by_instances_and_leaked_ones_free_themselves);

#[tokio::test]
async fn in_flight_series_count_acquired_released_expired_and_held() {
    let redis = RedisServer::start();
    let (servers, mut clients) =
        two_connected("single", &redis.url(), &["--store-timeout", "1s"]).await;
    assert_in_flight_series(&servers, &mut clients, DOMAIN).await;
}
