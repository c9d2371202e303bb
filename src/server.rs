//! `tollgate serve`: load rules, open the store, bind the ports, serve until a signal, then
//! drain: health checks fail first, in-flight calls finish.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_core::headers::HeaderStyle;
use tollgate_core::store::redis::{RedisConfig, RedisStore, RedisTarget};
use tollgate_core::{Clock, Limiter, MemoryStore, Options, Store, SystemClock};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::admin::{self, Admin};
use crate::grpc::GrpcService;
use crate::listen::{self, Acceptor};
use crate::metrics::Metrics;
use crate::reload::{self, Reload};
use crate::rls::Rls;
use crate::settings::{Backend, ConnArgs, HeaderFormat, ServeArgs};

/// How often expired counters are dropped from memory.
const SWEEP_PERIOD: Duration = Duration::from_secs(1);
/// Request headers a gRPC client may send; Envoy's are a few hundred bytes.
const HEADER_LIST_BYTES: u32 = 16 << 10;
/// Flow-control windows: what a client may have in flight before Tollgate reads it.
const STREAM_WINDOW_BYTES: u32 = 64 << 10;
const CONNECTION_WINDOW_BYTES: u32 = 1 << 20;
/// How long calls in flight get to finish once the listeners are closed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// The gRPC health names Envoy and Kubernetes probes use.
const HEALTH_NAMES: [&str; 2] = ["", "ratelimit"];

/// Runs the server until a signal stops it.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    let path = args.config_path();
    let rules = reload::load(&path, args.rules.builder()).await?;
    tracing::info!(path = %path.display(), domains = rules.domains().count(), "rules loaded");

    let store = open_store(&args)?;
    let first_connect = args.store.store_startup_wait;
    if let Store::Redis(redis) = &store
        && !redis.wait_up(first_connect).await
    {
        let why = redis.last_error().unwrap_or_else(|| "no answer".into());
        tracing::warn!(
            "redis not reachable after {first_connect:?} ({why}); serving per --on-store-error until it is"
        );
    }
    let (mut metrics, rule_metrics) = Metrics::new(
        args.answers.near_limit_ratio,
        args.ops.detailed_metric_limit,
    );
    metrics.config_load_success.inc_by(1);
    metrics.watch_store(store.clone());
    let options = Options {
        defaults: args.rules.defaults(),
        global_shadow_mode: args.answers.shadow_mode,
        quota_mode: args.answers.quota_mode,
        all_or_nothing: args.answers.stop_cache_key_increment_when_overlimit,
    };
    let rls = Arc::new(Rls {
        limiter: Limiter::with_recorder(rules, store, options, rule_metrics),
        metrics: Arc::new(metrics),
        headers: header_style(&args),
        dynamic_metadata: args.answers.response_dynamic_metadata,
    });
    let reload = Reload::new(rls.clone(), path, Arc::new(args.rules.clone()));
    let _watch = reload::watch(reload.clone())?;

    let grpc = bind(args.grpc_addr(), "gRPC").await?;
    let http = bind(args.http_addr(), "HTTP").await?;
    let prometheus = match args.ops.use_prometheus {
        true => Some(bind(args.ops.prometheus_addr, "Prometheus").await?),
        false => None,
    };
    let grpc_addr = grpc.local_addr()?;
    let http_addr = http.local_addr()?;
    // Tests and scripts wait for this line; with port 0 it is how they learn the ports.
    println!("tollgate listening grpc={grpc_addr} http={http_addr}");
    tracing::info!(%grpc_addr, %http_addr, "listening");

    let (health, health_service) = tonic_health::server::health_reporter();
    set_health(&health, ServingStatus::Serving).await;
    let draining = Arc::new(AtomicBool::new(false));
    let (stop_tx, stop_rx) = watch::channel(false);
    let stop_rx_grace = stop_rx.clone();
    tokio::spawn(handle_signals(
        reload,
        health,
        draining.clone(),
        args.ops.shutdown_delay,
        stop_tx,
    ));

    let admin = Admin {
        rls: rls.clone(),
        draining,
    };
    let limits = args.conn.limits();
    let grpc_server = grpc_builder(&args.conn)
        .add_service(health_service)
        .add_service(GrpcService::new(
            rls.clone(),
            args.conn.grpc_max_message_bytes,
        ))
        .serve_with_incoming_shutdown(
            Acceptor::new(grpc, limits).incoming(),
            stopped(stop_rx.clone()),
        );
    let http_stop = stopped(stop_rx.clone());
    let http_server = async {
        listen::serve_http(Acceptor::new(http, limits), admin::router(admin), http_stop).await;
        Ok::<(), anyhow::Error>(())
    };
    let prometheus_server = async {
        if let Some(listener) = prometheus {
            let router = axum::Router::new()
                .route(
                    &args.ops.prometheus_path,
                    axum::routing::get(admin::metrics),
                )
                .with_state(rls);
            listen::serve_http(Acceptor::new(listener, limits), router, stopped(stop_rx)).await;
        }
        Ok::<(), anyhow::Error>(())
    };
    let servers = async { tokio::join!(grpc_server, http_server, prometheus_server) };
    // Envoy keeps its HTTP/2 connections open for good: once the listeners are closed, give
    // calls in flight a grace period, then stop whatever is still connected.
    let grace_over = async {
        stopped(stop_rx_grace).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        (grpc_result, http_result, prometheus_result) = servers => {
            grpc_result.context("gRPC server failed")?;
            http_result.context("HTTP server failed")?;
            prometheus_result.context("Prometheus server failed")
        }
        () = grace_over => {
            tracing::info!("closing connections still open after {SHUTDOWN_GRACE:?}");
            Ok(())
        }
    }
}

