//! The admin endpoints over one real redis-server and two Tollgates: `/explain` shows each
//! instance's local view beside the shared value, and a reset through one instance
//! reaches the other's local view.

use tollgate_testkit::admin::{self, assert_reset_reaches_every_instance};
use tollgate_testkit::grpc::{Code, code};
use tollgate_testkit::redis::{Engine, RedisServer};

use crate::support::{DOMAIN, USER_LIMIT, admin_instance as instance};

#[tokio::test]
async fn explain_shows_the_local_view_beside_the_shared_value() {
    let redis = RedisServer::start();
    let (a, b) = (instance(&redis).await, instance(&redis).await);
    let ann = admin::body(DOMAIN, "user", "ann");
    let mut rls = a.client().await;
    for _ in 0..USER_LIMIT {
        assert_eq!(code(&rls.check(DOMAIN, &[("user", "ann")]).await), Code::Ok);
    }
    let on_a = &admin::explain(&a, &ann).await["descriptors"][0];
    assert_eq!(on_a["local"]["held"], true, "{on_a}");
    assert_eq!(on_a["local"]["limits"][0]["count"], USER_LIMIT, "{on_a}");
    assert_eq!(on_a["store"]["limits"][0]["count"], USER_LIMIT, "{on_a}");
    assert_eq!(on_a["decision"], "OVER_LIMIT", "{on_a}");
    // B never saw the counter: its view is empty, the store's is full, and the store decides.
    let on_b = &admin::explain(&b, &ann).await["descriptors"][0];
    assert_eq!(on_b["local"]["held"], false, "{on_b}");
    assert_eq!(on_b["local"]["limits"][0]["count"], 0, "{on_b}");
    assert_eq!(on_b["store"]["limits"][0]["count"], USER_LIMIT, "{on_b}");
    assert_eq!(on_b["decision"], "OVER_LIMIT", "{on_b}");
    // Explaining counted nothing, in the store or in B's view.
    let again = &admin::explain(&b, &ann).await["descriptors"][0];
    assert_eq!(again["local"]["held"], false, "{again}");
    assert_eq!(again["store"]["limits"][0]["count"], USER_LIMIT, "{again}");
}

async fn a_reset_through_one_instance_admits_the_next_request_on_both(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let (a, b) = (instance(&redis).await, instance(&redis).await);
    assert_reset_reaches_every_instance(&a, &b, DOMAIN, ("user", "ann"), USER_LIMIT).await;
}
on_each_engine!(a_reset_through_one_instance_admits_the_next_request_on_both);
