//! Command line and environment: every setting is a flag and an environment variable, with
//! the reference service's variable names where it has one.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::config::Defaults;
use crate::limiter::Algorithm;

/// Tollgate: an Envoy-compatible external rate-limit service.
#[derive(Debug, Parser)]
#[command(name = "tollgate", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the rate-limit API (gRPC) and the admin endpoints (HTTP).
    Serve(Box<ServeArgs>),
    /// Send one ShouldRateLimit request and print the answer (exit 2 if over the limit).
    Client(ClientArgs),
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
pub struct ClientArgs {
    /// Tollgate's gRPC address.
    #[arg(long, env = "TOLLGATE_ADDR", default_value = "127.0.0.1:8081")]
    pub addr: String,
    /// Rate-limit domain.
    #[arg(long)]
    pub domain: String,
    /// A descriptor as key=value[,key2=value2…]; repeat for several.
    #[arg(long, required = true)]
    pub descriptor: Vec<String>,
    /// Hits to count (request-level hits_addend).
    #[arg(long, default_value_t = 1)]
    pub hits: u32,
}

/// Settings of `tollgate serve`.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Rules file or directory [default: RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY]
    #[arg(long, env = "TOLLGATE_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
    /// gRPC listen address [default: GRPC_HOST:GRPC_PORT]
    #[arg(long, env = "GRPC_ADDR")]
    pub grpc_addr: Option<SocketAddr>,
    /// gRPC listen host, when --grpc-addr is not given.
    #[arg(long, env = "GRPC_HOST", default_value = "0.0.0.0")]
    pub grpc_host: IpAddr,
    /// gRPC listen port, when --grpc-addr is not given.
    #[arg(long, env = "GRPC_PORT", default_value_t = 8081)]
    pub grpc_port: u16,
    /// HTTP listen address for /healthcheck [default: HOST:PORT]
    #[arg(long, env = "HTTP_ADDR")]
    pub http_addr: Option<SocketAddr>,
    /// HTTP listen host, when --http-addr is not given.
    #[arg(long = "host", env = "HOST", default_value = "0.0.0.0")]
    pub http_host: IpAddr,
    /// HTTP listen port, when --http-addr is not given.
    #[arg(long = "port", env = "PORT", default_value_t = 8080)]
    pub http_port: u16,
    /// Most counters the memory store keeps; past it, the soonest-expiring are evicted.
    #[arg(long, env = "MAX_COUNTERS", default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_counters: u64,
    #[command(flatten)]
    pub rules: RuleArgs,
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub answers: AnswerArgs,
    #[command(flatten)]
    pub ops: OpsArgs,
    #[command(flatten)]
    pub log: LogArgs,
}

impl ServeArgs {
    pub fn grpc_addr(&self) -> SocketAddr {
        self.grpc_addr
            .unwrap_or(SocketAddr::new(self.grpc_host, self.grpc_port))
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
            .unwrap_or(SocketAddr::new(self.http_host, self.http_port))
    }

    pub fn config_path(&self) -> PathBuf {
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

/// How answers are shaped beyond what the rules say.
#[derive(Debug, Args)]
pub struct AnswerArgs {
    /// Hits above this fraction of a limit are counted as near_limit in metrics.
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_ratio)]
    pub near_limit_ratio: f64,
    /// Never deny: the overall answer is OK while statuses still say OVER_LIMIT.
    #[arg(long, env = "SHADOW_MODE", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub shadow_mode: bool,
    /// Add rate-limit headers for Envoy to return to clients.
    #[arg(long, env = "LIMIT_RESPONSE_HEADERS_ENABLED", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub limit_response_headers: bool,
    /// Header style: the reference's RateLimit-Limit/-Remaining/-Reset, or the IETF
    /// draft's RateLimit-Policy and RateLimit.
    #[arg(long, env = "RESPONSE_HEADERS_FORMAT", value_enum, default_value_t = HeaderFormat::Reference)]
    pub response_headers_format: HeaderFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum HeaderFormat {
    Reference,
    Draft,
}

/// Operations: metrics, reload, shutdown.
#[derive(Debug, Args)]
pub struct OpsArgs {
    /// Also serve Prometheus metrics on --prometheus-addr (they are always on the HTTP port).
    #[arg(long, env = "USE_PROMETHEUS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub use_prometheus: bool,
    /// Address of the extra metrics listener; ":9090" means all interfaces.
    #[arg(long, env = "PROMETHEUS_ADDR", default_value = ":9090", value_parser = parse_listen_addr)]
    pub prometheus_addr: SocketAddr,
    /// Path of the extra metrics listener.
    #[arg(long, env = "PROMETHEUS_PATH", default_value = "/metrics")]
    pub prometheus_path: String,
    /// On SIGTERM, fail health checks for this long before closing listeners, so load
    /// balancers stop sending first (5s suits Kubernetes).
    #[arg(long, env = "SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,
}

/// Where counters live and what happens when that place fails.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Counter store [default: redis if --redis-url is set, else memory]
    #[arg(long, env = "BACKEND_TYPE", value_enum, ignore_case = true)]
    pub backend: Option<Backend>,
    /// Redis address(es): redis://[user:password@]host:port, rediss://…, or the reference's
    /// forms: host:port; for cluster a comma-separated node list; for sentinel
    /// "master-name,sentinel-host:port,…".
    #[arg(long, env = "REDIS_URL")]
    pub redis_url: Option<String>,
    /// Redis deployment.
    #[arg(long, env = "REDIS_TYPE", value_enum, ignore_case = true, default_value_t = RedisType::Single)]
    pub redis_type: RedisType,
    /// Redis password, or "user:password", for addresses without credentials.
    #[arg(long, env = "REDIS_AUTH", hide_env_values = true)]
    pub redis_auth: Option<String>,
    /// Connect to Redis over TLS (host:port forms; a rediss:// URL implies it).
    #[arg(long, env = "REDIS_TLS", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true", value_parser = clap::builder::BoolishValueParser::new())]
    pub redis_tls: bool,
    /// Prefix of every Redis key.
    #[arg(long, env = "CACHE_KEY_PREFIX", default_value = "")]
    pub cache_key_prefix: String,
    /// Longest a request waits for the store, e.g. 10ms, 250us, 1s.
    #[arg(long, env = "STORE_TIMEOUT", default_value = "10ms", value_parser = parse_timeout)]
    pub store_timeout: Duration,
    /// What a request gets when the store fails or times out: a decision from the local
    /// view (local), OK (allow), OVER_LIMIT (deny), or gRPC UNAVAILABLE (error), so that
    /// Envoy's failure_mode_deny decides.
    #[arg(long, env = "ON_STORE_ERROR", value_enum, default_value_t = OnStoreError::Local)]
    pub on_store_error: OnStoreError,
}

