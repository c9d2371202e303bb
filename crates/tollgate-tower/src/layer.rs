//! The layer and its service: describe the request, ask the limiter, answer 429 (or gRPC
//! `RESOURCE_EXHAUSTED`) or pass the request on with the RateLimit headers.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Either, Full};
use tollgate_core::headers::HeaderStyle;
use tollgate_core::{Decision, Limiter, Outcome, Recorder};
use tower_layer::Layer;
use tower_service::Service;

use crate::denial::{Denial, DenialBody};
use crate::describe::{Describe, DescribeError};
use crate::{policy_names, reply};

/// The hook that writes 429 bodies.
type OnLimited = Arc<dyn Fn(&Denial<'_>) -> DenialBody + Send + Sync>;

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
    on_limited: Option<OnLimited>,
    warned: Arc<Warned>,
}

/// Problems logged once per layer rather than once per request.
#[derive(Default)]
struct Warned {
    unknown_domain: AtomicBool,
    undescribable: AtomicBool,
}

impl<R: Recorder> Clone for Shared<R> {
    fn clone(&self) -> Self {
        Self {
            limiter: self.limiter.clone(),
            domain: self.domain.clone(),
            headers: self.headers,
            deny_on_error: self.deny_on_error,
            on_limited: self.on_limited.clone(),
            warned: self.warned.clone(),
        }
    }
}

impl<R: Recorder> Shared<R> {
    /// Logs, once, that the rules have no domain of this layer's name, when a decision
    /// matched nothing: every request passes unlimited.
    fn check_domain(&self, decision: &Decision) {
        let matched_nothing = decision
            .descriptors
            .iter()
            .all(|o| matches!(o, Outcome::NoLimit));
        if matched_nothing
            && !self.warned.unknown_domain.load(Ordering::Relaxed)
            && self.limiter.rules().domain(&self.domain).is_none()
            && !self.warned.unknown_domain.swap(true, Ordering::Relaxed)
        {
            tracing::warn!(
                domain = %self.domain,
                "the rate-limit rules have no domain {:?}: requests through this layer are not limited",
                self.domain
            );
        }
    }

    /// Logs that a request could not be described: at error level the first time, then
    /// at debug, so that a flood of such requests cannot flood the log.
    fn undescribable(&self, why: &DescribeError) {
        if self.warned.undescribable.swap(true, Ordering::Relaxed) {
            tracing::debug!(domain = %self.domain, "rate limit: answered 500: {why}");
        } else {
            tracing::error!(
                domain = %self.domain,
                "rate limit: answered 500, and will for every request until fixed: {why}"
            );
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
    /// Limits requests by `domain`'s rules in `limiter`, describing each with `describe`
    /// (a closure `|req| …` needs no type on its argument). Responses carry the IETF
    /// draft's `RateLimit-Policy` and `RateLimit` headers; a store failure lets the
    /// request through.
    pub fn new<B>(limiter: Arc<Limiter<R>>, domain: impl Into<String>, describe: D) -> Self
    where
        D: Describe<B>,
    {
        Self {
            shared: Arc::new(Shared {
                limiter,
                domain: domain.into(),
                headers: HeaderStyle::Draft,
                deny_on_error: false,
                on_limited: None,
                warned: Arc::default(),
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

    /// The body of 429 answers, written from the denial (HTTP only: gRPC calls get
    /// `RESOURCE_EXHAUSTED`). The status and headers stay the layer's.
    pub fn on_limited<F>(mut self, body: F) -> Self
    where
        F: Fn(&Denial<'_>) -> DenialBody + Send + Sync + 'static,
    {
        self.shared_mut().on_limited = Some(Arc::new(body));
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
        let described = (self.describe)(&req);
        // The clone that was polled ready serves this request; the fresh one waits.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let shared = self.shared.clone();
        Box::pin(async move {
            let grpc = reply::is_grpc(&req);
            let descriptors = match described {
                Ok(descriptors) => descriptors,
                Err(why) => {
                    shared.undescribable(&why);
                    return Ok(reply::misconfigured(grpc));
                }
            };
            if descriptors.is_empty() {
                return inner.call(req).await.map(|r| r.map(Either::Left));
            }
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
            shared.check_domain(&decision);
            let decision = {
                let rules = shared.limiter.rules();
                policy_names::by_rule_path(&decision, &request, &rules)
            };
            if decision.over_limit {
                let denial = Denial {
                    domain: &shared.domain,
                    decision: &decision,
                    retry_after: reply::retry_after(&decision),
                };
                tracing::debug!(
                    domain = %shared.domain,
                    descriptors = %reply::Described(&request),
                    retry_after = denial.retry_after,
                    "rate limited by {}",
                    reply::OverLimits(&decision)
                );
                let body = match (&shared.on_limited, grpc) {
                    (Some(hook), false) => Some(hook(&denial)),
                    _ => None,
                };
                return Ok(reply::over_limit(&denial, shared.headers, grpc, body));
            }
            let mut response = inner.call(req).await?;
            reply::add_headers(response.headers_mut(), &decision, shared.headers);
            Ok(response.map(Either::Left))
        })
    }
}
