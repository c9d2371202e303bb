//! Command line and environment: every setting is a flag and an environment variable, with
//! the reference service's variable names where it has one.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use tollgate_core::rules::RulesBuilder;

use crate::listen::ConnLimits;
use crate::statsd::StatsdConfig;
use crate::tls::ServerTlsFiles;
use tollgate_core::store::redis::RedisKind;
use tollgate_core::{AlgorithmKind, Calendar, Capacity, Defaults, OnStoreError, Unit};

/// Tollgate: an Envoy-compatible external rate-limit service.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve the rate-limit API (gRPC) and the admin endpoints (HTTP).
    Serve(Box<ServeArgs>),
    /// Send one ShouldRateLimit request and print the answer (exit 2 if over the limit).
    Client(ClientArgs),
    /// Create or update the PostgreSQL schema (serving does this too), print its version.
    Migrate(PostgresArgs),
    /// Validate rules: print every problem and exit 1, or print "ok".
    CheckConfig {
        /// A rules file or a directory of *.yaml / *.yml files.
        path: PathBuf,
        #[command(flatten)]
        rules: RuleArgs,
    },
}

/// Settings of `tollgate client`.
#[derive(Debug, Args)]
pub(crate) struct ClientArgs {
    /// Tollgate's gRPC address.
    #[arg(long, env = "TOLLGATE_ADDR", default_value = "127.0.0.1:8081")]
    pub(crate) addr: String,
    /// Rate-limit domain.
    #[arg(long)]
    pub(crate) domain: String,
    /// A descriptor as key=value[,key2=value2…], ending in ;hits=N for its own
    /// hits_addend (0: check without counting); repeat for several.
    #[arg(long, required = true)]
    pub(crate) descriptor: Vec<String>,
    /// Hits to count (request-level hits_addend), for descriptors without ;hits=N.
    #[arg(long, default_value_t = 1)]
    pub(crate) hits: u32,
    #[command(flatten)]
    pub(crate) tls: ClientTlsArgs,
}

/// TLS of `tollgate client`: on when any of these is given.
#[derive(Debug, Args)]
pub(crate) struct ClientTlsArgs {
    /// Connect over TLS, trusting the system's root certificates (or --tls-ca).
    #[arg(long, env = "TOLLGATE_TLS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) tls: bool,
    /// TLS, trusting only this CA (PEM) for the server's certificate.
    #[arg(long, env = "TOLLGATE_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// TLS, presenting this client certificate chain (PEM) for mutual TLS; with --tls-key.
    #[arg(long, env = "TOLLGATE_TLS_CERT", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); with --tls-cert.
    #[arg(long, env = "TOLLGATE_TLS_KEY", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// TLS, checking that the server's certificate carries this name [default: the host
    /// of --addr].
    #[arg(long, env = "TOLLGATE_TLS_SERVER_NAME")]
    pub(crate) tls_server_name: Option<String>,
}

impl ClientTlsArgs {
    /// Whether the client connects over TLS.
    pub(crate) fn enabled(&self) -> bool {
        self.tls
            || self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_server_name.is_some()
    }
}

/// Settings of `tollgate serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Rules file or directory [default: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY]
    #[arg(long, env = "TOLLGATE_CONFIG")]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) runtime: RuntimeArgs,
    /// gRPC listen address [default: GRPC_HOST:GRPC_PORT]
    #[arg(long, env = "GRPC_ADDR")]
    pub(crate) grpc_addr: Option<SocketAddr>,
    /// gRPC listen host, when --grpc-addr is not given.
    #[arg(long, env = "GRPC_HOST", default_value = "0.0.0.0")]
    pub(crate) grpc_host: IpAddr,
    /// gRPC listen port, when --grpc-addr is not given.
    #[arg(long, env = "GRPC_PORT", default_value_t = 8081)]
    pub(crate) grpc_port: u16,
    /// HTTP listen address: /healthcheck, /json, /metrics, /rlconfig [default: HOST:PORT]
    #[arg(long, env = "HTTP_ADDR")]
    pub(crate) http_addr: Option<SocketAddr>,
    /// HTTP listen host, when --http-addr is not given.
    #[arg(long = "host", env = "HOST", default_value = "0.0.0.0")]
    pub(crate) http_host: IpAddr,
    /// HTTP listen port, when --http-addr is not given.
    #[arg(long = "port", env = "PORT", default_value_t = 8080)]
    pub(crate) http_port: u16,
    /// Most counters kept in memory (the memory store, or the local view of Redis or
    /// PostgreSQL); past it, expired counters are evicted first, else of 8 sampled the one
    /// using the least of its limit (the eviction that forgives the fewest requests).
    #[arg(long, env = "MAX_COUNTERS", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) max_counters: u64,
    /// Most memory counters take (the memory store, or the local view of Redis or
    /// PostgreSQL), e.g. 256MiB, 1GiB; past it counters are evicted as for --max-counters.
    /// Bounds memory whatever the keys' length and the limits' precision.
    #[arg(long, env = "MAX_COUNTER_MEMORY", default_value = "256MiB", value_parser = parse_bytes)]
    pub(crate) max_counter_memory: u64,
    #[command(flatten)]
    pub(crate) source: SourceArgs,
    #[command(flatten)]
    pub(crate) rules: RuleArgs,
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    #[command(flatten)]
    pub(crate) answers: AnswerArgs,
    #[command(flatten)]
    pub(crate) ops: OpsArgs,
    #[command(flatten)]
    pub(crate) conn: ConnArgs,
    #[command(flatten)]
    pub(crate) tls: TlsArgs,
    #[command(flatten)]
    pub(crate) rlqs: RlqsArgs,
    #[command(flatten)]
    pub(crate) log: LogArgs,
    #[command(flatten)]
    pub(crate) tracing: TracingArgs,
}

