//! What a request over its limit is answered with over HTTP, when the service wants its
//! own body (JSON errors, say) instead of `rate limit exceeded`.

use bytes::Bytes;
use http::HeaderValue;
use tollgate_core::Decision;

/// A request over its limit, as [`RateLimitLayer::on_limited`](crate::RateLimitLayer::on_limited)
/// sees it.
#[derive(Debug)]
pub struct Denial<'a> {
    /// The rules' domain.
    pub domain: &'a str,
    /// One outcome per descriptor; the denying ones are [`is_over`](tollgate_core::Outcome::is_over).
    /// Unnamed limits carry their rule's place in the rules as their name.
    pub decision: &'a Decision,
    /// Seconds until the request would be admitted: the `Retry-After` header's value.
    pub retry_after: u64,
}

/// The body of a 429 answer and its `Content-Type`; the status, `Retry-After` and the
/// RateLimit headers are the layer's.
#[derive(Debug, Clone)]
pub struct DenialBody {
    /// The `Content-Type` header.
    pub content_type: HeaderValue,
    /// The body.
    pub body: Bytes,
}

impl DenialBody {
    /// A body of type `content_type`.
    pub fn new(content_type: HeaderValue, body: impl Into<Bytes>) -> Self {
        Self {
            content_type,
            body: body.into(),
        }
    }

    /// An `application/json` body.
    pub fn json(body: impl Into<Bytes>) -> Self {
        Self::new(HeaderValue::from_static("application/json"), body)
    }

    /// A `text/plain; charset=utf-8` body.
    pub fn text(body: impl Into<Bytes>) -> Self {
        Self::new(HeaderValue::from_static("text/plain; charset=utf-8"), body)
    }
}
