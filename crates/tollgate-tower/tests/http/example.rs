//! The crate's example, served as its `main` serves it (peer addresses recorded): limited
//! per client and path, each policy named by its rule's place in the rules; and served
//! the usual way, without them, where no request could ever be limited: every request is
//! answered 500, and the log says what to change, once.

use tollgate_testkit::http::{self, Method};

use crate::logs::Logs;
use crate::{serve, serve_with_peers};

// The example's `main` is not called here; its `app` is what is tested.
#[allow(dead_code)]
#[path = "../../examples/per_client_ip_and_path.rs"]
mod per_client_ip_and_path;

#[tokio::test]
async fn the_example_limits_each_client_per_path() {
    let addr =
        serve_with_peers(per_client_ip_and_path::app().expect("the example's rules are valid"))
            .await;
    for left in (0..10).rev() {
        let ok = http::get(addr, "/hello").await;
        assert_eq!(ok.status, 200, "{ok:?}");
        assert_eq!(ok.body, "hello\n");
        let remaining = format!("\"remote_address.path\";r={left};");
        assert!(
            ok.header("ratelimit")
                .is_some_and(|h| h.starts_with(&remaining)),
            "{ok:?}"
        );
        assert_eq!(
            ok.header("ratelimit-policy"),
            Some("\"remote_address.path\";q=10;w=1")
        );
    }
    let denied = http::get(addr, "/hello").await;
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(
        denied.header_u64("retry-after"),
        1,
        "one token refills in 0.1 s"
    );
    // Another path of the same client has its own bucket; /login a stricter one.
    for _ in 0..3 {
        let login = http::send(addr, Method::POST, "/login", &[], "")
            .await
            .expect("send");
        assert_eq!(login.status, 200, "{login:?}");
    }
    let login = http::send(addr, Method::POST, "/login", &[], "")
        .await
        .expect("send");
    assert_eq!(login.status, 429);
    assert_eq!(
        login.header("ratelimit-policy"),
        Some("\"remote_address.path_/login\";q=3;w=60")
    );
    assert_eq!(
        login.header_u64("retry-after"),
        20,
        "3 a minute: one every 20 s"
    );
}

#[tokio::test]
async fn served_without_peer_addresses_the_example_fails_loudly() {
    let logs = Logs::get();
    let addr = serve(per_client_ip_and_path::app().expect("the example's rules are valid")).await;
    for _ in 0..3 {
        let answer = http::get(addr, "/hello").await;
        assert_eq!(answer.status, 500, "{answer:?}");
        assert_eq!(answer.body, "rate limit misconfigured\n");
    }
    let errors = logs.lines_with(&["ERROR", "domain=example", "answered 500"]);
    assert_eq!(
        errors.len(),
        1,
        "one error line, not one per request: {errors:#?}"
    );
    assert!(
        errors[0].contains("into_make_service_with_connect_info::<SocketAddr>()"),
        "the log says what to change: {}",
        errors[0]
    );
}
