//! The limiter's own answers: 429 with `Retry-After`, gRPC `RESOURCE_EXHAUSTED`, 500 when
//! a request cannot be described, 503, and the RateLimit headers on every limited
//! response; and how a denial reads in the log.

use std::fmt;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use tollgate_core::Decision;
use tollgate_core::headers::{HeaderStyle, headers};

use crate::denial::{Denial, DenialBody};
use crate::layer::LimitedBody;

/// gRPC's status code for "rate limited".
const RESOURCE_EXHAUSTED: &str = "8";
/// gRPC's status code for "the server is broken".
const INTERNAL: &str = "13";
/// gRPC's status code for "try again later".
const UNAVAILABLE: &str = "14";

/// Whether `req` is a gRPC call, which must be answered in gRPC's terms.
pub(crate) fn is_grpc<B>(req: &Request<B>) -> bool {
    req.headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// Seconds a denied client waits: enough for every descriptor that denied.
pub(crate) fn retry_after(decision: &Decision) -> u64 {
    decision
        .descriptors
        .iter()
        .filter_map(|o| o.limited().filter(|l| l.is_over()))
        .map(|l| l.reset_seconds())
        .max()
        .unwrap_or(1)
}

/// The answer to a request over its limit: `body` (the service's hook) or ours.
pub(crate) fn over_limit<B>(
    denial: &Denial<'_>,
    style: HeaderStyle,
    grpc: bool,
    body: Option<DenialBody>,
) -> Response<LimitedBody<B>> {
    let mut response = match body {
        _ if grpc => grpc_status(RESOURCE_EXHAUSTED, "rate limit exceeded"),
        Some(DenialBody { content_type, body }) => {
            let mut response = Response::new(Either::Right(Full::new(body)));
            *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
            response.headers_mut().insert(CONTENT_TYPE, content_type);
            response
        }
        None => plain(StatusCode::TOO_MANY_REQUESTS, "rate limit exceeded\n"),
    };
    response
        .headers_mut()
        .insert(RETRY_AFTER, HeaderValue::from(denial.retry_after));
    add_headers(response.headers_mut(), denial.decision, style);
    response
}

/// The answer to a request the describe function could not describe: the service is
/// misconfigured (the log says how); the client learns nothing of its internals.
pub(crate) fn misconfigured<B>(grpc: bool) -> Response<LimitedBody<B>> {
    failure(grpc, Failure::Misconfigured)
}

/// The answer when the limiter could not decide and the layer denies then.
pub(crate) fn unavailable<B>(grpc: bool) -> Response<LimitedBody<B>> {
    failure(grpc, Failure::Unavailable)
}

/// Why the layer answers instead of the service, other than a limit.
#[derive(Clone, Copy)]
enum Failure {
    Misconfigured,
    Unavailable,
}

fn failure<B>(grpc: bool, failure: Failure) -> Response<LimitedBody<B>> {
    let (status, code, text) = match failure {
        Failure::Misconfigured => (
            StatusCode::INTERNAL_SERVER_ERROR,
            INTERNAL,
            "rate limit misconfigured\n",
        ),
        Failure::Unavailable => (
            StatusCode::SERVICE_UNAVAILABLE,
            UNAVAILABLE,
            "rate limit service unavailable\n",
        ),
    };
    if grpc {
        grpc_status(code, text.trim_end())
    } else {
        plain(status, text)
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

/// A request's descriptors for the log: `[remote_address=192.0.2.1, path=/login]`, one
/// list per descriptor.
pub(crate) struct Described<'a>(pub(crate) &'a tollgate_core::Request<'a>);

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, descriptor) in self.0.descriptors.iter().enumerate() {
            f.write_str(if i == 0 { "[" } else { " [" })?;
            for (j, (key, value)) in descriptor.pairs().enumerate() {
                let comma = if j == 0 { "" } else { ", " };
                write!(f, "{comma}{key}={value}")?;
            }
            f.write_str("]")?;
        }
        Ok(())
    }
}

/// The limits that denied, for the log: `"remote_address.path_/login" 3/60s`.
pub(crate) struct OverLimits<'a>(pub(crate) &'a Decision);

impl fmt::Display for OverLimits<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let over = self
            .0
            .descriptors
            .iter()
            .enumerate()
            .filter_map(|(i, o)| o.limited().filter(|l| l.is_over()).map(|l| (i, &l.limit)));
        for (n, (index, limit)) in over.enumerate() {
            let comma = if n == 0 { "" } else { ", " };
            let window = limit.window().as_secs();
            match limit.name() {
                Some(name) => write!(f, "{comma}{name:?}")?,
                None => write!(f, "{comma}descriptor {index}")?,
            }
            write!(f, " {}/{window}s", limit.requests_per_unit())?;
        }
        Ok(())
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
            quota: false,
            remaining: 0,
            reset: Duration::from_millis(reset_ms),
            hits: 1,
            metadata: None,
            group_over: false,
            in_flight: None,
        })
    }

    fn denial(decision: &Decision) -> Denial<'_> {
        Denial {
            domain: "api",
            decision,
            retry_after: retry_after(decision),
        }
    }

    #[test]
    fn a_denial_says_how_long_to_wait_for_every_limit() {
        let decision = Decision {
            over_limit: true,
            descriptors: vec![denied(1_500, 10), Outcome::NoLimit, denied(30_200, 100)],
        };
        let r: Response<LimitedBody<()>> =
            over_limit(&denial(&decision), HeaderStyle::Draft, false, None);
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        let h = r.headers();
        assert_eq!(h[RETRY_AFTER], "31");
        // The headers describe the last limit over, as the reference picks it.
        assert_eq!(h["ratelimit-policy"], "\"per-client\";q=100;w=60");
        assert_eq!(h["ratelimit"], "\"per-client\";r=0;t=31");
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
        let body = Some(DenialBody::json("{}"));
        let r: Response<LimitedBody<()>> =
            over_limit(&denial(&decision), HeaderStyle::Off, true, body);
        assert_eq!(r.status(), StatusCode::OK, "a body hook is for HTTP only");
        assert_eq!(r.headers()["grpc-status"], RESOURCE_EXHAUSTED);
        assert_eq!(r.headers()[RETRY_AFTER], "1");
        assert!(!r.headers().contains_key("ratelimit"));
    }
}
