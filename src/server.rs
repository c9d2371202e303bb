//! `tollgate serve`: load rules, open the store, bind both ports, serve until a signal.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::RateLimitServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tonic::transport::server::TcpIncoming;

use crate::config;
use crate::limiter::{Clock, SystemClock};
use crate::service::Service;
use crate::service::grpc::GrpcService;
use crate::settings::{Backend, ServeArgs};
use crate::store::redis::{RedisConfig, RedisStore, Target};
use crate::store::{MemoryStore, Store};

/// How often expired counters are dropped from memory.
const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// Runs the server; the error is a message for the operator.
pub async fn run(args: ServeArgs) -> Result<(), String> {
    let path = args.config_path();
    let defaults = args.rules.defaults();
    let rules = config::load(&path, defaults).map_err(|e| e.to_string())?;
    tracing::info!(path = %path.display(), domains = rules.domains().count(), "rules loaded");

    let store = open_store(&args)?;
    let rules = Arc::new(ArcSwap::from_pointee(rules));
    let service = Arc::new(Service::new(rules, store, defaults));

    let grpc = bind(args.grpc_addr(), "gRPC").await?;
    let http = bind(args.http_addr(), "HTTP").await?;
    let grpc_addr = grpc.local_addr().map_err(|e| e.to_string())?;
    let http_addr = http.local_addr().map_err(|e| e.to_string())?;
    // Tests and scripts wait for this line; binding port 0 makes it the only way to learn
    // the ports.
    println!("tollgate listening grpc={grpc_addr} http={http_addr}");
    tracing::info!(%grpc_addr, %http_addr, "listening");

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutting down");
        let _ = stop_tx.send(true);
    });

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<RateLimitServiceServer<GrpcService>>()
        .await;
    health
        .set_service_status("ratelimit", tonic_health::ServingStatus::Serving)
        .await;

    let grpc_server = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(GrpcService::server(service.clone()))
        .serve_with_incoming_shutdown(
            TcpIncoming::from(grpc).with_nodelay(Some(true)),
            stopped(stop_rx.clone()),
        );
    let http_server =
        axum::serve(http, crate::admin::router(service)).with_graceful_shutdown(stopped(stop_rx));
    let (grpc_result, http_result) = tokio::join!(grpc_server, http_server);
    grpc_result.map_err(|e| format!("gRPC server failed: {e}"))?;
    http_result.map_err(|e| format!("HTTP server failed: {e}"))
}

/// The counter store the settings ask for.
fn open_store(args: &ServeArgs) -> Result<Store, String> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let max_counters = usize::try_from(args.max_counters).unwrap_or(usize::MAX);
    let settings = &args.store;
    match settings.backend() {
        Backend::Memory => {
            let memory = MemoryStore::new(max_counters, clock);
            memory.spawn_sweeper(SWEEP_PERIOD);
            Ok(Store::Memory(memory))
        }
        Backend::Redis => {
            let url = settings
                .redis_url
                .as_deref()
                .ok_or("BACKEND_TYPE=redis needs REDIS_URL (--redis-url)")?;
            let target = Target::parse(
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
                max_local: max_counters,
            };
            Ok(Store::Redis(Box::new(RedisStore::start(
                config,
                clock,
                SWEEP_PERIOD,
            ))))
        }
    }
}

async fn bind(addr: std::net::SocketAddr, what: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen for {what} on {addr}: {e}"))
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn wait_for_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}
