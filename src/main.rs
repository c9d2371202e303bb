//! The `tollgate` command: serve the rate-limit API, check rules, or ask a running server.

#![warn(unreachable_pub)]

mod admin;
mod admin_client;
mod client;
mod compat;
mod debug_port;
mod env_typos;
mod explain;
#[cfg(test)]
mod fuzz;
mod grpc;
mod json;
mod listen;
mod log_format;
mod log_level;
mod metrics;
mod proto;
mod reference_stats;
mod reload;
mod reset;
mod rlqs;
mod rls;
mod rules_status;
mod server;
mod settings;
mod statsd;
mod tls;
mod trace;
mod trim;
mod unmatched;
mod watch;
mod xds;

use std::process::ExitCode;

use clap::Parser;
use tollgate_core::Rules;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry};

use crate::log_format::ReferenceJson;
use crate::settings::{Cli, Command, LogArgs, LogFormat};

fn main() -> ExitCode {
    // With no arguments at all, serve: the reference's image contract (`/bin/ratelimit`,
    // configured by the environment alone), which Envoy Gateway and most manifests use.
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.len() == 1 {
        args.push("serve".into());
    }
    let cli = Cli::parse_from(args);
    match cli.command {
        Command::CheckConfig { path, rules } => match load_now(&path, &rules) {
            Ok(_) => {
                println!("ok");
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::FAILURE
            }
        },
        Command::Client(args) => match runtime().and_then(|rt| rt.block_on(client::run(args))) {
            Ok(false) => ExitCode::SUCCESS,
            Ok(true) => ExitCode::from(2),
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Explain(args) => {
            match runtime().and_then(|rt| rt.block_on(admin_client::explain(args))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Reset {
            request,
            admin_token,
        } => match runtime().and_then(|rt| rt.block_on(admin_client::reset(request, &admin_token)))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Migrate(args) => match runtime().and_then(|rt| rt.block_on(migrate(args))) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => match serve(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `tollgate migrate`: the PostgreSQL schema brought up to date.
async fn migrate(args: settings::PostgresArgs) -> anyhow::Result<()> {
    use tollgate_core::store::postgres::{self, PgTarget, SCHEMA_VERSION};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = args
        .postgres_url
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("migrate needs POSTGRES_URL (--postgres-url)"))?;
    let target = PgTarget::parse(url).map_err(anyhow::Error::msg)?;
    let found = postgres::migrate(&target, args.postgres_unlogged)
        .await
        .map_err(anyhow::Error::msg)?;
    match found == SCHEMA_VERSION {
        true => println!("schema version {SCHEMA_VERSION}: up to date"),
        false => println!("schema version {SCHEMA_VERSION}: migrated from {found}"),
    }
    Ok(())
}

/// Loads the rules at `path` as `settings` want them, on this thread.
fn load_now(
    path: &std::path::Path,
    settings: &settings::RuleArgs,
) -> Result<Rules, tollgate_core::ConfigErrors> {
    let mut builder = settings.builder();
    builder.add_path(path);
    builder.finish()
}

fn serve(args: settings::ServeArgs) -> anyhow::Result<()> {
    // Server, Redis and xDS TLS use rustls; ring is its one crypto provider. Installing can only
    // fail if one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = runtime()?;
    let (tracing, span_layer) = match args.tracing.tracing_enabled {
        true => {
            let _inside = runtime.enter();
            let (tracing, layer) = trace::Tracing::start(&args.tracing)?;
            (Some(tracing), Some(layer))
        }
        false => (None, None),
    };
    init_logging(&args.log, span_layer)?;
    let result = runtime.block_on(server::run(args));
    if let Some(tracing) = tracing {
        // Off the workers: the exporter may still need them to send the last spans.
        let flush = async { tokio::task::spawn_blocking(move || tracing.shutdown()).await };
        let _ = runtime.block_on(flush);
    }
    result
}

/// The runtime, without tokio's LIFO slot: a task woken by another (the Redis connection's
/// driver by a request, a request by its HTTP/2 connection) takes its turn in the queue
/// instead of running next, so a woken driver finds several requests to write at once.
/// Measured: 4–16 % less CPU per request with Redis, 13 % with the memory store and half
/// its p99 (docs/BENCHMARKS.md). The switch is tokio's unstable API; a build without
/// `tokio_unstable` (.cargo/config.toml) keeps the default.
fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    builder
        .build()
        .map_err(|e| anyhow::anyhow!("cannot start the runtime: {e}"))
}

/// A layer of the process's one subscriber.
type BoxedLayer = Box<dyn Layer<Registry> + Send + Sync>;

/// Logs to stderr under LOG_LEVEL; `spans`, when tracing is on, sees spans under its own
/// filter.
fn init_logging(log: &LogArgs, spans: Option<BoxedLayer>) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&log.log_level)
        .map_err(|e| anyhow::anyhow!("invalid LOG_LEVEL '{}': {e}", log.log_level))?;
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    let logs: BoxedLayer = match log.log_format {
        LogFormat::Text => Box::new(fmt.with_filter(filter)),
        LogFormat::Json => Box::new(fmt.event_format(ReferenceJson).with_filter(filter)),
    };
    let layers: Vec<BoxedLayer> = std::iter::once(logs).chain(spans).collect();
    tracing_subscriber::registry().with(layers).init();
    Ok(())
}
