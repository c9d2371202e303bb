//! The layer and its service: describe the request, ask the limiter, answer 429 (or gRPC
//! `RESOURCE_EXHAUSTED`) or pass the request on with the RateLimit headers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use tollgate_core::headers::HeaderStyle;
use tollgate_core::{Descriptor, Limiter, Recorder};
use tower_layer::Layer;
use tower_service::Service;

use crate::reply;

/// Turns a request into the descriptors to limit it by; none means not limited.
pub trait Describe<B>: Clone + Send + Sync + 'static {
    /// The descriptors of `req`.
    fn describe(&self, req: &Request<B>) -> Vec<Descriptor<'static>>;
}

impl<B, F> Describe<B> for F
where
    F: Fn(&Request<B>) -> Vec<Descriptor<'static>> + Clone + Send + Sync + 'static,
{
    fn describe(&self, req: &Request<B>) -> Vec<Descriptor<'static>> {
        self(req)
    }
}

/// Limits every request of the services it wraps by the rules of one domain.
pub struct RateLimitLayer<D, R: Recorder = ()> {
    shared: Arc<Shared<R>>,
    describe: D,
}

/// What every clone of the service shares.
struct Shared<R: Recorder> {
    limiter: Arc<Limiter<R>>,
    domain: String,
    headers: HeaderStyle,
    deny_on_error: bool,
}

impl<R: Recorder> Clone for Shared<R> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            domain: self.domain.clone(),
            headers: self.headers,
            deny_on_error: self.deny_on_error,
        }
    }
}

impl<D: Clone, R: Recorder> Clone for RateLimitLayer<D, R> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
            describe: self.describe.clone(),
        }
    }
}

impl<D, R: Recorder> RateLimitLayer<D, R> {
    /// Limits requests by `domain`'s rules in `limiter`, describing each with `describe`.
    /// Responses carry the IETF draft's `RateLimit-Policy` and `RateLimit` headers; a
    /// store failure lets the request through.
    pub fn new(limiter: Arc<Limiter<R>>, domain: impl Into<String>, describe: D) -> Self {
        Self {
            shared: Arc::new(Shared {
                limiter,
                domain: domain.into(),
                headers: HeaderStyle::Draft,
                deny_on_error: false,
            }),
            describe,
        }
    }

    /// Which RateLimit headers responses carry.
    pub fn headers(mut self, style: HeaderStyle) -> Self {
        self.shared_mut().headers = style;
        self
    }

    /// Answer 503 instead of passing the request on when the store fails (Envoy's
    /// `failure_mode_deny`).
    pub fn deny_on_error(mut self, deny: bool) -> Self {
        self.shared_mut().deny_on_error = deny;
        self
    }

    fn shared_mut(&mut self) -> &mut Shared<R> {
        Arc::make_mut(&mut self.shared)
    }
}

impl<S, D: Clone, R: Recorder> Layer<S> for RateLimitLayer<D, R> {
    type Service = RateLimit<S, D, R>;

    fn layer(&self, inner: S) -> Self::Service {
        RateLimit {
            inner,
            shared: self.shared.clone(),
            describe: self.describe.clone(),
        }
    }
}

/// A service limited by a [`RateLimitLayer`].
pub struct RateLimit<S, D, R: Recorder = ()> {
    inner: S,
    shared: Arc<Shared<R>>,
    describe: D,
}

impl<S: Clone, D: Clone, R: Recorder> Clone for RateLimit<S, D, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            describe: self.describe.clone(),
        }
    }
}

/// The body of a limited service's response: the service's own, or the limiter's answer.
pub type LimitedBody<B> = Either<B, Full<Bytes>>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, D, R, ReqBody, ResBody> Service<Request<ReqBody>> for RateLimit<S, D, R>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send,
    D: Describe<ReqBody>,
    R: Recorder,
    ReqBody: Send + 'static,
{
    type Response = Response<LimitedBody<ResBody>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqBody>) -> Self::Future {
        let descriptors = self.describe.describe(&req);
        // The clone that was polled ready serves this request; the fresh one waits.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let shared = self.shared.clone();
        Box::pin(async move {
            if descriptors.is_empty() {
                return inner.call(req).await.map(|r| r.map(Either::Left));
            }
            let grpc = reply::is_grpc(&req);
            let request = tollgate_core::Request::new(shared.domain.as_str(), descriptors);
            let decision = match shared.limiter.decide(&request).await {
                Ok(decision) => decision,
                Err(e) if shared.deny_on_error => {
                    tracing::warn!("rate limit not decided, denying: {e}");
                    return Ok(reply::unavailable(grpc));
                }
                Err(e) => {
                    tracing::warn!("rate limit not decided, letting the request through: {e}");
                    return inner.call(req).await.map(|r| r.map(Either::Left));
                }
            };
            if decision.over_limit {
                return Ok(reply::over_limit(&decision, shared.headers, grpc));
            }
            let mut response = inner.call(req).await?;
            reply::add_headers(response.headers_mut(), &decision, shared.headers);
            Ok(response.map(Either::Left))
        })
    }
}
