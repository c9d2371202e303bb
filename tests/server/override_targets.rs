//! What an override may target, on the memory store: a `share_threshold` value counts on
//! its pattern's shared counter (refused if it would need another window), an `in_flight`
//! descriptor is refused, and texts past their bounds are refused naming the bound.

use tollgate_testkit::admin::{self, TOKEN, override_body};
use tollgate_testkit::grpc::{Code, code};
use tollgate_testkit::http::{Method, Response};
use tollgate_testkit::tollgate::Listening;

use crate::in_process::InProcess;

const RULES: &str = concat!(
    "domain: api
descriptors:
  - key: files
    value: docs/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
",
    tollgate_testkit::in_flight_rules!()
);

async fn put(server: &Listening, body: &str) -> Response {
    admin::overrides(server, Method::PUT, "/overrides", body, Some(TOKEN)).await
}

#[tokio::test]
async fn an_override_of_a_shared_value_counts_on_the_shared_counter() {
    let server = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let mut rls = server.client().await;
    for _ in 0..5 {
        assert_eq!(
            code(&rls.check("api", &[("files", "docs/a")]).await),
            Code::Ok
        );
    }
    let set = put(
        &server,
        &override_body("api", ("files", "docs/a"), "5", "minute"),
    )
    .await;
    assert_eq!(set.status, 200, "{set:?}");
    let status = rls.check("api", &[("files", "docs/a")]).await;
    assert_eq!(
        code(&status),
        Code::OverLimit,
        "docs/* has counted 5 in this window: {status:?}"
    );
    let raised = put(
        &server,
        &override_body("api", ("files", "docs/a"), "7", "minute"),
    )
    .await;
    assert_eq!(raised.status, 200, "{raised:?}");
    for want in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(code(&rls.check("api", &[("files", "docs/a")]).await), want);
    }
    assert_eq!(
        code(&rls.check("api", &[("files", "docs/b")]).await),
        Code::OverLimit,
        "docs/a's 7 counted on the counter docs/b shares"
    );
    let hourly = put(
        &server,
        &override_body("api", ("files", "docs/a"), "5", "hour"),
    )
    .await;
    assert_eq!(hourly.status, 400, "{hourly:?}");
    for says in ["share_threshold", "docs/*", "sliding_window over 60s"] {
        assert!(hourly.body.contains(says), "{says} not in {hourly:?}");
    }
}

#[tokio::test]
async fn an_override_of_an_in_flight_descriptor_is_refused() {
    let server = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let refused = put(
        &server,
        &override_body("api", ("slots", "ann"), "5", "hour"),
    )
    .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(refused.body.contains("in_flight"), "{refused:?}");
    let listed = admin::overrides(&server, Method::GET, "/overrides", "", Some(TOKEN)).await;
    assert!(listed.body.contains(r#""overrides":[]"#), "{listed:?}");
}

#[tokio::test]
async fn texts_past_their_bounds_are_refused_naming_the_bound() {
    let server = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let long_value = "v".repeat(4_097);
    let named = override_body("api", ("tenant", "acme"), "5", "minute").replace(
        r#""unit":"minute""#,
        &format!(r#""unit":"minute","name":"{}""#, "n".repeat(257)),
    );
    let many: Vec<String> = (0..33)
        .map(|i| format!(r#"{{"key":"k{i}","value":"v"}}"#))
        .collect();
    let many = format!(
        r#"{{"domain":"api","entries":[{}],"limit":{{"requests_per_unit":5,"unit":"minute"}}}}"#,
        many.join(",")
    );
    for (body, says) in [
        (
            override_body("api", ("tenant", &long_value), "5", "minute"),
            "entries[0].value: 4097 bytes, at most 4096",
        ),
        (named, "limit.name: 257 bytes, at most 256"),
        (many, "entries: 33 entries, at most 32"),
        (
            override_body("api", ("tenant", "a\\u0000b"), "5", "minute"),
            "entries[0].value: must not hold NUL",
        ),
    ] {
        let refused = put(&server, &body).await;
        assert_eq!(refused.status, 400, "{refused:?}");
        assert!(refused.body.contains(says), "{says} not in {refused:?}");
    }
    let listed = admin::overrides(&server, Method::GET, "/overrides", "", Some(TOKEN)).await;
    assert!(listed.body.contains(r#""overrides":[]"#), "{listed:?}");
    let odd = put(
        &server,
        &override_body("api", ("tenant", "\\u001b[2J \\u202e"), "5", "minute"),
    )
    .await;
    assert_eq!(
        odd.status, 200,
        "control characters are a value like another: {odd:?}"
    );
    let empty = put(
        &server,
        &override_body("api", ("tenant", ""), "1", "minute"),
    )
    .await;
    assert_eq!(
        empty.status, 200,
        "an empty value is one a request may send: {empty:?}"
    );
    let mut rls = server.client().await;
    assert_eq!(code(&rls.check("api", &[("tenant", "")]).await), Code::Ok);
    assert_eq!(
        code(&rls.check("api", &[("tenant", "")]).await),
        Code::OverLimit
    );
}
