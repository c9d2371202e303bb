//! Command line and environment: every setting is a flag and an environment variable, with
//! the reference service's variable names where it has one.

mod answers;
mod client;
mod conn;
#[cfg(test)]
mod documented;
mod flag;
mod ops;
mod parse;
mod rlqs;
mod source;
mod store;

use self::parse::parse_bytes;
use clap::{Args, Parser, Subcommand};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use tollgate_core::Capacity;

pub(crate) use self::answers::{AnswerArgs, HeaderFormat};
pub(crate) use self::client::{
    AdminArgs, ClientArgs, ClientTlsArgs, OverriddenArgs, OverrideAction, OverrideArgs,
    RequestArgs, TopArgs,
};
pub(crate) use self::conn::{ConnArgs, TlsArgs};
pub(crate) use self::ops::{LogArgs, LogFormat, OpsArgs, TracingArgs};
pub(crate) use self::parse::{ExporterProtocol, HeaderMap};
pub(crate) use self::rlqs::{NoRuleAction, RlqsArgs};
pub(crate) use self::source::{ConfigType, RuleArgs, RuntimeArgs, SourceArgs, XdsArgs};
pub(crate) use self::store::{Backend, PostgresArgs, StoreArgs};

/// Tollgate: an Envoy-compatible external rate-limit service.
#[derive(Debug, Parser)]
#[command(
    name = "tollgate",
    version,
    about,
    after_help = "Run without arguments, tollgate serves: `tollgate` is `tollgate serve`, \
                  configured by the environment alone."
)]
pub struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Serve the rate-limit API (gRPC) and the admin endpoints (HTTP).
    Serve(Box<ServeArgs>),
    /// Send one ShouldRateLimit request and print the answer (exit 2 if over the limit).
    Client(ClientArgs),
    /// Ask a running Tollgate why a request would get its answer (POST /explain on its
    /// HTTP port); counts nothing.
    Explain {
        #[command(flatten)]
        request: AdminArgs,
        /// The server's ADMIN_TOKEN: sent when set, so that the answer says who set an
        /// override.
        #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
        admin_token: Option<String>,
    },
    /// Set the counters of a request back to empty on a running Tollgate (DELETE
    /// /counters on its HTTP port), in its store and every instance's local view.
    Reset {
        #[command(flatten)]
        request: AdminArgs,
        /// The server's ADMIN_TOKEN.
        #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
        admin_token: String,
    },
    /// Set, list or delete runtime overrides on a running Tollgate (/overrides on its
    /// HTTP port).
    Override(OverrideArgs),
    /// Print the heaviest keys of a running Tollgate's rules, by hits, denials or shadow
    /// mode's would-be denials (GET /top on its HTTP port).
    Top(TopArgs),
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
    /// Threads serving requests [default: the CPUs available]. Fewer cost less CPU per
    /// request where Tollgate shares a small host with Redis, Envoy or the application.
    #[arg(long, env = "WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub(crate) worker_threads: Option<u16>,
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

/// `tollgate serve ARGS` with `env` as its whole environment, parsed as the command line
/// would be; no variable of this process is read. A variable becomes its flag, ahead of
/// `args`, so that a flag given overrides it, as it overrides the environment.
pub(crate) fn serve_args(
    args: &[&str],
    env: &[(String, String)],
) -> Result<ServeArgs, clap::Error> {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let mut from_env = Vec::new();
    let command = Cli::command().mut_subcommand("serve", |serve| {
        serve.args_override_self(true).mut_args(|arg| {
            let name = arg.get_env().and_then(|e| e.to_str());
            let value = name.and_then(|name| env.iter().find(|(n, _)| n == name));
            if let (Some((_, value)), Some(long)) = (value, arg.get_long()) {
                from_env.push(format!("--{long}={value}"));
            }
            arg.env(None)
        })
    });
    let argv = ["tollgate", "serve"]
        .into_iter()
        .map(str::to_owned)
        .chain(from_env)
        .chain(args.iter().map(|a| (*a).to_owned()));
    let matches = command.try_get_matches_from(argv)?;
    match Cli::from_arg_matches(&matches)?.command {
        Command::Serve(args) => Ok(*args),
        _ => Err(clap::Error::raw(
            clap::error::ErrorKind::InvalidSubcommand,
            "not the serve command",
        )),
    }
}

/// Every argument of `command` and of its subcommands.
pub(crate) fn all_args(command: &clap::Command) -> Vec<clap::Arg> {
    let own = command.get_arguments().cloned();
    own.chain(command.get_subcommands().flat_map(all_args))
        .collect()
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

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use tollgate_core::store::redis::RedisKind;

    fn serve(args: &[&str]) -> ServeArgs {
        let argv = ["tollgate", "serve"].iter().chain(args).copied();
        match Cli::try_parse_from(argv).map(|c| c.command) {
            Ok(Command::Serve(s)) => *s,
            other => panic!("expected serve, got {other:?}"),
        }
    }

    #[test]
    fn help_never_shows_the_value_of_a_secret_setting() {
        use clap::CommandFactory as _;
        for arg in all_args(&Cli::command()) {
            let Some(env) = arg.get_env().and_then(|e| e.to_str()) else {
                continue;
            };
            assert!(
                !tollgate_core::redact::is_secret(env) || arg.is_hide_env_values_set(),
                "--{} shows the value of {env} in the help",
                arg.get_id()
            );
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
    fn leases_are_on_by_default_and_their_fraction_bounded() {
        let s = serve(&[]);
        assert!(s.store.leases);
        assert_eq!(s.store.lease_max_fraction, 0.01);
        let s = serve(&["--leases=false", "--lease-max-fraction", "0.5"]);
        assert!(!s.store.leases);
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
        assert_eq!(x.xds_additional_headers, Default::default());

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
            x.xds_additional_headers.pairs,
            [
                ("x-tenant".to_owned(), "blue".to_owned()),
                ("zone".to_owned(), "a:b".to_owned())
            ]
        );
        assert_eq!(x.xds_backoff_max_interval, Duration::from_secs(90));
        assert!(!x.xds_backoff_jitter);
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
