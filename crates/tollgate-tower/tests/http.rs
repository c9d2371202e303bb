//! The layer through real requests: the example service (per client and path, memory),
//! a gRPC service, and two replicas of a service sharing their limits through Redis.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use tollgate_testkit::http::{self, Method};
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::core::store::redis::{RedisConfig, RedisKind, RedisTarget, RedisTls};
use tollgate_tower::core::store::{SharedBehaviour, SharedStore};
use tollgate_tower::core::{Capacity, Limiter, OnStoreError, Rules, Store, SystemClock};
use tollgate_tower::{RateLimitLayer, extract};

// The example's `main` is not called here; its `app` is what is tested.
#[allow(dead_code)]
#[path = "../examples/per_client_ip_and_path.rs"]
mod example;

/// Serves `app` on a free loopback port, with each connection's peer address known.
async fn serve(app: Router) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let service = app.into_make_service_with_connect_info::<SocketAddr>();
    tokio::spawn(async move { axum::serve(listener, service).await });
    addr
}

#[tokio::test]
async fn the_example_limits_each_client_per_path() {
    let addr = serve(example::app().expect("the example's rules are valid")).await;
    for left in (0..10).rev() {
        let ok = http::get(addr, "/hello").await;
        assert_eq!(ok.status, 200, "{ok:?}");
        assert_eq!(ok.body, "hello\n");
        let remaining = format!("\"descriptor-0\";r={left};");
        assert!(
            ok.header("ratelimit")
                .is_some_and(|h| h.starts_with(&remaining)),
            "{ok:?}"
        );
        assert_eq!(
            ok.header("ratelimit-policy"),
            Some("\"descriptor-0\";q=10;w=1")
        );
    }
    let denied = http::get(addr, "/hello").await;
    assert_eq!(denied.status, 429, "{denied:?}");
    assert_eq!(
        denied.header_u64("retry-after"),
        1,
        "one token refills in 0.1 s"
    );
    // Another path of the same client has its own bucket; /login a stricter one.
    for _ in 0..3 {
        let login = http::send(addr, Method::POST, "/login", &[], "")
            .await
            .expect("send");
        assert_eq!(login.status, 200, "{login:?}");
    }
    let login = http::send(addr, Method::POST, "/login", &[], "")
        .await
        .expect("send");
    assert_eq!(login.status, 429);
    assert_eq!(
        login.header_u64("retry-after"),
        20,
        "3 a minute: one every 20 s"
    );
}

#[tokio::test]
async fn grpc_calls_over_the_limit_get_resource_exhausted() {
    let rules = Rules::from_yaml(
        "grpc.yaml",
        "domain: grpc\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    )
    .expect("valid rules");
    let limiter = Arc::new(Limiter::new(rules, Store::Memory(Default::default())));
    let layer = RateLimitLayer::new(limiter, "grpc", |req: &axum::http::Request<_>| {
        vec![tollgate_tower::core::Descriptor::from(vec![extract::path(
            req,
        )])]
    });
    let (_, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let incoming = tonic::transport::server::TcpIncoming::from(listener);
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(health)
            .serve_with_incoming(incoming),
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let check = tonic_health::pb::HealthCheckRequest::default();
    let mut codes = Vec::new();
    for _ in 0..3 {
        codes.push(match client.check(check.clone()).await {
            Ok(_) => tonic::Code::Ok,
            Err(status) => status.code(),
        });
    }
    assert_eq!(
        codes,
        [
            tonic::Code::Ok,
            tonic::Code::Ok,
            tonic::Code::ResourceExhausted
        ]
    );
}

/// A service replica limited through the shared Redis, per API key.
async fn replica(redis: &RedisServer) -> SocketAddr {
    let rules = Rules::from_yaml(
        "replica.yaml",
        "domain: svc\ndescriptors:\n  - key: x-api-key\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .expect("valid rules");
    let config = RedisConfig {
        target: RedisTarget::parse(&redis.url(), RedisKind::Single, None, false)
            .expect("a Redis URL"),
        tls: RedisTls::default(),
        key_prefix: "tower:".into(),
        behaviour: SharedBehaviour {
            timeout: Duration::from_secs(1),
            on_error: OnStoreError::Error,
            local_capacity: Capacity::default(),
        },
    };
    let store = SharedStore::redis(config, Arc::new(SystemClock), Duration::from_secs(1));
    assert!(
        store.wait_up(Duration::from_secs(10)).await,
        "Redis answers"
    );
    let limiter = Arc::new(Limiter::new(rules, Store::Shared(store)));
    let layer = RateLimitLayer::new(limiter, "svc", |req: &axum::http::Request<_>| {
        extract::header(req, "x-api-key")
            .map(|key| vec![tollgate_tower::core::Descriptor::from(vec![key])])
            .unwrap_or_default()
    })
    .deny_on_error(true);
    serve(
        Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .layer(layer),
    )
    .await
}

#[tokio::test]
async fn replicas_share_their_limits_through_redis() {
    let redis = RedisServer::start();
    let replicas = [replica(&redis).await, replica(&redis).await];
    let mut statuses = Vec::new();
    for i in 0..8 {
        let response = http::get_with(replicas[i % 2], "/", &[("x-api-key", "k1")]).await;
        statuses.push(response.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    // Another key has its own limit, on either replica.
    let other = http::get_with(replicas[1], "/", &[("x-api-key", "k2")]).await;
    assert_eq!(other.status, 200);
    // Requests that name no key are not limited at all.
    assert_eq!(http::get(replicas[0], "/").await.status, 200);
}
