//! The rate-limit service as its adapters (gRPC, `/json`) see it: the core limiter, how
//! responses are shaped, and the request-level metrics.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_core::headers::HeaderStyle;
use tollgate_core::{DecideError, Limiter};

use crate::metrics::{Metrics, RuleMetrics};
use crate::proto;

/// The limiter that serves `ShouldRateLimit`, with metrics of every call.
pub(crate) struct Rls {
    pub(crate) limiter: Limiter<RuleMetrics>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) headers: HeaderStyle,
}

impl Rls {
    /// Decides one Envoy request, counting it in the request metrics.
    pub(crate) async fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, DecideError> {
        let started = Instant::now();
        self.metrics.request();
        let result = async {
            let request = proto::request(req)?;
            let decision = self.limiter.decide(&request).await?;
            Ok(proto::response(&decision, self.headers))
        }
        .await;
        self.metrics.response_time.observe(started.elapsed());
        if let Err(e) = &result {
            self.metrics.error(match e {
                DecideError::InvalidArgument(_) => "invalid_argument",
                DecideError::Store(_) => "store",
            });
        }
        result
    }
}
