//! Reference mode counts every hit in Redis with the reference's commands, leases asked
//! for or not: a counter hot enough for a leasing Tollgate to take blocks of costs one
//! `INCRBY` a hit, as in the reference, so that reference instances sharing the Redis
//! see every hit at once. Its counts stop at zero and at the top of Redis' integers.

use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate_testkit::admin;
use tollgate_testkit::grpc::{Code, Rls, code, request};
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

/// `n` hits (given back if `negative`) for `tight=value`: its code and units left.
async fn tight(rls: &mut Rls, value: &str, n: u64, negative: bool) -> (Code, u32) {
    let mut req = request("rl", &[&[("tight", value)]]);
    let d = &mut req.descriptors[0];
    d.hits_addend = Some(UInt64Value { value: n });
    d.is_negative_hits = negative;
    let status = rls.ok(req).await.statuses.remove(0);
    (code(&status), status.limit_remaining)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reference_mode_counts_stop_at_zero_and_at_the_top() {
    let redis = RedisServer::start();
    let server = Serve::rules(RULES)
        .redis("single", &redis.url())
        .env("REFERENCE_MODE", "true")
        .start_connected()
        .await;
    let mut rls = server.client().await;
    let limit = 3_000;

    // A refund larger than the count empties it: the next hit is counted from zero.
    assert_eq!(tight(&mut rls, "a", 1, false).await, (Code::Ok, limit - 1));
    assert_eq!(
        tight(&mut rls, "a", u64::MAX, true).await,
        (Code::Ok, limit)
    );
    assert_eq!(tight(&mut rls, "a", 1, false).await, (Code::Ok, limit - 1));

    // Hits of 2^64 - 1, counted first as the reference does, fill Redis' 64-bit count;
    // past its top they are over the limit still, not an error.
    for _ in 0..1_100 {
        assert_eq!(
            tight(&mut rls, "b", u64::MAX, false).await,
            (Code::OverLimit, 0)
        );
    }
    assert_eq!(tight(&mut rls, "b", 1, false).await, (Code::OverLimit, 0));
}

/// Explaining a counter in reference mode shows what Redis holds: every hit counted (6
/// of a limit of 5, where the view used to stop at 5), under the key Redis holds it by
/// (its window's start at the end), and no local view, which reference mode has not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_in_reference_mode_shows_the_redis_key_and_count() {
    const DAILY: &str = "domain: refx\ndescriptors:\n  - key: user\n    rate_limit: {unit: day, requests_per_unit: 5}\n";
    let redis = RedisServer::start();
    let server = Serve::rules(DAILY)
        .redis("single", &redis.url())
        .env("REFERENCE_MODE", "true")
        .start_connected()
        .await;
    let mut rls = server.client().await;
    for want in [
        Code::Ok,
        Code::Ok,
        Code::Ok,
        Code::Ok,
        Code::Ok,
        Code::OverLimit,
    ] {
        assert_eq!(code(&rls.check("refx", &[("user", "ann")]).await), want);
    }
    let got = admin::explain(&server, &admin::body("refx", "user", "ann")).await;
    let ann = &got["descriptors"][0];
    let key = ann["key"]
        .as_str()
        .unwrap_or_else(|| panic!("no key: {got}"));
    let start = key
        .strip_prefix("refx_user_ann_")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or_else(|| panic!("not the reference's key: {key}"));
    assert_eq!(start % 86_400, 0, "the day's start: {key}");
    assert_eq!(redis.query::<u64>(&["GET", key]), 6);
    let store = &ann["store"]["limits"][0];
    assert_eq!(
        (store["count"].as_u64(), store["remaining"].as_u64()),
        (Some(6), Some(0)),
        "{got}"
    );
    assert!(ann.get("local").is_none(), "no local view: {got}");
    assert_eq!(ann["decision"], "OVER_LIMIT", "{got}");
}
