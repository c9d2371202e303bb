//! The layer through real requests on real servers: the crate's example served with and
//! without connect info, gRPC, replicas sharing a real redis-server, an unknown domain,
//! and the 429 body hook; what the layer logs is read back from a captured log.

mod denial_body;
mod example;
mod grpc;
mod logs;
mod redis;
mod unknown_domain;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use tollgate_tower::core::{Limiter, Rules, Store};

/// A limiter on the rules `yaml`, counting in memory.
fn memory_limiter(yaml: &str) -> Arc<Limiter> {
    let rules = Rules::from_yaml("rules.yaml", yaml).expect("valid rules");
    Arc::new(Limiter::new(rules, Store::Memory(Default::default())))
}

/// A service answering `GET /` with `ok`, to put a layer on.
fn ok_app() -> Router {
    Router::new().route("/", axum::routing::get(|| async { "ok" }))
}

/// Serves `app` on a free loopback port the usual way (`axum::serve(listener, app)`):
/// requests carry no peer address.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// Serves `app` on a free loopback port with each connection's peer address known.
async fn serve_with_peers(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });
    addr
}