impl ServeArgs {
    pub(crate) fn capacity(&self) -> Capacity {
        Capacity {
            counters: usize::try_from(self.max_counters).unwrap_or(usize::MAX),
            bytes: usize::try_from(self.max_counter_memory).unwrap_or(usize::MAX),
        }
    }

    pub(crate) fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
            .unwrap_or(SocketAddr::new(self.grpc_host, self.grpc_port))
    }

    pub(crate) fn http_addr(&self) -> SocketAddr {
        self.http_addr
            .unwrap_or(SocketAddr::new(self.http_host, self.http_port))
    }

    pub(crate) fn config_path(&self) -> PathBuf {
        self.config.clone().unwrap_or_else(|| {
            let r = &self.runtime;
            let root = match &r.runtime_subdirectory {
                Some(sub) => r.runtime_root.join(sub),
                None => r.runtime_root.clone(),
            };
            root.join(&r.runtime_appdirectory)
        })
    }
}

/// Where rules come from and when they count as loaded.
#[derive(Debug, Args)]
pub(crate) struct SourceArgs {
    /// Rules source: FILE (the rules path, watched) or GRPC_XDS_SOTW (pushed by an xDS
    /// management server, as Envoy Gateway does).
    #[arg(long, env = "CONFIG_TYPE", value_enum, default_value_t = ConfigType::File)]
    pub(crate) config_type: ConfigType,
    /// xDS: serve before the first rules arrive, answering ShouldRateLimit with an error
    /// until then (otherwise the ports open only once rules are in force).
    #[arg(long, env = "FORCE_START_WITHOUT_INITIAL_CONFIG", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) force_start_without_initial_config: bool,
    /// Health checks fail until rules with at least one domain are loaded, and again
    /// whenever a load leaves none.
    #[arg(long, env = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) healthy_with_at_least_one_config_loaded: bool,
    #[command(flatten)]
    pub(crate) xds: XdsArgs,
}

/// The reference's `CONFIG_TYPE` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum ConfigType {
    #[value(name = "FILE")]
    File,
    #[value(name = "GRPC_XDS_SOTW")]
    GrpcXdsSotw,
}

/// The xDS client (CONFIG_TYPE=GRPC_XDS_SOTW), with the reference's settings.
#[derive(Debug, Args)]
pub(crate) struct XdsArgs {
    /// Management server: host:port (http, or https with --xds-use-tls), or a URL.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_URL",
        default_value = "localhost:18000"
    )]
    pub(crate) xds_server_url: String,
    /// Node id sent to the management server (its snapshots are keyed by it).
    #[arg(long, env = "CONFIG_GRPC_XDS_NODE_ID", default_value = "default")]
    pub(crate) xds_node_id: String,
    /// Node metadata as key=value[,key=value…] (string fields of Node.metadata).
    #[arg(long, env = "CONFIG_GRPC_XDS_NODE_METADATA", default_value = "")]
    pub(crate) xds_node_metadata: String,
    /// Extra gRPC metadata on the stream, as key:value[,key:value…].
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", default_value = "", value_parser = parse_header_map)]
    pub(crate) xds_additional_headers: HeaderMap,
    /// Wait between attempts to reach the management server.
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL", default_value = "3s", value_parser = parse_timeout)]
    pub(crate) xds_connect_retry_interval: Duration,
    /// First wait before opening a new stream after one ended.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", default_value = "10s", value_parser = parse_timeout)]
    pub(crate) xds_backoff_initial_interval: Duration,
    /// Longest wait between streams (the wait doubles from the initial one up to this).
    #[arg(long, env = "XDS_CLIENT_BACKOFF_MAX_INTERVAL", default_value = "60s", value_parser = parse_timeout)]
    pub(crate) xds_backoff_max_interval: Duration,
    /// Spread of the jitter: each wait is drawn within ± this fraction of it.
    #[arg(long, env = "XDS_CLIENT_BACKOFF_RANDOM_FACTOR", default_value_t = 0.5, value_parser = parse_ratio)]
    pub(crate) xds_backoff_random_factor: f64,
    /// Randomise the waits (so that many instances do not reconnect in step).
    #[arg(long, env = "XDS_CLIENT_BACKOFF_JITTER", default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) xds_backoff_jitter: bool,
    /// Largest xDS response accepted, in bytes; 0 keeps gRPC's 4 MiB.
    #[arg(long, env = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", default_value_t = 0)]
    pub(crate) xds_max_msg_size: usize,
    /// Talk TLS to the management server.
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_USE_TLS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) xds_use_tls: bool,
    /// Client certificate (PEM) presented to the management server.
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_TLS_CERT")]
    pub(crate) xds_client_tls_cert: Option<PathBuf>,
    /// Key (PEM) of the client certificate.
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_TLS_KEY")]
    pub(crate) xds_client_tls_key: Option<PathBuf>,
    /// CA bundle (PEM) trusted for the management server, besides the system roots.
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_TLS_CACERT")]
    pub(crate) xds_server_tls_cacert: Option<PathBuf>,
    /// Name the management server's certificate must carry [default: the URL's host]
    #[arg(long, env = "CONFIG_GRPC_XDS_SERVER_TLS_SAN")]
    pub(crate) xds_server_tls_san: Option<String>,
}

/// Header names and values, in the order given.
pub(crate) type HeaderMap = Vec<(String, String)>;

/// `key:value[,key:value…]`, the reference's (envconfig's) map form; empty is none.
fn parse_header_map(text: &str) -> Result<HeaderMap, String> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| match item.split_once(':') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_ascii_lowercase(), value.trim().to_owned()))
            }
            _ => Err(format!("'{item}' is not a header like key:value")),
        })
        .collect()
}

