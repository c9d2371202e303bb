//! Operations: metrics (Prometheus, statsd), the debug port, logs, tracing, shutdown.

use super::flag::Flag as _;
use super::parse::{
    DebugPort, ExporterProtocol, Tags, parse_debug_port, parse_duration, parse_listen_addr,
    parse_protocol, parse_ratio, parse_tags, parse_timeout,
};
use crate::ops::statsd::StatsdConfig;
use clap::builder::RangedU64ValueParser;
use clap::{Args, ValueEnum};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Operations: metrics, reload, shutdown.
#[derive(Debug, Args)]
pub(crate) struct OpsArgs {
    /// Also serve Prometheus metrics on --prometheus-addr (they are always on the HTTP port).
    #[arg(long, env = "USE_PROMETHEUS", default_value_t = false, flag())]
    pub(crate) use_prometheus: bool,
    /// Address of the extra metrics listener; ":9090" means all interfaces.
    #[arg(long, env = "PROMETHEUS_ADDR", default_value = ":9090", value_parser = parse_listen_addr)]
    pub(crate) prometheus_addr: SocketAddr,
    /// Path of the extra metrics listener.
    #[arg(long, env = "PROMETHEUS_PATH", default_value = "/metrics")]
    pub(crate) prometheus_path: String,
    /// Host of the debug port (`/rlconfig`, `/stats`), as the reference's.
    #[arg(long, env = "DEBUG_HOST", default_value = "0.0.0.0")]
    pub(crate) debug_host: IpAddr,
    /// The reference's debug port: `/rlconfig` and `/stats`; `off` serves none, 0 lets the
    /// system choose.
    #[arg(long, env = "DEBUG_PORT", default_value = "6070", value_parser = parse_debug_port)]
    pub(crate) debug_port: DebugPort,
    #[command(flatten)]
    pub(crate) stats: StatsArgs,
    /// Most label sets a `detailed_metric` rule creates, up to 100,000; request values
    /// beyond them are counted under the rule's `key2="other"` series.
    #[arg(long, env = "DETAILED_METRIC_LIMIT", default_value_t = 1_000, value_parser = RangedU64ValueParser::<usize>::new().range(0..=100_000))]
    pub(crate) detailed_metric_limit: usize,
    /// On SIGTERM, fail health checks for this long before closing listeners, so load
    /// balancers stop sending first (5s suits Kubernetes).
    #[arg(long, env = "SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub(crate) shutdown_delay: Duration,
    /// The bearer token `DELETE /counters` and `/overrides` must carry, and `/top` from
    /// beyond loopback; without one, resets and overrides over HTTP are off. Never empty.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) admin_token: Option<String>,
    /// Also show each rule's heaviest keys on /metrics (`tollgate_top_key_requests`).
    /// Off: /metrics needs no token, and keys name clients.
    #[arg(long, env = "METRICS_TOP_KEYS", default_value_t = false, flag())]
    pub(crate) metrics_top_keys: bool,
    /// Most runtime overrides (`PUT /overrides`); past it, a new one is refused.
    #[arg(long, env = "OVERRIDES_MAX", default_value_t = tollgate_core::overrides::DEFAULT_MAX_OVERRIDES, value_parser = RangedU64ValueParser::<usize>::new().range(0..=10_000_000))]
    pub(crate) overrides_max: usize,
    /// With the memory store, keep runtime overrides in this file (written atomically,
    /// read at start) instead of the process alone.
    #[arg(long, env = "OVERRIDES_FILE")]
    pub(crate) overrides_file: Option<std::path::PathBuf>,
}

