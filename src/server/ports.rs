//! The listeners: bound at startup, served until the stop, then a grace period for the
//! calls in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_core::{Clock, LogLimit, SystemClock};

use super::health::{report_health, serving_status, set_health};
use super::signals::stopped;
use crate::api::grpc::GrpcService;
use crate::app::App;
use crate::config::settings::{ConnArgs, ServeArgs};
use crate::net::listen::{self, Acceptor, MarkFirstRequestLayer, PortTls};
use crate::net::tls::{Port, ServerTls};
use crate::ops::admin;
use crate::ops::admin_state::Admin;
use crate::ops::debug_port;
use crate::ops::reset;
use crate::rlqs::{Rlqs, RlqsService};

/// Request headers a gRPC client may send; Envoy's are a few hundred bytes.
const HEADER_LIST_BYTES: u32 = 16 << 10;
/// Flow-control windows: what a client may have in flight before Tollgate reads it.
const STREAM_WINDOW_BYTES: u32 = 64 << 10;
const CONNECTION_WINDOW_BYTES: u32 = 1 << 20;
/// Calls a client cancelled before Tollgate took them up, per allowed concurrent stream.
/// After a stall (a paused or CPU-throttled instance) Envoy's cancellations of the calls
/// it timed out meanwhile arrive together; h2 closes the connection past 20 of them, and
/// every other call on it with it. At 128 streams this allows 1,024: at 1,000 calls a
/// second, a stall of a second. Each holds at most its head (HEADER_LIST_BYTES) until
/// taken up, so what a client can make Tollgate hold stays in proportion to its streams.
const CANCELLED_PER_STREAM: usize = 8;
/// How long calls in flight get to finish once the listeners are closed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// Where the gRPC and HTTP ports listen: the settings' addresses, bound when the server
/// is ready to serve, or listeners bound already (on port 0, say, in tests).
pub enum Listeners {
    FromSettings,
    Bound {
        grpc: std::net::TcpListener,
        http: std::net::TcpListener,
    },
}

/// The listeners, bound.
pub(super) struct Ports {
    grpc: TcpListener,
    http: TcpListener,
    prometheus: Option<TcpListener>,
    debug: Option<TcpListener>,
}

impl Ports {
    /// Binds every port the settings ask for and prints the line tests and scripts wait
    /// for (with port 0 it is how they learn the ports); logs one line of what is served
    /// where: the store (`store`, its name) and every listener.
    pub(super) async fn bind(
        args: &ServeArgs,
        listeners: Listeners,
        store: &str,
    ) -> anyhow::Result<Self> {
        let (grpc, http) = match listeners {
            Listeners::FromSettings => (
                bind(args.grpc_addr(), "gRPC").await?,
                bind(args.http_addr(), "HTTP").await?,
            ),
            Listeners::Bound { grpc, http } => (adopt(grpc, "gRPC")?, adopt(http, "HTTP")?),
        };
        let prometheus = match args.ops.use_prometheus {
            true => Some(bind(args.ops.prometheus_addr, "Prometheus").await?),
            false => None,
        };
        let debug = match args.ops.debug_port.0 {
            Some(port) => bind_debug(SocketAddr::new(args.ops.debug_host, port)).await,
            None => None,
        };
        let grpc_addr = grpc.local_addr()?;
        let http_addr = http.local_addr()?;
        let mut listeners = format!("grpc {grpc_addr}, http {http_addr}");
        let extra = [("prometheus", &prometheus), ("debug", &debug)];
        for (what, listener) in extra {
            if let Some(addr) = listener.as_ref().and_then(|l| l.local_addr().ok()) {
                listeners.push_str(&format!(", {what} {addr}"));
            }
        }
        tracing::info!("serving: store {store}; listening {listeners}");
        // After the log line, so that whoever reads this one finds that one written.
        println!("tollgate listening grpc={grpc_addr} http={http_addr}");
        Ok(Self {
            grpc,
            http,
            prometheus,
            debug,
        })
    }
}

/// What the ports serve, and whether the server is draining (health fails meanwhile).
pub(super) struct Services {
    pub(super) app: Arc<App>,
    pub(super) rlqs: Option<Arc<Rlqs>>,
    pub(super) draining: watch::Receiver<bool>,
}