/// How answers are shaped beyond what the rules say.
#[derive(Debug, Args)]
pub(crate) struct AnswerArgs {
    /// Hits above this fraction of a limit are counted as near_limit in metrics.
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_ratio)]
    pub(crate) near_limit_ratio: f64,
    /// Never deny: the overall answer is OK while statuses still say OVER_LIMIT.
    #[arg(long, env = "SHADOW_MODE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) shadow_mode: bool,
    /// Add rate-limit headers for Envoy to return to clients.
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) limit_response_headers: bool,
    /// Name of the reference-style header of the limit.
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = parse_header_name)]
    pub(crate) limit_limit_header: String,
    /// Name of the reference-style header of what remains.
    #[arg(long, env = "LIMIT_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = parse_header_name)]
    pub(crate) limit_remaining_header: String,
    /// Name of the reference-style header of the seconds until the reset.
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = parse_header_name)]
    pub(crate) limit_reset_header: String,
    /// Header style: the reference's RateLimit-Limit/-Remaining/-Reset, or the IETF
    /// draft's RateLimit-Policy and RateLimit.
    #[arg(long, env = "RESPONSE_HEADERS_FORMAT", value_enum, default_value_t = HeaderFormat::Reference)]
    pub(crate) response_headers_format: HeaderFormat,
    /// Every descriptor is a budget (the reference's global quota mode): the request is
    /// denied only when all its descriptors are over, and consumption is charged.
    #[arg(long, env = "QUOTA_MODE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) quota_mode: bool,
    /// Return the domain, the descriptors and the merged metadata of the descriptors that
    /// are not over in the response's dynamic metadata, for Envoy to route on.
    #[arg(long, env = "RESPONSE_DYNAMIC_METADATA", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) response_dynamic_metadata: bool,
    /// A request over on one descriptor counts nothing on its others (they are given back).
    #[arg(long, env = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) stop_cache_key_increment_when_overlimit: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum HeaderFormat {
    Reference,
    Draft,
}

/// Operations: metrics, reload, shutdown.
#[derive(Debug, Args)]
pub(crate) struct OpsArgs {
    /// Also serve Prometheus metrics on --prometheus-addr (they are always on the HTTP port).
    #[arg(long, env = "USE_PROMETHEUS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
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
    /// Most label sets a `detailed_metric` rule creates; request values beyond them are
    /// counted under the rule's `key2="other"` series.
    #[arg(long, env = "DETAILED_METRIC_LIMIT", default_value_t = 1_000)]
    pub(crate) detailed_metric_limit: usize,
    /// On SIGTERM, fail health checks for this long before closing listeners, so load
    /// balancers stop sending first (5s suits Kubernetes).
    #[arg(long, env = "SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub(crate) shutdown_delay: Duration,
}

/// The reference's statsd output. Prometheus on /metrics is always there besides.
#[derive(Debug, Args)]
pub(crate) struct StatsArgs {
    /// Send the reference's stats to statsd (TCP) every STATS_FLUSH_INTERVAL [default: on
    /// when STATSD_HOST or STATSD_PORT is set]
    #[arg(long, env = "USE_STATSD", action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) use_statsd: Option<bool>,
    /// Send them as DogStatsD (UDP, EXTRA_TAGS as tags) instead.
    #[arg(long, env = "USE_DOG_STATSD", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) use_dog_statsd: bool,
    /// The reference's DogStatsD name rewriting: not supported, refused when set.
    #[arg(
        long,
        env = "USE_DOG_STATSD_MOGRIFIERS",
        default_value = "",
        hide = true
    )]
    pub(crate) use_dog_statsd_mogrifiers: String,
    /// Where statsd listens.
    #[arg(long, env = "STATSD_HOST")]
    pub(crate) statsd_host: Option<String>,
    /// statsd's port.
    #[arg(long, env = "STATSD_PORT")]
    pub(crate) statsd_port: Option<u16>,
    /// Tags on every stat, `key:value,key:value`.
    #[arg(long, env = "EXTRA_TAGS", default_value = "", value_parser = parse_tags)]
    pub(crate) extra_tags: Tags,
    /// How often stats are sent.
    #[arg(long, env = "STATS_FLUSH_INTERVAL", default_value = "10s", value_parser = parse_timeout)]
    pub(crate) stats_flush_interval: Duration,
    /// Send no stats, whatever else says so (Prometheus stays).
    #[arg(long, env = "DISABLE_STATS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
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
            tags: self.extra_tags.0.clone(),
            interval: self.stats_flush_interval,
        }))
    }
}

/// `EXTRA_TAGS`: `key:value` pairs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Tags(pub(crate) Vec<(String, String)>);

fn parse_tags(text: &str) -> Result<Tags, String> {
    let mut tags = Vec::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once(':')
            .ok_or_else(|| format!("'{pair}' is not key:value"))?;
        if key.trim().is_empty() {
            return Err(format!("'{pair}' has an empty key"));
        }
        tags.push((key.trim().to_owned(), value.trim().to_owned()));
    }
    Ok(Tags(tags))
}

/// An HTTP header name.
fn parse_header_name(text: &str) -> Result<String, String> {
    http::HeaderName::from_bytes(text.as_bytes())
        .map(|_| text.to_owned())
        .map_err(|_| format!("'{text}' is not an HTTP header name"))
}

/// The debug port, if one is served.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DebugPort(pub(crate) Option<u16>);

/// A port number, or `off`.
fn parse_debug_port(text: &str) -> Result<DebugPort, String> {
    match text.trim() {
        t if t.eq_ignore_ascii_case("off") => Ok(DebugPort(None)),
        t => t
            .parse::<u16>()
            .map(|port| DebugPort(Some(port)))
            .map_err(|_| format!("'{t}' is not a port number (0-65535) or off")),
    }
}

