//! The limiter's own answers: 429 with `Retry-After`, gRPC `RESOURCE_EXHAUSTED`, 503, and
//! the RateLimit headers on every limited response.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use tollgate_core::Decision;
use tollgate_core::headers::{HeaderStyle, headers};

use crate::layer::LimitedBody;

/// gRPC's status code for "rate limited".
const RESOURCE_EXHAUSTED: &str = "8";
/// gRPC's status code for "try again later".
const UNAVAILABLE: &str = "14";

/// Whether `req` is a gRPC call, which must be answered in gRPC's terms.
pub(crate) fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The answer to a request over its limit.
pub(crate) fn over_limit<B>(
    decision: &Decision,
    style: HeaderStyle,
    grpc: bool,
) -> Response<LimitedBody<B>> {
    let mut response = if grpc {
        grpc_status(RESOURCE_EXHAUSTED, "rate limit exceeded")
    } else {
        plain(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded\n")
    };
    // Waiting this long is enough for every descriptor that denied.
    let wait = decision
        .descriptors
        .iter()
        .filter_map(|o| o.limited().filter(|l| l.is_over()))
        .map(|l| l.reset_seconds())
        .max()
        .unwrap_or(1);
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(wait));
    add_headers(response.headers_mut(), decision, style);
    response
}

/// The answer when the limiter could not decide and the layer denies then.
pub(crate) fn unavailable<B>(grpc: bool) -> Response<LimitedBody<B>> {
    if grpc {
        grpc_status(UNAVAILABLE, "rate limit service unavailable")
    } else {
        plain(
            StatusCode::SERVICE_UNAVAILABLE,
            "rate limit service unavailable\n",
        )
    }
}

/// Adds the RateLimit headers of `decision` in `style`.
pub(crate) fn add_headers(map: &mut HeaderMap, decision: &Decision, style: HeaderStyle) {
    for (name, value) in headers(style, decision) {
        // Values are digits and quoted limit names; a name with characters a header cannot
        // hold leaves its header out rather than failing the response.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::try_from(value),
        ) {
            map.insert(name, value);
        }
    }
}

fn plain<B>(status: StatusCode, text: &'static str) -> Response<LimitedBody<B>> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::from_static(
        text.as_bytes(),
    ))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// A trailers-only gRPC response: HTTP 200 whose headers carry the status.
fn grpc_status<B>(code: &'static str, message: &'static str) -> Response<LimitedBody<B>> {
    let mut response = Response::new(Either::Right(Full::new(Bytes::new())));
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("grpc-status", HeaderValue::from_static(code));
    headers.insert("grpc-message", HeaderValue::from_static(message));
    response
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::{Limit, Limited, Outcome, Unit};

    use super::*;

    fn denied(reset_ms: u64, limit: u32) -> Outcome {
        Outcome::Limited(Limited {
            limit: Limit::new(limit, Unit::Minute).with_name("per-client"),
            admitted: false,
            shadow: false,
            remaining: 0,
            reset: Duration::from_millis(reset_ms),
            hits: 1,
            metadata: None,
        })
    }

    #[test]
    fn a_denial_says_how_long_to_wait_for_every_limit() {
        let decision = Decision {
            over_limit: true,
            descriptors: vec![denied(1_500, 10), Outcome::NoLimit, denied(30_200, 100)],
        };
        let r: Response<LimitedBody<()>> = over_limit(&decision, HeaderStyle::Draft, false);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = r.headers();
        assert_eq!(h[RETRY_AFTER], "31");
        assert_eq!(h["ratelimit-policy"], "\"per-client\";q=10;w=60");
        assert_eq!(h["ratelimit"], "\"per-client\";r=0;t=2");
    }

    #[test]
    fn grpc_calls_get_resource_exhausted() {
        let req = Request::post("/pkg.Svc/Call")
            .header(CONTENT_TYPE, "application/grpc+proto")
            .body(())
            .expect("a request");
        assert!(is_grpc(&req));
        let decision = Decision {
            over_limit: true,
            descriptors: vec![denied(900, 1)],
        };
        let r: Response<LimitedBody<()>> = over_limit(&decision, HeaderStyle::Off, true);
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(r.headers()["grpc-status"], RESOURCE_EXHAUSTED);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert!(!r.headers().contains_key("ratelimit"));
    }
}
