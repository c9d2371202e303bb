//! `tollgate serve` as a process: the runtime, logging and tracing around the server.

use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{Layer, Registry};

use crate::config::settings::{LogArgs, LogFormat, ServeArgs};
use crate::ops::log_format::ReferenceJson;
use crate::ops::trace;
use crate::server::{self, Config, Listeners};

pub(super) fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Server, Redis and xDS TLS use rustls; ring is its one crypto provider. Installing can only
    // fail if one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = runtime(args.worker_threads.map(usize::from))?;
    let (tracing, span_layer) = match args.tracing.tracing_enabled {
        true => {
            let _inside = runtime.enter();
            let (tracing, layer) = trace::Tracing::start(&args.tracing)?;
            (Some(tracing), Some(layer))
        }
        false => (None, None),
    };
    init_logging(&args.log, span_layer)?;
    let result = runtime.block_on(async {
        let config = Config::load(args, &environment()).await?;
        server::run(config, Listeners::FromSettings, server::terminated()).await
    });
    if let Some(tracing) = tracing {
        // Off the workers: the exporter may still need them to send the last spans.
        let flush = async { tokio::task::spawn_blocking(move || tracing.shutdown()).await };
        let _ = runtime.block_on(flush);
    }
    result
}

/// The process's environment: its variables whose name and value are text.
fn environment() -> Vec<(String, String)> {
    std::env::vars_os()
        .filter_map(|(name, value)| Some((name.into_string().ok()?, value.into_string().ok()?)))
        .collect()
}

/// The runtime, with `workers` threads (None: one per CPU available), without tokio's
/// LIFO slot: a task woken by another (the Redis connection's driver by a request, a
/// request by its HTTP/2 connection) takes its turn in the queue instead of running next,
/// so a woken driver finds several requests to write at once. Measured: 4–16 % less CPU
/// per request with Redis, 13 % with the memory store and half its p99
/// (docs/BENCHMARKS.md). The switch is tokio's unstable API; a build without
/// `tokio_unstable` (.cargo/config.toml) keeps the default.
pub(crate) fn runtime(workers: Option<usize>) -> anyhow::Result<tokio::runtime::Runtime> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    // Always given, so that tokio never reads TOKIO_WORKER_THREADS, whose bad value it
    // panics on (the variable is warned about as not a setting instead).
    let cpus = || std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    builder.worker_threads(workers.unwrap_or_else(cpus));
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
