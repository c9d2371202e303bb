//! Where the rules come from (files or xDS) and how they are compiled.

use super::flag::Flag as _;
use super::parse::{
    HeaderMap, one_of, parse_header_map, parse_ratio, parse_time_zone, parse_timeout,
    parse_xds_message_size,
};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tollgate_core::rules::RulesBuilder;
use tollgate_core::{AlgorithmKind, Defaults};

/// Where rules come from and when they count as loaded.
#[derive(Debug, Args)]
pub(crate) struct SourceArgs {
    /// Rules source: FILE (the rules path, watched) or GRPC_XDS_SOTW (pushed by an xDS
    /// management server, as Envoy Gateway does).
    #[arg(long, env = "CONFIG_TYPE", value_enum, default_value_t = ConfigType::File)]
    pub(crate) config_type: ConfigType,
    /// xDS: serve before the first rules arrive, answering ShouldRateLimit with an error
    /// until then (otherwise the ports open only once rules are in force).
    #[arg(
        long,
        env = "FORCE_START_WITHOUT_INITIAL_CONFIG",
        default_value_t = false,
        flag()
    )]
    pub(crate) force_start_without_initial_config: bool,
    /// Health checks fail until rules with at least one domain are loaded, and again
    /// whenever a load leaves none.
    #[arg(
        long,
        env = "HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED",
        default_value_t = false,
        flag()
    )]
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
        default_value = "localhost:18000",
        hide_env_values = true
    )]
    pub(crate) xds_server_url: String,
    /// Node id sent to the management server (its snapshots are keyed by it).
    #[arg(long, env = "CONFIG_GRPC_XDS_NODE_ID", default_value = "default")]
    pub(crate) xds_node_id: String,
    /// Node metadata as key=value[,key=value…] (string fields of Node.metadata).
    #[arg(long, env = "CONFIG_GRPC_XDS_NODE_METADATA", default_value = "")]
    pub(crate) xds_node_metadata: String,
    /// Extra gRPC metadata on the stream, as key:value[,key:value…].
    #[arg(long, env = "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", default_value = "", value_parser = parse_header_map, hide_env_values = true)]
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
    #[arg(
        long,
        env = "XDS_CLIENT_BACKOFF_JITTER",
        default_value_t = true,
        flag()
    )]
    pub(crate) xds_backoff_jitter: bool,
    /// Largest xDS response accepted, in bytes, 256 to 1 GiB; 0 keeps gRPC's 4 MiB.
    #[arg(long, env = "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", default_value_t = 0, value_parser = parse_xds_message_size)]
    pub(crate) xds_max_msg_size: usize,
    /// Talk TLS to the management server.
    #[arg(
        long,
        env = "CONFIG_GRPC_XDS_SERVER_USE_TLS",
        default_value_t = false,
        flag()
    )]
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
    #[arg(long, env = "MERGE_DOMAIN_CONFIG", default_value_t = false, flag())]
    pub(crate) merge_domain_config: bool,
    /// Answer and count exactly as the reference does, in its Redis keys, so that
    /// reference instances and Tollgates share every counter during a migration: fixed
    /// windows, increment first, an error when Redis fails; rules may use nothing the
    /// reference does not have.
    #[arg(long, env = "REFERENCE_MODE", default_value_t = false, flag())]
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