impl StoreArgs {
    pub fn backend(&self) -> Backend {
        self.backend.unwrap_or(if self.redis_url.is_some() {
            Backend::Redis
        } else {
            Backend::Memory
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Memory,
    Redis,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RedisType {
    Single,
    Cluster,
    Sentinel,
}

/// What a request gets when the counter store cannot answer in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OnStoreError {
    Local,
    Allow,
    Deny,
    Error,
}

/// Parses `10ms`, `250us`, `2s` or a bare number of milliseconds.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{text}' is not a duration like 10ms, 250us or 1s"))?;
    match unit.trim() {
        "" | "ms" => Ok(Duration::from_millis(n)),
        "us" | "µs" => Ok(Duration::from_micros(n)),
        "s" => Ok(Duration::from_secs(n)),
        _ => Err(format!("'{text}' has an unknown unit (use us, ms or s)")),
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
pub struct RuntimeArgs {
    /// Root of the runtime directory.
    #[arg(
        long,
        env = "RUNTIME_ROOT",
        default_value = "/srv/runtime_data/current"
    )]
    pub runtime_root: PathBuf,
    /// Subdirectory of RUNTIME_ROOT.
    #[arg(long, env = "RUNTIME_SUBDIRECTORY")]
    pub runtime_subdirectory: Option<PathBuf>,
    /// Directory of rules files inside the subdirectory.
    #[arg(long, env = "RUNTIME_APPDIRECTORY", default_value = "config")]
    pub runtime_appdirectory: PathBuf,
}

/// Defaults for what rules leave out.
#[derive(Debug, Args)]
pub struct RuleArgs {
    /// Sub-windows of a sliding window (more is more exact, and more memory).
    #[arg(long, env = "SLIDING_WINDOW_PRECISION", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub precision: u32,
    /// Algorithm of limits that name none.
    #[arg(long, env = "DEFAULT_ALGORITHM", value_enum, default_value_t = AlgorithmArg::SlidingWindow)]
    pub default_algorithm: AlgorithmArg,
}

impl RuleArgs {
    pub fn defaults(&self) -> Defaults {
        Defaults {
            algorithm: self.default_algorithm.into(),
            precision: self.precision,
        }
    }
}

/// The algorithms, as command-line values.
#[derive(Debug, Clone, Copy, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum AlgorithmArg {
    SlidingWindow,
    FixedWindow,
    TokenBucket,
    LeakyBucket,
}

impl From<AlgorithmArg> for Algorithm {
    fn from(a: AlgorithmArg) -> Self {
        match a {
            AlgorithmArg::SlidingWindow => Algorithm::SlidingWindow,
            AlgorithmArg::FixedWindow => Algorithm::FixedWindow,
            AlgorithmArg::TokenBucket => Algorithm::TokenBucket,
            AlgorithmArg::LeakyBucket => Algorithm::LeakyBucket,
        }
    }
}

/// Logging.
#[derive(Debug, Args)]
pub struct LogArgs {
    /// Log filter: error, warn, info, debug, trace, or a tracing directive.
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,
    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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
        assert_eq!(s.store.redis_type, RedisType::Cluster);
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
        assert!(parse_duration("5h").is_err());
    }

    #[test]
    fn wrong_values_are_rejected() {
        for bad in [
            &["--precision", "0"][..],
            &["--grpc-port", "x"],
            &["--default-algorithm", "magic"],
            &["--max-counters", "0"],
        ] {
            let argv = ["tollgate", "serve"].iter().chain(bad).copied();
            assert!(
                Cli::try_parse_from(argv).is_err(),
                "{bad:?} should be rejected"
            );
        }
    }
}
