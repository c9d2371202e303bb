//! The 429 body hook: the service's JSON, with the layer's status and headers, the
//! policy named by its rule; and the denial's debug log line.

use tollgate_testkit::http;
use tollgate_tower::core::Descriptor;
use tollgate_tower::{DenialBody, RateLimitLayer, extract};

use crate::logs::Logs;
use crate::{memory_limiter, ok_app, serve};

#[tokio::test]
async fn denials_get_the_services_body_and_a_debug_line() {
    let logs = Logs::get();
    let limiter = memory_limiter(
        "domain: hooked\ndescriptors:\n  - key: x-api-key\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    let layer = RateLimitLayer::new(limiter, "hooked", |req| {
        Ok(extract::header(req, "x-api-key")
            .map(|key| vec![Descriptor::from(vec![key])])
            .unwrap_or_default())
    })
    .on_limited(|denial| {
        let policy = denial
            .decision
            .descriptors
            .iter()
            .find_map(|o| o.limited().filter(|l| l.is_over()))
            .and_then(|l| l.limit.name())
            .unwrap_or_default();
        DenialBody::json(format!(
            r#"{{"error":"rate limited","policy":"{policy}","retry_after":{}}}"#,
            denial.retry_after
        ))
    });
    let addr = serve(ok_app().layer(layer)).await;
    let key = [("x-api-key", "k1")];
    assert_eq!(http::get_with(addr, "/", &key).await.status, 200);
    let denied = http::get_with(addr, "/", &key).await;
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(denied.header("content-type"), Some("application/json"));
    let wait = denied.header_u64("retry-after");
    assert!(wait > 0, "{denied:?}");
    assert_eq!(
        denied.body,
        format!(r#"{{"error":"rate limited","policy":"x-api-key","retry_after":{wait}}}"#)
    );
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"x-api-key\";q=1;w=60")
    );
    let lines = logs.lines_with(&["DEBUG", "domain=hooked", "rate limited by"]);
    assert_eq!(lines.len(), 1, "{lines:#?}");
    assert!(
        lines[0].contains("descriptors=[x-api-key=k1]")
            && lines[0].contains("\"x-api-key\" 1/60s")
            && lines[0].contains(&format!("retry_after={wait}")),
        "{}",
        lines[0]
    );
}
