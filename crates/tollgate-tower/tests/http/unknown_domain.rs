//! A layer whose domain the rules do not have passes every request unlimited, and says
//! so in the log once.

use tollgate_testkit::http;
use tollgate_tower::core::Descriptor;
use tollgate_tower::{RateLimitLayer, extract};

use crate::logs::Logs;
use crate::{memory_limiter, ok_app, serve};

#[tokio::test]
async fn an_unknown_domain_is_warned_about_once() {
    let logs = Logs::get();
    let limiter = memory_limiter(
        "domain: api\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    let layer = RateLimitLayer::new(limiter, "apl", |req| {
        Ok(vec![Descriptor::from(vec![extract::path(req)])])
    });
    let addr = serve(ok_app().layer(layer)).await;
    for _ in 0..3 {
        let answer = http::get(addr, "/").await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(answer.header("ratelimit"), None, "{answer:?}");
    }
    let warnings = logs.lines_with(&["WARN", "no domain \"apl\""]);
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
}