/// Serves every port until `stop` says so, then gives calls in flight a grace period.
pub(super) async fn serve(
    args: &ServeArgs,
    ports: Ports,
    services: Services,
    server_tls: Option<Arc<ServerTls>>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Services {
        app,
        rlqs,
        draining,
    } = services;
    let (health, health_service) = tonic_health::server::health_reporter();
    // Health is answered from the first connection on: set it before anything is served.
    set_health(&health, serving_status(app.status.readiness(), false)).await;
    tokio::spawn(report_health(
        health,
        app.status.subscribe(),
        draining.clone(),
    ));
    let admin = Admin {
        app: app.clone(),
        draining,
        admin_token: args.ops.admin_token.clone().map(Arc::from),
        refused_resets: Arc::new(LogLimit::new(reset::REFUSAL_LOG_PERIOD)),
    };
    let limits = args.conn.limits();
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let grpc_tls = server_tls
        .clone()
        .map(|tls| PortTls::new(tls, Port::Grpc, clock.clone()));
    let http_tls = server_tls
        .filter(|_| args.tls.http_server_use_tls)
        .map(|tls| PortTls::new(tls, Port::Http, clock));
    let grpc_server = grpc_builder(&args.conn)
        .layer(MarkFirstRequestLayer)
        .add_service(health_service)
        .add_service(GrpcService::new(
            app.clone(),
            args.conn.grpc_max_message_bytes,
            args.tracing.tracing_enabled,
        ))
        .add_optional_service(rlqs.map(|rlqs| {
            RateLimitQuotaServiceServer::new(RlqsService(rlqs))
                .max_decoding_message_size(args.conn.grpc_max_message_bytes)
        }))
        .serve_with_incoming_shutdown(
            Acceptor::new(ports.grpc, args.conn.grpc_limits(), grpc_tls).incoming(),
            stopped(stop.clone()),
        );
    let http_acceptor = Acceptor::new(ports.http, limits, http_tls.clone());
    let http_server =
        listen::serve_http(http_acceptor, admin::router(admin), stopped(stop.clone()));
    let debug_server = async {
        if let Some(listener) = ports.debug {
            let acceptor = Acceptor::new(listener, limits, None);
            let router = debug_port::router(app.clone());
            listen::serve_http(acceptor, router, stopped(stop.clone())).await;
        }
    };
    let prometheus_server = async {
        if let Some(listener) = ports.prometheus {
            let router = axum::Router::new()
                .route(
                    &args.ops.prometheus_path,
                    axum::routing::get(admin::metrics),
                )
                .with_state(app.clone());
            let acceptor = Acceptor::new(listener, limits, http_tls);
            listen::serve_http(acceptor, router, stopped(stop.clone())).await;
        }
    };
    let servers = async {
        let (grpc, (), (), ()) =
            tokio::join!(grpc_server, http_server, prometheus_server, debug_server);
        grpc
    };
    // Envoy keeps its HTTP/2 connections open for good: once the listeners are closed, give
    // calls in flight a grace period, then stop whatever is still connected.
    let grace_over = async {
        stopped(stop.clone()).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        grpc_result = servers => grpc_result.context("gRPC server failed"),
        () = grace_over => {
            tracing::info!("closing connections still open after {SHUTDOWN_GRACE:?}");
            Ok(())
        }
    }
}

/// The debug port's listener; a debug port that cannot be bound is logged, not fatal (the
/// reference's instances share theirs with SO_REUSEPORT, so manifests may start several).
async fn bind_debug(addr: SocketAddr) -> Option<TcpListener> {
    match TcpListener::bind(addr).await {
        Ok(listener) => Some(listener),
        Err(e) => {
            tracing::warn!("debug port {addr} not served: {e}");
            None
        }
    }
}

/// The gRPC server with its per-connection limits (streams, header size, buffered bytes)
/// and lifetime (age, keepalive).
fn grpc_builder(conn: &ConnArgs) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(conn.grpc_max_concurrent_streams)
        .http2_max_pending_accept_reset_streams(Some(
            usize::try_from(conn.grpc_max_concurrent_streams)
                .unwrap_or(usize::MAX)
                .saturating_mul(CANCELLED_PER_STREAM),
        ))
        .http2_max_header_list_size(HEADER_LIST_BYTES)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        // Only the age: tonic 0.14 with a grace set skips the polite GOAWAY and cuts the
        // connection at age + grace. The cut is the acceptor's (`ConnArgs::grpc_limits`).
        .max_connection_age(conn.grpc_max_connection_age)
        .http2_keepalive_interval(Some(conn.grpc_keepalive_time))
        .http2_keepalive_timeout(Some(conn.grpc_keepalive_timeout))
}

async fn bind(addr: std::net::SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for {what} on {addr}"))
}

/// A listener bound by the caller, served on this runtime.
fn adopt(listener: std::net::TcpListener, what: &str) -> anyhow::Result<TcpListener> {
    listener
        .set_nonblocking(true)
        .and_then(|()| TcpListener::from_std(listener))
        .with_context(|| format!("cannot serve {what} on the listener given"))
}
