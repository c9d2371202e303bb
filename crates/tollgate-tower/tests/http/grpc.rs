//! A tonic service behind the layer: calls over the limit get `RESOURCE_EXHAUSTED`.

use tollgate_tower::core::Descriptor;
use tollgate_tower::{RateLimitLayer, extract};

use crate::memory_limiter;

#[tokio::test]
async fn grpc_calls_over_the_limit_get_resource_exhausted() {
    let limiter = memory_limiter(
        "domain: grpc\ndescriptors:\n  - key: path\n    rate_limit: {unit: minute, requests_per_unit: 2}\n",
    );
    let layer = RateLimitLayer::new(limiter, "grpc", |req| {
        Ok(vec![Descriptor::from(vec![extract::path(req)])])
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
