//! Reference mode counts every hit in Redis with the reference's commands, leases asked
//! for or not: a counter hot enough for a leasing Tollgate to take blocks of costs one
//! `INCRBY` a hit, as in the reference, so that reference instances sharing the Redis
//! see every hit at once.

use tollgate_testkit::leases::{self, CALLERS, RULES};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::Serve;

const PER_CALLER: usize = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_mode_never_leases_a_hot_counter() {
    let redis = RedisServer::start();
    let server = Serve::rules(RULES)
        .redis("single", &redis.url())
        .env("REFERENCE_MODE", "true")
        .env("LEASES", "true")
        .start_connected()
        .await;
    let client = server.client().await;

    let before = redis.commandstats();
    let admitted = leases::admissions(&[client], "hot", PER_CALLER).await;
    let increments = redis.commandstats().since(&before);
    let requests = (CALLERS * PER_CALLER) as u64;
    assert_eq!(admitted, requests);
    assert_eq!(increments.get("incrby"), Some(&requests), "{increments:?}");
    assert_eq!(
        server.metric("tollgate_store_lease_taken_total").await,
        Some(0.0)
    );
}
