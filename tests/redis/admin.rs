//! The admin endpoints over one real redis-server and two Tollgates: `/explain` shows each
//! instance's local view beside the shared value.

use serde_json::Value;
use tollgate_testkit::grpc::{Code, code};
use tollgate_testkit::http::post_json;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::Server;

use crate::support::{DOMAIN, USER_LIMIT, serve};

const ANN: &str = r#"{"domain":"rl","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#;

async fn instance(redis: &RedisServer) -> Server {
    serve("single", &redis.url())
        .args(["--store-timeout", "1s"])
        .start_connected()
        .await
}

/// `/explain` of user=ann on `server`: its first descriptor.
async fn explain_ann(server: &Server) -> Value {
    let answer = post_json(server.http_addr(), "/explain", ANN).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    let got: Value = serde_json::from_str(&answer.body).expect("JSON");
    got["descriptors"][0].clone()
}

#[tokio::test]
async fn explain_shows_the_local_view_beside_the_shared_value() {
    let redis = RedisServer::start();
    let (a, b) = (instance(&redis).await, instance(&redis).await);
    let mut rls = a.client().await;
    for _ in 0..USER_LIMIT {
        assert_eq!(code(&rls.check(DOMAIN, &[("user", "ann")]).await), Code::Ok);
    }
    let on_a = explain_ann(&a).await;
    assert_eq!(on_a["local"]["held"], true, "{on_a}");
    assert_eq!(on_a["local"]["limits"][0]["count"], USER_LIMIT, "{on_a}");
    assert_eq!(on_a["store"]["limits"][0]["count"], USER_LIMIT, "{on_a}");
    assert_eq!(on_a["decision"], "OVER_LIMIT", "{on_a}");
    // B never saw the counter: its view is empty, the store's is full, and the store decides.
    let on_b = explain_ann(&b).await;
    assert_eq!(on_b["local"]["held"], false, "{on_b}");
    assert_eq!(on_b["local"]["limits"][0]["count"], 0, "{on_b}");
    assert_eq!(on_b["store"]["limits"][0]["count"], USER_LIMIT, "{on_b}");
    assert_eq!(on_b["decision"], "OVER_LIMIT", "{on_b}");
    // Explaining counted nothing, in the store or in B's view.
    assert_eq!(explain_ann(&b).await["local"]["held"], false);
    assert_eq!(
        explain_ann(&a).await["store"]["limits"][0]["count"],
        USER_LIMIT
    );
}