/// The Rate Limit Quota Service.
#[derive(Debug, Args)]
pub(crate) struct RlqsArgs {
    /// A bucket that reports no request for this long is abandoned (Envoy forgets it and
    /// subscribes again at its next request).
    #[arg(long, env = "RLQS_BUCKET_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_timeout)]
    pub(crate) rlqs_bucket_idle_timeout: Duration,
    /// What a bucket that matches no rule gets: allow (all requests) or deny (all).
    #[arg(
        long,
        env = "RLQS_NO_RULE_ACTION",
        value_enum,
        ignore_case = true,
        default_value = "allow"
    )]
    pub(crate) rlqs_no_rule_action: NoRuleAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum NoRuleAction {
    Allow,
    Deny,
}

/// What a connection may hold and how long it may idle, on every port.
#[derive(Debug, Args)]
pub(crate) struct ConnArgs {
    /// Close a connection with no traffic either way for this long (Envoy reconnects).
    #[arg(long, env = "CONNECTION_IDLE_TIMEOUT", default_value = "3600s", value_parser = parse_timeout)]
    pub(crate) connection_idle_timeout: Duration,
    /// An HTTP/1 request's headers must arrive within this.
    #[arg(long, env = "HTTP_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_timeout)]
    pub(crate) http_header_read_timeout: Duration,
    /// Connections open at once per port; more wait until one closes.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 4_096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) max_connections: u64,
    /// Concurrent gRPC calls per connection.
    #[arg(long, env = "GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 128)]
    pub(crate) grpc_max_concurrent_streams: u32,
    /// Largest gRPC request accepted, in bytes; with the stream limit it bounds what one
    /// connection can make Tollgate buffer.
    #[arg(long, env = "GRPC_MAX_MESSAGE_BYTES", default_value_t = 65_536)]
    pub(crate) grpc_max_message_bytes: usize,
    /// A gRPC connection older than this is asked to close (HTTP/2 GOAWAY) once its calls
    /// finish, so that clients reconnect and spread over new replicas.
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE", default_value = "24h", value_parser = parse_timeout)]
    pub(crate) grpc_max_connection_age: Duration,
    /// How long calls on an aged connection get to finish before it is closed.
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "1h", value_parser = parse_timeout)]
    pub(crate) grpc_max_connection_age_grace: Duration,
    /// Ping a gRPC client after this long without traffic, to find dead connections.
    #[arg(long, env = "GRPC_KEEPALIVE_TIME", default_value = "2h", value_parser = parse_timeout)]
    pub(crate) grpc_keepalive_time: Duration,
    /// Close a connection whose ping is not answered within this.
    #[arg(long, env = "GRPC_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = parse_timeout)]
    pub(crate) grpc_keepalive_timeout: Duration,
}

impl ConnArgs {
    pub(crate) fn limits(&self) -> ConnLimits {
        ConnLimits {
            idle: self.connection_idle_timeout,
            header_read: self.http_header_read_timeout,
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            lifetime: None,
        }
    }

    /// The gRPC port's limits: those of every port, and a lifetime of age plus grace.
    pub(crate) fn grpc_limits(&self) -> ConnLimits {
        ConnLimits {
            lifetime: Some(
                self.grpc_max_connection_age
                    .saturating_add(self.grpc_max_connection_age_grace),
            ),
            ..self.limits()
        }
    }
}

/// TLS on the ports, with the reference's names. Certificate, key and client CA are
/// reloaded when their files change.
#[derive(Debug, Args)]
pub(crate) struct TlsArgs {
    /// Serve gRPC over TLS with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY.
    #[arg(long, env = "GRPC_SERVER_USE_TLS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) grpc_server_use_tls: bool,
    /// The server's certificate chain (PEM).
    #[arg(long, env = "GRPC_SERVER_TLS_CERT")]
    pub(crate) grpc_server_tls_cert: Option<PathBuf>,
    /// The server's private key (PEM).
    #[arg(long, env = "GRPC_SERVER_TLS_KEY")]
    pub(crate) grpc_server_tls_key: Option<PathBuf>,
    /// Require gRPC clients to present a certificate this CA signed (mTLS).
    #[arg(long, env = "GRPC_CLIENT_TLS_CACERT")]
    pub(crate) grpc_client_tls_cacert: Option<PathBuf>,
    /// Envoy Gateway's name for GRPC_CLIENT_TLS_CACERT (the reference ignores it; here it
    /// enforces the mTLS Envoy Gateway intends).
    #[arg(long, env = "GRPC_SERVER_TLS_CA_CERT")]
    pub(crate) grpc_server_tls_ca_cert: Option<PathBuf>,
    /// Client certificates must name one of these, as a DNS or URI (SPIFFE ID) subject
    /// alternative name; comma-separated. Needs a client CA.
    #[arg(long, env = "GRPC_CLIENT_TLS_SAN", value_delimiter = ',')]
    pub(crate) grpc_client_tls_san: Vec<String>,
    /// Serve the HTTP port (health, /json, /metrics) over TLS too, with the same
    /// certificate; it asks clients for no certificate, so probes keep working.
    #[arg(long, env = "HTTP_SERVER_USE_TLS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) http_server_use_tls: bool,
}

