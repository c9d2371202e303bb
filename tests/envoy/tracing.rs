//! A trace through Envoy into Tollgate: Envoy (the example configuration with its
//! OpenTelemetry tracer on) continues the client's `traceparent`, and Tollgate's
//! `ShouldRateLimit` span arrives at the collector in that trace, as a child of the span
//! Envoy made for its call to Tollgate.

use tollgate_testkit::envoy::{Envoy, Params, Upstream, render};
use tollgate_testkit::otlp::Collector;
use tollgate_testkit::tollgate::Server;

use crate::support::{EXAMPLE_ENVOY_YAML, tollgate};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// The example configuration with Envoy's OpenTelemetry tracer exporting to `collector`.
fn traced_envoy_yaml(upstream: &Upstream, tollgate: &Server, collector: &Collector) -> String {
    let params = Params {
        upstream: upstream.addr,
        ratelimit: tollgate.grpc_addr(),
        failure_mode_deny: true,
    };
    let yaml = render(EXAMPLE_ENVOY_YAML, &params);
    let hook = "use_remote_address: true\n";
    assert_eq!(yaml.matches(hook).count(), 1, "the example changed");
    let indent = " ".repeat(16);
    let tracer = [
        "tracing:",
        "  provider:",
        "    name: envoy.tracers.opentelemetry",
        "    typed_config:",
        "      \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig",
        "      grpc_service: { envoy_grpc: { cluster_name: otel } }",
        "      service_name: envoy",
    ]
    .map(|line| format!("{indent}{line}\n"))
    .concat();
    let cluster = format!(
        r#"
    - name: otel
      type: STATIC
      connect_timeout: 1s
      typed_extension_protocol_options:
        envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
          "@type": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
          explicit_http_config: {{ http2_protocol_options: {{}} }}
      load_assignment:
        cluster_name: otel
        endpoints:
          - lb_endpoints:
              - endpoint:
                  address:
                    socket_address: {{ address: 127.0.0.1, port_value: {} }}
"#,
        collector.addr.port()
    );
    yaml.replace(hook, &format!("{hook}{tracer}")) + &cluster
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_s_span_joins_the_trace_envoy_propagates() {
    let collector = Collector::grpc().await;
    let tollgate = tollgate()
        .env("TRACING_ENABLED", "true")
        .env("TRACING_EXPORTER_PROTOCOL", "grpc")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint())
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .start();
    let upstream = Upstream::start().await;
    let envoy = Envoy::start(&traced_envoy_yaml(&upstream, &tollgate, &collector)).await;
    let client_span = "00f067aa0ba902b7";
    let traceparent = format!("00-{TRACE}-{client_span}-01");
    let resp = envoy
        .get(
            "/orders",
            &[("traceparent", &traceparent), ("x-api-key", "traced")],
        )
        .await;
    assert_eq!(resp.status, 200, "{resp:?}");

    let ours = collector
        .wait_for("ShouldRateLimit", |s| s.trace_id == TRACE)
        .await;
    assert_eq!(ours.attribute("domain"), Some("edge"));
    assert_eq!(ours.attribute("decision"), Some("OK"));
    assert_ne!(
        ours.parent_span_id, client_span,
        "Envoy's own span in between"
    );
    // Envoy exports its spans too (every 5 s): the parent is one of them, in the trace.
    let parent = ours.parent_span_id.clone();
    let envoys = collector.wait_for_span(|s| s.span_id == parent).await;
    assert_eq!(envoys.trace_id, TRACE);
    assert_eq!(envoys.resource("service.name"), Some("envoy"));
}