/// The reference's statsd output. Prometheus on /metrics is always there besides.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// Send the reference's stats to statsd (TCP) every STATS_FLUSH_INTERVAL [default: on
    /// when STATSD_HOST or STATSD_PORT is set]
    #[arg(long, env = "USE_STATSD", flag())]
    pub(crate) use_statsd: Option<bool>,
    /// Send them as DogStatsD (UDP, EXTRA_TAGS as tags) instead.
    #[arg(long, env = "USE_DOG_STATSD", default_value_t = false, flag())]
    pub(crate) use_dog_statsd: bool,
    /// The reference's DogStatsD name rewriting: not supported, refused when set.
    #[arg(
        long,
        env = "USE_DOG_STATSD_MOGRIFIERS",
        default_value = "",
        hide = true
    )]
    pub(crate) use_dog_statsd_mogrifiers: String,
    /// Where statsd listens [default: localhost]
    #[arg(long, env = "STATSD_HOST")]
    pub(crate) statsd_host: Option<String>,
    /// statsd's port [default: 8125]
    #[arg(long, env = "STATSD_PORT")]
    pub(crate) statsd_port: Option<u16>,
    /// Tags on every stat, `key:value,key:value`.
    #[arg(long, env = "EXTRA_TAGS", default_value = "", value_parser = parse_tags)]
    pub(crate) extra_tags: Tags,
    /// How often stats are sent.
    #[arg(long, env = "STATS_FLUSH_INTERVAL", default_value = "10s", value_parser = parse_timeout)]
    pub(crate) stats_flush_interval: Duration,
    /// Send no stats, whatever else says so (Prometheus stays).
    #[arg(long, env = "DISABLE_STATS", default_value_t = false, flag())]
    pub(crate) disable_stats: bool,
}

impl StatsArgs {
    /// Where and how to send stats, if at all.
    pub(crate) fn statsd(&self) -> anyhow::Result<Option<StatsdConfig>> {
        anyhow::ensure!(
            self.use_dog_statsd_mogrifiers.trim().is_empty(),
            "USE_DOG_STATSD_MOGRIFIERS is not supported: DogStatsD stats keep the reference's \
             names, with EXTRA_TAGS as tags; unset it"
        );
        let asked = self.use_dog_statsd
            || self
                .use_statsd
                .unwrap_or(self.statsd_host.is_some() || self.statsd_port.is_some());
        if self.disable_stats || !asked {
            return Ok(None);
        }
        let host = self.statsd_host.as_deref().unwrap_or("localhost");
        Ok(Some(StatsdConfig {
            target: format!("{host}:{}", self.statsd_port.unwrap_or(8125)),
            dog: self.use_dog_statsd,
            tags: {
                let mut tags = self.extra_tags.0.clone();
                tags.sort();
                tags
            },
            interval: self.stats_flush_interval,
        }))
    }
}

/// Logging.
#[derive(Debug, Args)]
pub(crate) struct LogArgs {
    /// Log filter: error, warn, info, debug, trace or off, or a tracing directive
    /// (info,h2=debug); anything else is refused.
    #[arg(long, env = "LOG_LEVEL", default_value = "info", value_parser = crate::config::log_level::parse)]
    pub(crate) log_level: String,
    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub(crate) log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

/// Tracing, with the reference's settings. The collector's address and headers are the
/// OpenTelemetry SDK's: OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_EXPORTER_OTLP_HEADERS.
#[derive(Debug, Args)]
pub(crate) struct TracingArgs {
    /// Export spans of each ShouldRateLimit call (and its Redis round trips) over OTLP.
    #[arg(long, env = "TRACING_ENABLED", default_value_t = false, flag())]
    pub(crate) tracing_enabled: bool,
    /// OTLP over HTTP (protobuf) or gRPC; empty means http, as in the reference.
    #[arg(long, env = "TRACING_EXPORTER_PROTOCOL", default_value = "http", value_parser = parse_protocol)]
    pub(crate) tracing_exporter_protocol: ExporterProtocol,
    /// The spans' service.name.
    #[arg(long, env = "TRACING_SERVICE_NAME", default_value = "RateLimit")]
    pub(crate) tracing_service_name: String,
    /// The spans' service.namespace.
    #[arg(long, env = "TRACING_SERVICE_NAMESPACE", default_value = "")]
    pub(crate) tracing_service_namespace: String,
    /// The spans' service.instance.id [default: a random UUID]
    #[arg(
        long,
        env = "TRACING_SERVICE_INSTANCE_ID",
        default_value = "",
        hide_default_value = true
    )]
    pub(crate) tracing_service_instance_id: String,
    /// Fraction of new traces sampled; a trace Envoy propagates keeps its own decision.
    #[arg(long, env = "TRACING_SAMPLING_RATE", default_value = "1", value_parser = parse_ratio)]
    pub(crate) tracing_sampling_rate: f64,
}