impl TlsArgs {
    /// The files server TLS is made of, when a port uses TLS. Settings that would leave a
    /// port less secure than asked (a client CA or SAN that would not be enforced) are
    /// errors, not silent no-ops.
    pub(crate) fn files(&self) -> anyhow::Result<Option<ServerTlsFiles>> {
        let client_ca = match (&self.grpc_client_tls_cacert, &self.grpc_server_tls_ca_cert) {
            (Some(a), Some(b)) if a != b => anyhow::bail!(
                "GRPC_CLIENT_TLS_CACERT ({}) and GRPC_SERVER_TLS_CA_CERT ({}) name different \
                 client CAs; they are one setting, give one",
                a.display(),
                b.display()
            ),
            (a, b) => a.as_ref().or(b.as_ref()).cloned(),
        };
        let sans: Vec<String> = self
            .grpc_client_tls_san
            .iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        anyhow::ensure!(
            sans.is_empty() || client_ca.is_some(),
            "GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT: without a client CA no client \
             certificate is asked for, so the name could not be checked"
        );
        if !self.grpc_server_use_tls {
            anyhow::ensure!(
                client_ca.is_none(),
                "a client CA (GRPC_CLIENT_TLS_CACERT / GRPC_SERVER_TLS_CA_CERT) needs \
                 GRPC_SERVER_USE_TLS=true: clients cannot be verified over plaintext"
            );
            anyhow::ensure!(
                !self.http_server_use_tls,
                "HTTP_SERVER_USE_TLS uses the gRPC port's certificate: set \
                 GRPC_SERVER_USE_TLS=true with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
            );
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&self.grpc_server_tls_cert, &self.grpc_server_tls_key)
        else {
            anyhow::bail!(
                "GRPC_SERVER_USE_TLS=true needs both GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
            );
        };
        Ok(Some(ServerTlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca,
            client_names: sans,
        }))
    }
}

/// Where counters live and what happens when that place fails.
#[derive(Debug, Args)]
pub(crate) struct StoreArgs {
    /// Counter store [default: redis if --redis-url is set, postgres if --postgres-url is,
    /// else memory]
    #[arg(long, env = "BACKEND_TYPE", value_enum, ignore_case = true)]
    pub(crate) backend: Option<Backend>,
    /// Redis address(es): redis://[user:password@]host:port, rediss://…, or the reference's
    /// forms: host:port; for cluster a comma-separated node list; for sentinel
    /// "master-name,sentinel-host:port,…".
    #[arg(long, env = "REDIS_URL")]
    pub(crate) redis_url: Option<String>,
    /// Redis deployment: single, cluster or sentinel.
    #[arg(long, env = "REDIS_TYPE", ignore_case = true, default_value = "single", value_parser = one_of::<RedisKind>(&["single", "cluster", "sentinel"]))]
    pub(crate) redis_type: RedisKind,
    /// Redis password, or "user:password", for addresses without credentials.
    #[arg(long, env = "REDIS_AUTH", hide_env_values = true)]
    pub(crate) redis_auth: Option<String>,
    /// Connect to Redis over TLS (host:port forms; a rediss:// URL implies it).
    #[arg(long, env = "REDIS_TLS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) redis_tls: bool,
    /// Client certificate (PEM) presented to Redis over TLS (`tls-auth-clients yes`).
    #[arg(long, env = "REDIS_TLS_CLIENT_CERT")]
    pub(crate) redis_tls_client_cert: Option<PathBuf>,
    /// Its private key (PEM).
    #[arg(long, env = "REDIS_TLS_CLIENT_KEY")]
    pub(crate) redis_tls_client_key: Option<PathBuf>,
    /// CA (PEM) that signed Redis's certificates, trusted instead of the system's roots.
    #[arg(long, env = "REDIS_TLS_CACERT")]
    pub(crate) redis_tls_cacert: Option<PathBuf>,
    /// Verify Redis's certificate chain but not the name in it (single and cluster).
    #[arg(long, env = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) redis_tls_skip_hostname_verification: bool,
    #[command(flatten)]
    pub(crate) postgres: PostgresArgs,
    /// Prefix of every counter key (Redis or PostgreSQL).
    #[arg(long, env = "CACHE_KEY_PREFIX", default_value = "")]
    pub(crate) cache_key_prefix: String,
    /// Longest a request waits for the store, e.g. 10ms, 250us, 1s [default: 10ms; in
    /// reference mode, --redis-timeout]
    #[arg(long, env = "STORE_TIMEOUT", value_parser = parse_timeout)]
    pub(crate) store_timeout: Option<Duration>,
    /// The reference's Redis timeout: the store timeout in reference mode, unless
    /// --store-timeout is given.
    #[arg(long, env = "REDIS_TIMEOUT", default_value = "10s", value_parser = parse_timeout)]
    pub(crate) redis_timeout: Duration,
    /// Reference mode: each key lives its window plus up to this many seconds, drawn at
    /// random, so that keys of one window do not expire all at once (the reference's).
    #[arg(long, env = "EXPIRATION_JITTER_MAX_SECONDS", default_value_t = 300)]
    pub(crate) expiration_jitter_max_seconds: u64,
    /// Reference mode: memory for keys known to be over their limit, answered without
    /// Redis until their window ends (the reference's local cache; 0: none).
    #[arg(long, env = "LOCAL_CACHE_SIZE_IN_BYTES", default_value_t = 0)]
    pub(crate) local_cache_size_in_bytes: usize,
    /// How long startup waits for the store's first answer before serving without it (a
    /// fresh instance deciding from an empty local view would over-admit meanwhile).
    #[arg(long, env = "STORE_STARTUP_WAIT", default_value = "3s", value_parser = parse_duration)]
    pub(crate) store_startup_wait: Duration,
    /// What a request gets when the store fails or times out: a decision from the local
    /// view (local), OK (allow), OVER_LIMIT (deny), or gRPC UNAVAILABLE (error), so that
    /// Envoy's failure_mode_deny decides [default: local; in reference mode, error]
    #[arg(long, env = "ON_STORE_ERROR", ignore_case = true, value_parser = one_of::<OnStoreError>(&["local", "allow", "deny", "error"]))]
    pub(crate) on_store_error: Option<OnStoreError>,
    /// Hot counters take blocks of their limit from the shared store in one call and
    /// admit from them locally (README, Leases).
    #[arg(long, env = "LEASES", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) leases: bool,
    /// The largest block a counter leases, as a fraction of its smallest limit (above 0,
    /// at most 0.5).
    #[arg(long, env = "LEASE_MAX_FRACTION", default_value = "0.01", value_parser = parse_lease_fraction)]
    pub(crate) lease_max_fraction: f64,
}

