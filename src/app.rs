//! The application: what every adapter and operation of a running server shares (the core
//! limiter, how answers are shaped, the state of the rules, the metrics), built once from
//! the settings.

use std::sync::Arc;
use std::time::Instant;

use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use tollgate_core::headers::HeaderStyle;
use tollgate_core::{DecideError, Limiter, Options, Rules, Store, StoreError};

use crate::api::proto::{self, HeaderNames};
use crate::config::rules_status::{RulesStatus, Source};
use crate::config::settings::{HeaderFormat, ServeArgs};
use crate::ops::metrics::{ErrorKind, Metrics, RuleMetrics, XdsStats};
use crate::ops::overrides::OverrideRegistry;

/// One running server's shared state: the limiter that serves `ShouldRateLimit`, with
/// metrics of every call.
pub(crate) struct App {
    pub(crate) limiter: Limiter<RuleMetrics>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) headers: HeaderStyle,
    /// The reference-style headers' names.
    pub(crate) header_names: HeaderNames,
    /// Answers carry the domain, descriptors and rule metadata as dynamic metadata.
    pub(crate) dynamic_metadata: bool,
    pub(crate) status: RulesStatus,
    /// Runtime overrides: where they are kept, and their changes.
    pub(crate) overrides: OverrideRegistry,
    /// `/metrics` shows the rules' heaviest keys (`METRICS_TOP_KEYS`).
    pub(crate) top_keys_in_metrics: bool,
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

impl App {
    /// What a request gets told of a store error: the error and the store it came from
    /// (its address, never a password).
    pub(crate) fn store_error(&self, error: &StoreError) -> String {
        format!("{error} ({})", self.limiter.store().name())
    }

    /// The application on `store`, with its metrics (and the xDS stream's, if any), and no
    /// rules yet.
    pub(crate) fn new(args: &ServeArgs, store: Store, xds: Option<Arc<XdsStats>>) -> Self {
        let (mut metrics, rule_metrics) = Metrics::new(
            args.answers.near_limit_ratio,
            args.ops.detailed_metric_limit,
        );
        metrics.watch_store(store.clone());
        let shared = match &store {
            Store::Shared(shared) => Some(shared.clone()),
            _ => None,
        };
        let overrides_gauge = metrics.overrides.clone();
        if let Some(stats) = xds {
            metrics.watch_xds(stats);
        }
        let options = Options {
            defaults: args.rules.defaults(),
            global_shadow_mode: args.answers.shadow_mode,
            quota_mode: args.answers.quota_mode,
            all_or_nothing: args
                .answers
                .stop_cache_key_increment_when_overlimit
                .unwrap_or(!args.rules.reference_mode),
        };
        Self {
            limiter: Limiter::with_recorder(Rules::default(), store, options, rule_metrics),
            metrics: Arc::new(metrics),
            headers: header_style(args),
            header_names: HeaderNames {
                limit: args.answers.limit_limit_header.clone(),
                remaining: args.answers.limit_remaining_header.clone(),
                reset: args.answers.limit_reset_header.clone(),
            },
            dynamic_metadata: args.answers.response_dynamic_metadata,
            status: RulesStatus::new(args.source.healthy_with_at_least_one_config_loaded),
            overrides: OverrideRegistry::new(
                args.ops.overrides_max,
                args.ops.overrides_file.clone(),
                shared,
                args.rules.reference_mode,
                overrides_gauge,
            ),
            top_keys_in_metrics: args.ops.metrics_top_keys,
        }
    }

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

fn header_style(args: &ServeArgs) -> HeaderStyle {
    let answers = &args.answers;
    match (
        answers.limit_response_headers,
        answers.response_headers_format,
    ) {
        (false, _) => HeaderStyle::Off,
        (true, HeaderFormat::Reference) => HeaderStyle::Reference,
        (true, HeaderFormat::Draft) => HeaderStyle::Draft,
    }
}
