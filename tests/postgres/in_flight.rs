//! In-flight rules on a real PostgreSQL, two instances: slots taken, refused past `max`,
//! a release on one instance seen by the other at once, and leaked slots freeing
//! themselves after `expire_after` (a short one: the store keeps the time).

use tollgate_testkit::in_flight::{
    assert_in_flight_series, assert_leaked_slots_free_themselves, assert_slots_shared,
};
use tollgate_testkit::postgres::PostgresServer;

use crate::support::{DOMAIN, connected};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_are_shared_by_instances_and_leaked_ones_free_themselves() {
    let postgres = PostgresServer::start();
    let (a, b) = (
        connected(&postgres, &[]).await,
        connected(&postgres, &[]).await,
    );
    let mut clients = vec![a.client().await, b.client().await];
    assert_slots_shared(&mut clients, DOMAIN, "ann").await;
    assert_leaked_slots_free_themselves(&mut clients, DOMAIN, "bob").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_series_count_acquired_released_expired_and_held() {
    let postgres = PostgresServer::start();
    let servers = [
        connected(&postgres, &[]).await,
        connected(&postgres, &[]).await,
    ];
    let mut clients = vec![servers[0].client().await, servers[1].client().await];
    assert_in_flight_series(&servers, &mut clients, DOMAIN).await;
}