impl StoreArgs {
    /// How long a request waits for the store: the reference's Redis timeout in reference
    /// mode, unless the store timeout is set.
    pub(crate) fn timeout(&self, reference: bool) -> Duration {
        match (self.store_timeout, reference) {
            (Some(timeout), _) => timeout,
            (None, true) => self.redis_timeout,
            (None, false) => Duration::from_millis(10),
        }
    }

    /// What a request gets when the store fails: in reference mode, the reference's error
    /// unless set otherwise.
    pub(crate) fn on_error(&self, reference: bool) -> OnStoreError {
        match (self.on_store_error, reference) {
            (Some(mode), _) => mode,
            (None, true) => OnStoreError::Error,
            (None, false) => OnStoreError::Local,
        }
    }

    pub(crate) fn backend(&self) -> Backend {
        self.backend.unwrap_or(if self.redis_url.is_some() {
            Backend::Redis
        } else if self.postgres.postgres_url.is_some() {
            Backend::Postgres
        } else {
            Backend::Memory
        })
    }
}

/// Where PostgreSQL is and how Tollgate uses it.
#[derive(Debug, Args)]
pub(crate) struct PostgresArgs {
    /// PostgreSQL URL: postgres://user:password@host:port/database?sslmode=…; sslmode
    /// (disable, prefer, require, verify-ca, verify-full), sslrootcert, sslcert and sslkey
    /// mean what they mean to libpq.
    #[arg(long, env = "POSTGRES_URL", hide_env_values = true)]
    pub(crate) postgres_url: Option<String>,
    /// Connections to PostgreSQL; each carries many requests' calls at once.
    #[arg(long, env = "POSTGRES_POOL_SIZE", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1000))]
    pub(crate) postgres_pool_size: u16,
    /// Longest one statement may run in PostgreSQL (its statement_timeout).
    #[arg(long, env = "POSTGRES_STATEMENT_TIMEOUT", default_value = "1s", value_parser = parse_timeout)]
    pub(crate) postgres_statement_timeout: Duration,
    /// Keep counters in an UNLOGGED table: less write-ahead log, but emptied after a
    /// database crash (and not replicated to standbys).
    #[arg(long, env = "POSTGRES_UNLOGGED", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) postgres_unlogged: bool,
    /// How often expired counters are deleted from PostgreSQL.
    #[arg(long, env = "POSTGRES_SWEEP_INTERVAL", default_value = "10s", value_parser = parse_timeout)]
    pub(crate) postgres_sweep_interval: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    Memory,
    Redis,
    Postgres,
}

impl Backend {
    /// The setting's spelling.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Redis => "redis",
            Self::Postgres => "postgres",
        }
    }
}

/// A value among `names`, parsed by the type's own `FromStr`: the core's types know
/// nothing of clap, and the help still lists the choices.
fn one_of<T>(names: &'static [&'static str]) -> impl TypedValueParser<Value = T>
where
    T: std::str::FromStr<Err = tollgate_core::UnknownName> + Clone + Send + Sync + 'static,
{
    PossibleValuesParser::new(names).try_map(|s| s.parse::<T>())
}

/// Parses a duration the way Go's `time.ParseDuration` does (`10s`, `1m30s`, `1.5h`,
/// `250us`, `0`), which is how the reference's settings are written; a bare number is
/// milliseconds.
fn parse_time_zone(text: &str) -> Result<Arc<str>, String> {
    Calendar::new(Unit::Day, 1, text)
        .map(|calendar| calendar.zone_name().into())
        .map_err(|e| e.to_string())
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let invalid = || format!("'{text}' is not a duration like 10ms, 250us, 3s, 1m or 1h30m");
    if text.is_empty() {
        return Err(invalid());
    }
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(Duration::from_millis(ms));
    }
    // Whole nanoseconds, so that `250us` is exactly 250 µs.
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let (number, after) = rest.split_at(number_end);
        let unit_end = after
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_end);
        let unit_ns: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            "" => return Err(format!("'{text}' lacks a unit (use ns, us, ms, s, m or h)")),
            _ => {
                return Err(format!(
                    "'{text}' has an unknown unit '{unit}' (use ns, us, ms, s, m or h)"
                ));
            }
        };
        let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
        if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
            return Err(invalid());
        }
        let digits = |s: &str| -> Result<u128, String> {
            if s.is_empty() {
                Ok(0)
            } else {
                s.parse().map_err(|_| invalid())
            }
        };
        // Digits past nanoseconds cannot matter; dropping them keeps the power in range.
        let fraction = &fraction[..fraction.len().min(18)];
        let scale = 10u128.pow(fraction.len() as u32);
        let part = digits(fraction)? * unit_ns / scale;
        total = digits(whole)?
            .checked_mul(unit_ns)
            .and_then(|ns| ns.checked_add(part))
            .and_then(|ns| total.checked_add(ns))
            .ok_or_else(invalid)?;
        rest = next;
    }
    u64::try_from(total)
        .map(Duration::from_nanos)
        .map_err(|_| invalid())
}

/// A size like `256MiB`, `1GiB`, `512KiB`, `100MB` or a bare number of bytes; at least 1 MiB.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{text}' is not a size like 256MiB or 1GiB"))?;
    let scale: u64 = match unit.trim() {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        _ => {
            return Err(format!(
                "'{text}' has an unknown unit (use KiB, MiB, GiB, KB, MB or GB)"
            ));
        }
    };
    match n.checked_mul(scale) {
        Some(bytes) if bytes >= 1 << 20 => Ok(bytes),
        Some(_) => Err(format!("'{text}' is less than 1MiB")),
        None => Err(format!("'{text}' is too large")),
    }
}

/// A duration that must be longer than zero.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err("a timeout must be longer than zero".into()),
        d => Ok(d),
    }
}

/// A fraction from 0 to 1.
fn parse_ratio(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("'{text}' is not a ratio between 0 and 1")),
    }
}

