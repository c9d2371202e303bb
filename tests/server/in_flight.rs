//! In-flight rules on the memory store, through a real process: slots taken, refused
//! past `max`, released at once, and leaked slots freeing themselves after
//! `expire_after` (the memory store's unit tests cover time on the injected clock).

use tollgate_testkit::in_flight::{assert_leaked_slots_free_themselves, assert_slots_shared};
use tollgate_testkit::tollgate::Serve;

const RULES: &str = concat!(
    "domain: m\ndescriptors:\n",
    tollgate_testkit::in_flight_rules!()
);

#[tokio::test]
async fn slots_are_taken_refused_released_and_leaked_ones_free_themselves() {
    let server = Serve::rules(RULES).start();
    let mut clients = vec![server.client().await, server.client().await];
    assert_slots_shared(&mut clients, "m", "ann").await;
    assert_leaked_slots_free_themselves(&mut clients, "m", "bob").await;
}
