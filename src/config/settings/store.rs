//! The counter store: memory, Redis or PostgreSQL, and how requests treat it.

use super::flag::Flag as _;
use super::parse::{one_of, parse_duration, parse_lease_fraction, parse_timeout};
use clap::{Args, ValueEnum};
use std::path::PathBuf;
use std::time::Duration;
use tollgate_core::OnStoreError;
use tollgate_core::store::redis::RedisKind;

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
    #[arg(long, env = "REDIS_URL", hide_env_values = true)]
    pub(crate) redis_url: Option<String>,
    /// Redis deployment: single, cluster or sentinel.
    #[arg(long, env = "REDIS_TYPE", ignore_case = true, default_value = "single", value_parser = one_of::<RedisKind>(&["single", "cluster", "sentinel"]))]
    pub(crate) redis_type: RedisKind,
    /// Redis password, or "user:password", for addresses without credentials.
    #[arg(long, env = "REDIS_AUTH", hide_env_values = true)]
    pub(crate) redis_auth: Option<String>,
    /// Connect to Redis over TLS (host:port forms; a rediss:// URL implies it).
    #[arg(long, env = "REDIS_TLS", default_value_t = false, flag())]
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
    #[arg(
        long,
        env = "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
        default_value_t = false,
        flag()
    )]
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
    /// admit from them locally (docs/STORES.md, Leases); reference mode never leases.
    #[arg(long, env = "LEASES", default_value_t = true, flag())]
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
    #[arg(long, env = "POSTGRES_UNLOGGED", default_value_t = false, flag())]
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
