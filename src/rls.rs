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
    /// Answers carry the domain, descriptors and rule metadata as dynamic metadata.
    pub(crate) dynamic_metadata: bool,
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
            let mut response = proto::response(&decision, self.headers);
            if self.dynamic_metadata {
                response.dynamic_metadata = Some(proto::dynamic_metadata(req, &decision));
            }
            Ok(response)
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
