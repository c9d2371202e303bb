//! Tracing: spans exported over OTLP/gRPC and OTLP/HTTP to a real collector, continuing
//! the trace the caller propagated (W3C `traceparent`, B3), with the domain, descriptor
//! count and decision, a child span per Redis round trip, and nothing at all when off.

use std::time::Duration;

use tollgate_testkit::grpc::{Rls, request};
use tollgate_testkit::otlp::{Collector, Span};
use tollgate_testkit::process::Signal;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{Serve, Server};
use tonic::metadata::MetadataValue;

const RULES: &str =
    "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1}}\n";
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

/// Tollgate tracing to `collector` over `protocol`, exporting batches every 50 ms.
fn traced(collector: &Collector, protocol: &str) -> Serve {
    Serve::rules(RULES)
        .env("TRACING_ENABLED", "true")
        .env("TRACING_EXPORTER_PROTOCOL", protocol)
        .env("TRACING_SERVICE_NAME", "tollgate-test")
        .env("TRACING_SERVICE_NAMESPACE", "edge")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
}

async fn start(serve: Serve) -> Server {
    tokio::task::spawn_blocking(move || serve.start())
        .await
        .expect("start tollgate")
}

/// Two calls on one descriptor (OK, then OVER_LIMIT), each with `headers`.
async fn call_twice(server: &Server, headers: &[(&'static str, &'static str)]) {
    let mut rls = server.client().await;
    for _ in 0..2 {
        let mut req = tonic::Request::new(request("d", &[&[("k", "v")]]));
        for (name, value) in headers {
            req.metadata_mut()
                .insert(*name, MetadataValue::from_static(value));
        }
        call(&mut rls, req).await;
    }
}

async fn call(
    rls: &mut Rls,
    req: tonic::Request<envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest>,
) {
    rls.inner.should_rate_limit(req).await.expect("an answer");
}

fn continues_the_caller(span: &Span) -> bool {
    span.trace_id == TRACE && span.parent_span_id == PARENT
}

fn assert_request_span(span: &Span) {
    assert_eq!(span.attribute("domain"), Some("d"), "{span:#?}");
    assert_eq!(span.attribute("descriptors"), Some("1"), "{span:#?}");
    assert_eq!(
        span.resource("service.name"),
        Some("tollgate-test"),
        "{span:#?}"
    );
    assert_eq!(
        span.resource("service.namespace"),
        Some("edge"),
        "{span:#?}"
    );
    assert!(span.resource("service.instance.id").is_some(), "{span:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_export_continues_a_w3c_trace_with_the_decision() {
    let collector = Collector::grpc().await;
    let server = start(traced(&collector, "grpc")).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    call_twice(&server, &[("traceparent", traceparent)]).await;
    for decision in ["OK", "OVER_LIMIT"] {
        let span = collector
            .wait_for("ShouldRateLimit", |s| {
                continues_the_caller(s) && s.attribute("decision") == Some(decision)
            })
            .await;
        assert_request_span(&span);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_export_continues_a_b3_trace() {
    let collector = Collector::http().await;
    let server = start(traced(&collector, "http")).await;
    call_twice(
        &server,
        &[
            ("x-b3-traceid", TRACE),
            ("x-b3-spanid", PARENT),
            ("x-b3-sampled", "1"),
        ],
    )
    .await;
    let span = collector
        .wait_for("ShouldRateLimit", continues_the_caller)
        .await;
    assert_request_span(&span);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_redis_round_trip_is_a_child_span() {
    let redis = RedisServer::start();
    let collector = Collector::grpc().await;
    let server = traced(&collector, "grpc")
        .redis("single", &redis.url())
        .start_connected()
        .await;
    call_twice(
        &server,
        &[("b3", "4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1")],
    )
    .await;
    let parent = collector
        .wait_for("ShouldRateLimit", |s| {
            continues_the_caller(s) && s.attribute("decision") == Some("OK")
        })
        .await;
    let child = collector
        .wait_for("Redis round trip", |s| s.parent_span_id == parent.span_id)
        .await;
    assert_eq!(child.trace_id, TRACE);
}

/// With tracing off nothing is exported, even at shutdown, when an enabled exporter would
/// flush what it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracing_off_exports_nothing() {
    let collector = Collector::grpc().await;
    let mut server = start(traced(&collector, "grpc").env("TRACING_ENABLED", "false")).await;
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    call_twice(&server, &[("traceparent", traceparent)]).await;
    server.signal(Signal::Term);
    let finished = server.wait_exit(Duration::from_secs(30));
    assert!(finished.status.success(), "{}", finished.stderr);
    assert!(collector.spans().is_empty(), "{:#?}", collector.spans());

    // The same, enabled: the flush at shutdown delivers the spans.
    let mut enabled =
        start(traced(&collector, "grpc").env("OTEL_BSP_SCHEDULE_DELAY", "600000")).await;
    call_twice(&enabled, &[("traceparent", traceparent)]).await;
    enabled.signal(Signal::Term);
    let finished = enabled.wait_exit(Duration::from_secs(30));
    assert!(finished.status.success(), "{}", finished.stderr);
    assert_eq!(collector.spans().len(), 2, "{:#?}", collector.spans());
}