/// A lease's largest block: above 0 and at most half the limit, so that one instance
/// cannot hold most of a counter.
fn parse_lease_fraction(text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(f) if f > 0.0 && f <= 0.5 => Ok(f),
        _ => Err(format!(
            "'{text}' is not a lease fraction: above 0 and at most 0.5"
        )),
    }
}

/// `host:port`, or `:port` for every interface (the reference's form).
fn parse_listen_addr(text: &str) -> Result<SocketAddr, String> {
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    full.parse()
        .map_err(|_| format!("'{text}' is not an address like 0.0.0.0:9090 or :9090"))
}

/// The reference's runtime directory settings, used when --config is not given.
#[derive(Debug, Args)]
pub(crate) struct RuntimeArgs {
    /// Root of the runtime directory.
    #[arg(
        long,
        env = "RUNTIME_ROOT",
        default_value = "/srv/runtime_data/current"
    )]
    pub(crate) runtime_root: PathBuf,
    /// Subdirectory of RUNTIME_ROOT.
    #[arg(long, env = "RUNTIME_SUBDIRECTORY")]
    pub(crate) runtime_subdirectory: Option<PathBuf>,
    /// Directory of rules files inside the subdirectory.
    #[arg(long, env = "RUNTIME_APPDIRECTORY", default_value = "config")]
    pub(crate) runtime_appdirectory: PathBuf,
}

/// Defaults for what rules leave out.
#[derive(Debug, Clone, Args)]
pub(crate) struct RuleArgs {
    /// Sub-windows of a sliding window (more is more exact, and more memory).
    #[arg(long, env = "SLIDING_WINDOW_PRECISION", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub(crate) precision: u32,
    /// Algorithm of limits that name none.
    #[arg(long, env = "DEFAULT_ALGORITHM", default_value = "sliding_window", value_parser = one_of::<AlgorithmKind>(&["sliding_window", "fixed_window", "token_bucket", "leaky_bucket"]))]
    pub(crate) default_algorithm: AlgorithmKind,
    /// An IANA time zone (e.g. Europe/Berlin): every fixed window of a day, week, month or
    /// year that does not say `calendar: false` follows that zone's calendar (a month
    /// renews on the 1st); also the zone of `calendar: true` limits that name none. The
    /// way to calendar windows over xDS, whose protocol has no field for them.
    #[arg(long, env = "CALENDAR_TIME_ZONE", value_parser = parse_time_zone)]
    pub(crate) calendar_time_zone: Option<Arc<str>>,
    /// Domains whose every rule is a budget (consumption is recorded even past the
    /// limit), for rules that cannot say so themselves, e.g. over xDS; `*` for all.
    #[arg(long, env = "BUDGET_DOMAINS", value_delimiter = ',')]
    pub(crate) budget_domains: Vec<String>,
    /// Several files or xDS resources may hold the same domain: their descriptors merge
    /// (a descriptor defined twice is still an error).
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) merge_domain_config: bool,
    /// Answer and count exactly as the reference does, in its Redis keys, so that
    /// reference instances and Tollgates share every counter during a migration: fixed
    /// windows, increment first, an error when Redis fails; rules may use nothing the
    /// reference does not have.
    #[arg(long, env = "REFERENCE_MODE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub(crate) reference_mode: bool,
}

impl RuleArgs {
    pub(crate) fn defaults(&self) -> Defaults {
        Defaults {
            algorithm: self.default_algorithm,
            precision: self.precision,
            reference: self.reference_mode,
            calendar_zone: self.calendar_time_zone.clone(),
        }
    }

    /// An empty rule set to add rules to, as these settings want them compiled.
    pub(crate) fn builder(&self) -> RulesBuilder {
        RulesBuilder::new(self.defaults())
            .budget_domains(self.budget_domains.clone())
            .merge_domains(self.merge_domain_config)
    }
}

/// Logging.
#[derive(Debug, Args)]
pub(crate) struct LogArgs {
    /// Log filter: error, warn, info, debug, trace, or a tracing directive.
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
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
    #[arg(long, env = "TRACING_ENABLED", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
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
    #[arg(long, env = "TRACING_SERVICE_INSTANCE_ID", default_value = "")]
    pub(crate) tracing_service_instance_id: String,
    /// Fraction of new traces sampled; a trace Envoy propagates keeps its own decision.
    #[arg(long, env = "TRACING_SAMPLING_RATE", default_value = "1", value_parser = parse_ratio)]
    pub(crate) tracing_sampling_rate: f64,
}

/// How spans travel to the collector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ExporterProtocol {
    Http,
    Grpc,
}

