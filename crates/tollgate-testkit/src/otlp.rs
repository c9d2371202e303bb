//! An OpenTelemetry collector for the tests: it receives spans over OTLP/gRPC
//! (`TraceService/Export`) or OTLP/HTTP (`POST /v1/traces`, protobuf), decodes the real
//! protobuf and keeps what the tests look at.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use prost::Message;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::TcpListenerStream;

use crate::wait;

/// One span as received.
#[derive(Debug, Clone)]
pub struct Span {
    pub name: String,
    /// Lower-case hex, as in `traceparent`.
    pub trace_id: String,
    pub span_id: String,
    /// Empty for a root span.
    pub parent_span_id: String,
    /// String forms of the span's attributes.
    pub attributes: Vec<(String, String)>,
    /// The resource's attributes (service.name, …).
    pub resource: Vec<(String, String)>,
}

impl Span {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        find(&self.attributes, key)
    }

    pub fn resource(&self, key: &str) -> Option<&str> {
        find(&self.resource, key)
    }
}

fn find<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// A running collector; stops when dropped.
pub struct Collector {
    pub addr: SocketAddr,
    spans: Arc<Mutex<Vec<Span>>>,
    task: JoinHandle<()>,
}

impl Collector {
    /// OTLP/gRPC on a free loopback port.
    pub async fn grpc() -> Self {
        let (listener, addr) = bind().await;
        let spans = Arc::default();
        let service = TraceServiceServer::new(Receiver(Arc::clone(&spans)));
        let task = tokio::spawn(async move {
            // Serves until the test drops the collector.
            let _ = tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(TcpListenerStream::new(listener))
                .await;
        });
        Self { addr, spans, task }
    }

    /// OTLP/HTTP (protobuf) on a free loopback port.
    pub async fn http() -> Self {
        let (listener, addr) = bind().await;
        let spans: Arc<Mutex<Vec<Span>>> = Arc::default();
        let store = Arc::clone(&spans);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let store = Arc::clone(&store);
                let answer = service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
                    let store = Arc::clone(&store);
                    async move {
                        let ok = request.uri().path() == "/v1/traces";
                        let body = request.into_body().collect().await.map(|b| b.to_bytes());
                        let decoded = body
                            .ok()
                            .and_then(|b| ExportTraceServiceRequest::decode(b).ok());
                        let status = match (ok, decoded) {
                            (true, Some(export)) => {
                                keep(&store, export);
                                200
                            }
                            _ => 400,
                        };
                        let reply = ExportTraceServiceResponse::default().encode_to_vec();
                        let mut response = hyper::Response::new(Full::new(Bytes::from(reply)));
                        *response.status_mut() =
                            hyper::StatusCode::from_u16(status).unwrap_or_default();
                        response.headers_mut().insert(
                            hyper::header::CONTENT_TYPE,
                            hyper::header::HeaderValue::from_static("application/x-protobuf"),
                        );
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), answer)
                        .await;
                });
            }
        });
        Self { addr, spans, task }
    }

    /// The endpoint to give OTEL_EXPORTER_OTLP_ENDPOINT.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<Span> {
        self.spans.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Waits for a span named `name` that `matches`.
    pub async fn wait_for(&self, name: &str, matches: impl Fn(&Span) -> bool) -> Span {
        self.wait_for_span(|s| s.name == name && matches(s)).await
    }

    /// Waits for a span that `matches`.
    pub async fn wait_for_span(&self, matches: impl Fn(&Span) -> bool) -> Span {
        wait::until_async("a span as expected", Duration::from_secs(30), async || {
            self.spans()
                .into_iter()
                .find(&matches)
                .ok_or_else(|| format!("received: {:#?}", self.spans()))
        })
        .await
        .0
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn bind() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the collector");
    let addr = listener.local_addr().expect("the collector's address");
    (listener, addr)
}

struct Receiver(Arc<Mutex<Vec<Span>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        keep(&self.0, request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn keep(store: &Mutex<Vec<Span>>, export: ExportTraceServiceRequest) {
    let mut spans = store.lock().unwrap_or_else(|p| p.into_inner());
    for resource_spans in export.resource_spans {
        let resource = resource_spans
            .resource
            .map(|r| pairs(r.attributes))
            .unwrap_or_default();
        for scope in resource_spans.scope_spans {
            for span in scope.spans {
                spans.push(Span {
                    name: span.name,
                    trace_id: hex(&span.trace_id),
                    span_id: hex(&span.span_id),
                    parent_span_id: hex(&span.parent_span_id),
                    attributes: pairs(span.attributes),
                    resource: resource.clone(),
                });
            }
        }
    }
}

fn pairs(
    attributes: Vec<opentelemetry_proto::tonic::common::v1::KeyValue>,
) -> Vec<(String, String)> {
    attributes
        .into_iter()
        .map(|kv| {
            let value = match kv.value.and_then(|v| v.value) {
                Some(Value::StringValue(s)) => s,
                Some(Value::IntValue(i)) => i.to_string(),
                Some(Value::BoolValue(b)) => b.to_string(),
                Some(Value::DoubleValue(d)) => d.to_string(),
                other => format!("{other:?}"),
            };
            (kv.key, value)
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
