//! The rate-limit service as its adapters (gRPC, `/json`) see it: the core limiter, how
//! responses are shaped, the state of the rules, and the request-level metrics.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_core::headers::HeaderStyle;
use tollgate_core::{DecideError, Limiter, Rules};

use crate::api::proto::{self, HeaderNames};
use crate::config::rules_status::{RulesStatus, Source};
use crate::ops::metrics::{ErrorKind, Metrics, RuleMetrics};

/// The limiter that serves `ShouldRateLimit`, with metrics of every call.
pub(crate) struct Rls {
    pub(crate) limiter: Limiter<RuleMetrics>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) headers: HeaderStyle,
    /// The reference-style headers' names.
    pub(crate) header_names: HeaderNames,
    /// Answers carry the domain, descriptors and rule metadata as dynamic metadata.
    pub(crate) dynamic_metadata: bool,
    pub(crate) status: RulesStatus,
}

/// Why a request got no answer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RlsError {
    /// No rules yet (xDS with FORCE_START_WITHOUT_INITIAL_CONFIG); the reference's words.
    #[error("no rate limit configuration loaded")]
    NoRules,
    #[error(transparent)]
    Decide(#[from] DecideError),
}

impl Rls {
    /// Decides one Envoy request, counting it in the request metrics.
    pub(crate) async fn should_rate_limit(
        &self,
        req: &RateLimitRequest,
    ) -> Result<RateLimitResponse, RlsError> {
        let started = Instant::now();
        self.metrics.request();
        let result = async {
            if !self.status.readiness().loaded {
                return Err(RlsError::NoRules);
            }
            let request = proto::request(req).map_err(DecideError::from)?;
            let decision = self.limiter.decide(&request).await?;
            let mut response = proto::response(&decision, self.headers, &self.header_names);
            if self.dynamic_metadata {
                response.dynamic_metadata = Some(proto::dynamic_metadata(req, &decision));
            }
            Ok(response)
        }
        .await;
        self.metrics.response_time.observe(started.elapsed());
        if let Err(e) = &result {
            self.metrics.error(match e {
                RlsError::NoRules => ErrorKind::NoConfig,
                RlsError::Decide(DecideError::InvalidArgument(_)) => ErrorKind::InvalidArgument,
                RlsError::Decide(DecideError::Store(_)) => ErrorKind::Store,
            });
        }
        result
    }

    /// Serves `rules` from the next request on, records where they came from, and counts
    /// the load.
    pub(crate) fn install(&self, rules: Rules, source: Source) {
        let domains = rules.domains().count();
        self.limiter.install(rules);
        self.status.record(source, domains);
        self.metrics.config_load_success.inc_by(1);
    }
}
