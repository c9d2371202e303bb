//! Tollgate's admin endpoints as the tests use them: `POST /explain`, `DELETE /counters`
//! with a bearer token, and the scenario every shared store must pass: a counter over its
//! limit in two instances' local views, reset through one, admitted by the next request
//! on both.

use std::time::Duration;

use serde_json::Value;

use crate::grpc::{Code, code};
use crate::http::{self, Method, Response};
use crate::tollgate::Listening;
use crate::wait;

/// The ADMIN_TOKEN the tests give servers that allow resets.
pub const TOKEN: &str = "test-admin-token-0123";
/// How long an instance may take to hear another's reset.
const HEARD: Duration = Duration::from_secs(10);

/// The `/json` body of one descriptor `key=value` in `domain`.
pub fn body(domain: &str, key: &str, value: &str) -> String {
    format!(
        r#"{{"domain":"{domain}","descriptors":[{{"entries":[{{"key":"{key}","value":"{value}"}}]}}]}}"#
    )
}

/// `POST /explain` of `body`, answered 200, as JSON.
pub async fn explain(server: &Listening, body: &str) -> Value {
    let answer = http::post_json(server.http_addr(), "/explain", body).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    serde_json::from_str(&answer.body).unwrap_or_else(|e| panic!("{e}: {answer:?}"))
}

/// `DELETE /counters` of `body`, with `token` as the bearer token if given.
pub async fn reset(server: &Listening, body: &str, token: Option<&str>) -> Response {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer));
    }
    http::send(
        server.http_addr(),
        Method::DELETE,
        "/counters",
        &headers,
        body,
    )
    .await
    .unwrap_or_else(|e| panic!("DELETE /counters: {e}"))
}

/// Whether `server`'s local view holds the counter of the first descriptor of `body`.
async fn held(server: &Listening, body: &str) -> bool {
    explain(server, body).await["descriptors"][0]["local"]["held"] == true
}

/// `key=value` of `domain` (a limit of `limit`) driven over its limit through `a`, then
/// denied once by `b`, so both local views deny; reset through `a` with [`TOKEN`]; the
/// next request on `a` is admitted, and on `b` once it has dropped its view (which it
/// must do by itself, hearing the reset).
pub async fn assert_reset_reaches_every_instance(
    a: &Listening,
    b: &Listening,
    domain: &str,
    (key, value): (&str, &str),
    limit: usize,
) {
    let body = body(domain, key, value);
    let (mut on_a, mut on_b) = (a.client().await, b.client().await);
    for _ in 0..limit {
        assert_eq!(code(&on_a.check(domain, &[(key, value)]).await), Code::Ok);
    }
    assert_eq!(
        code(&on_a.check(domain, &[(key, value)]).await),
        Code::OverLimit
    );
    assert_eq!(
        code(&on_b.check(domain, &[(key, value)]).await),
        Code::OverLimit
    );
    assert!(
        held(a, &body).await && held(b, &body).await,
        "both views hold the counter"
    );
    let answer = reset(a, &body, Some(TOKEN)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(code(&on_a.check(domain, &[(key, value)]).await), Code::Ok);
    wait::until_async(
        "b drops its view of the reset counter",
        HEARD,
        async || match held(b, &body).await {
            false => Ok(()),
            true => Err("b still holds it".to_owned()),
        },
    )
    .await;
    assert_eq!(code(&on_b.check(domain, &[(key, value)]).await), Code::Ok);
}

/// `method /overrides` (`path` may carry a query) with a JSON `body` and `token` as the
/// bearer token if given.
pub async fn overrides(
    server: &Listening,
    method: Method,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> Response {
    let bearer = token.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(bearer) = &bearer {
        headers.push(("authorization", bearer));
    }
    http::send(server.http_addr(), method.clone(), path, &headers, body)
        .await
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// The `PUT /overrides` body of `requests_per_unit` per `unit` for `key=value` of `domain`.
pub fn override_body(
    domain: &str,
    (key, value): (&str, &str),
    requests_per_unit: &str,
    unit: &str,
) -> String {
    format!(
        r#"{{"domain":"{domain}","entries":[{{"key":"{key}","value":"{value}"}}],"limit":{{"requests_per_unit":{requests_per_unit},"unit":"{unit}"}}}}"#
    )
}