/// The gRPC server with its per-connection limits: streams, header size, buffered bytes.
fn grpc_builder(conn: &ConnArgs) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(conn.grpc_max_concurrent_streams)
        .http2_max_header_list_size(HEADER_LIST_BYTES)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
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

/// The counter store the settings ask for.
fn open_store(args: &ServeArgs) -> anyhow::Result<Store> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let capacity = args.capacity();
    let settings = &args.store;
    match settings.backend() {
        Backend::Memory => {
            let memory = MemoryStore::new(capacity, clock);
            memory.spawn_sweeper(SWEEP_PERIOD);
            Ok(Store::Memory(memory))
        }
        Backend::Redis => {
            let url = settings
                .redis_url
                .as_deref()
                .context("BACKEND_TYPE=redis needs REDIS_URL (--redis-url)")?;
            let target = RedisTarget::parse(
                url,
                settings.redis_type,
                settings.redis_auth.as_deref(),
                settings.redis_tls,
            )?;
            let config = RedisConfig {
                target,
                key_prefix: settings.cache_key_prefix.clone(),
                timeout: settings.store_timeout,
                on_error: settings.on_store_error,
                local_capacity: capacity,
            };
            Ok(Store::Redis(RedisStore::start(config, clock, SWEEP_PERIOD)))
        }
    }
}

async fn bind(addr: std::net::SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for {what} on {addr}"))
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health
        .set_service_status(<GrpcService as tonic::server::NamedService>::NAME, status)
        .await;
    for name in HEALTH_NAMES {
        health.set_service_status(name, status).await;
    }
}

/// SIGHUP reloads the rules; SIGTERM or Ctrl-C drains and stops.
async fn handle_signals(
    reload: Reload,
    health: HealthReporter,
    draining: Arc<AtomicBool>,
    delay: Duration,
    stop: watch::Sender<bool>,
) {
    wait_for_stop(&reload).await;
    tracing::info!(delay = ?delay, "draining: health checks fail, then listeners close");
    draining.store(true, Ordering::Relaxed);
    set_health(&health, ServingStatus::NotServing).await;
    tokio::time::sleep(delay).await;
    let _ = stop.send(true);
}

#[cfg(unix)]
async fn wait_for_stop(reload: &Reload) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return,
            _ = term.recv() => return,
            _ = hup.recv() => {
                // Off this loop, so that SIGTERM is heard while rules load.
                let reload = reload.clone();
                tokio::spawn(async move { reload.run().await });
            }
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_stop(_reload: &Reload) {
    let _ = tokio::signal::ctrl_c().await;
}