fn parse_protocol(text: &str) -> Result<ExporterProtocol, String> {
    match text.trim().to_ascii_lowercase().as_str() {
        "" | "http" => Ok(ExporterProtocol::Http),
        "grpc" => Ok(ExporterProtocol::Grpc),
        _ => Err(format!(
            "'{text}' is not an exporter protocol: http or grpc"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serve(args: &[&str]) -> ServeArgs {
        let argv = ["tollgate", "serve"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Serve(s)) => *s,
            other => panic!("expected serve, got {other:?}"),
        }
    }

    #[test]
    fn addresses_come_from_host_and_port_unless_given_whole() {
        let s = serve(&["--grpc-port", "9001", "--host", "127.0.0.1"]);
        assert_eq!(s.grpc_addr().to_string(), "0.0.0.0:9001");
        assert_eq!(s.http_addr().to_string(), "127.0.0.1:8080");
        let s = serve(&["--grpc-addr", "127.0.0.1:7", "--grpc-port", "9001"]);
        assert_eq!(s.grpc_addr().to_string(), "127.0.0.1:7");
    }

    #[test]
    fn config_path_defaults_to_the_reference_runtime_directory() {
        let s = serve(&[]);
        assert_eq!(
            s.config_path(),
            PathBuf::from("/srv/runtime_data/current/config")
        );
        let s = serve(&[
            "--runtime-root",
            "/r",
            "--runtime-subdirectory",
            "ratelimit",
        ]);
        assert_eq!(s.config_path(), PathBuf::from("/r/ratelimit/config"));
        let s = serve(&["--config", "rules.yaml"]);
        assert_eq!(s.config_path(), PathBuf::from("rules.yaml"));
    }

    #[test]
    fn backend_is_redis_only_when_redis_is_configured() {
        assert_eq!(serve(&[]).store.backend(), Backend::Memory);
        let s = serve(&[
            "--redis-url",
            "redis://127.0.0.1:1",
            "--redis-type",
            "CLUSTER",
        ]);
        assert_eq!(s.store.backend(), Backend::Redis);
        assert_eq!(s.store.redis_type, RedisKind::Cluster);
        assert_eq!(
            serve(&["--backend", "memory", "--redis-url", "x:1"])
                .store
                .backend(),
            Backend::Memory
        );
    }

    #[test]
    fn booleans_take_the_reference_spellings() {
        assert!(serve(&["--shadow-mode"]).answers.shadow_mode);
        assert!(serve(&["--shadow-mode", "true"]).answers.shadow_mode);
        assert!(!serve(&["--shadow-mode", "false"]).answers.shadow_mode);
        assert!(
            serve(&["--limit-response-headers", "1"])
                .answers
                .limit_response_headers
        );
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("15"), Ok(Duration::from_millis(15)));
        assert!(parse_timeout("0ms").is_err());
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
        assert_eq!(parse_ratio("0.8"), Ok(0.8));
        assert!(parse_ratio("1.5").is_err());
        assert_eq!(
            parse_listen_addr(":9090").map(|a| a.to_string()),
            Ok("0.0.0.0:9090".into())
        );
        assert!(parse_duration("ten").is_err());
        assert_eq!(parse_bytes("256MiB"), Ok(256 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert!(parse_bytes("10KiB").is_err(), "below the floor");
        assert!(parse_bytes("5 parsecs").is_err());
        assert_eq!(parse_duration("5h"), Ok(Duration::from_secs(5 * 3600)));
        assert_eq!(parse_duration("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        for bad in ["", "1.2.3s", "s", "10x", "1d", "-1s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn leases_are_off_by_default_and_their_fraction_bounded() {
        let s = serve(&[]);
        assert!(!s.store.leases);
        assert_eq!(s.store.lease_max_fraction, 0.01);
        let s = serve(&["--leases", "--lease-max-fraction", "0.5"]);
        assert!(s.store.leases);
        assert_eq!(s.store.lease_max_fraction, 0.5);
        for bad in ["0", "-0.1", "0.51", "1", "NaN", "a lot"] {
            let flag = format!("--lease-max-fraction={bad}");
            let argv = ["tollgate", "serve", &flag];
            let error = Cli::try_parse_from(argv)
                .map(|_| ())
                .unwrap_err()
                .to_string();
            assert!(
                error.contains("is not a lease fraction: above 0 and at most 0.5"),
                "{bad}: {error}"
            );
        }
    }

    #[test]
    fn xds_settings_have_the_reference_defaults() {
        let s = serve(&[]);
        assert_eq!(s.source.config_type, ConfigType::File);
        assert!(!s.source.force_start_without_initial_config);
        assert!(!s.rules.merge_domain_config);
        let x = &s.source.xds;
        assert_eq!(x.xds_server_url, "localhost:18000");
        assert_eq!(x.xds_node_id, "default");
        assert_eq!(x.xds_connect_retry_interval, Duration::from_secs(3));
        assert_eq!(x.xds_backoff_initial_interval, Duration::from_secs(10));
        assert_eq!(x.xds_backoff_max_interval, Duration::from_secs(60));
        assert_eq!(x.xds_backoff_random_factor, 0.5);
        assert!(x.xds_backoff_jitter && !x.xds_use_tls);
        assert_eq!(x.xds_max_msg_size, 0);
        assert!(x.xds_additional_headers.is_empty());

        let s = serve(&[
            "--config-type",
            "GRPC_XDS_SOTW",
            "--xds-additional-headers",
            "X-Tenant:blue, zone:a:b",
            "--xds-backoff-max-interval",
            "1m30s",
            "--xds-backoff-jitter",
            "false",
        ]);
        assert_eq!(s.source.config_type, ConfigType::GrpcXdsSotw);
        let x = &s.source.xds;
        assert_eq!(
            x.xds_additional_headers,
            [
                ("x-tenant".to_owned(), "blue".to_owned()),
                ("zone".to_owned(), "a:b".to_owned())
            ]
        );
        assert_eq!(x.xds_backoff_max_interval, Duration::from_secs(90));
        assert!(!x.xds_backoff_jitter);
        assert!(parse_header_map("no-colon").is_err());
        assert!(parse_header_map(":v").is_err());
    }

    #[test]
    fn a_calendar_time_zone_is_checked_and_spelt_canonically() {
        let zone = serve(&["--calendar-time-zone", "europe/berlin"])
            .rules
            .defaults()
            .calendar_zone;
        assert_eq!(zone.as_deref(), Some("Europe/Berlin"));
    }

    #[test]
    fn wrong_values_are_rejected() {
        for bad in [
            &["--precision", "0"][..],
            &["--grpc-port", "x"],
            &["--default-algorithm", "magic"],
            &["--max-counters", "0"],
            &["--config-type", "file"],
            &["--config-type", "GRPC_XDS_DELTA"],
            &["--xds-backoff-random-factor", "2"],
            &["--xds-connect-retry-interval", "0s"],
            &["--calendar-time-zone", "Mars/Olympus_Mons"],
        ] {
            let argv = ["tollgate", "serve"].iter().chain(bad).copied();
            assert!(
                Cli::try_parse_from(argv).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }
}
