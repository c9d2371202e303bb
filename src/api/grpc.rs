//! The gRPC adapter: `envoy.service.ratelimit.v3.RateLimitService` over [`App`].
//!
//! Served by hand rather than through the generated server so that a request that is not
//! a valid `RateLimitRequest` (bad protobuf, invalid UTF-8 in a string) is answered
//! INVALID_ARGUMENT with the reason, as for any other malformed request; the generated
//! codec answers INTERNAL.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use prost::Message;
use tollgate_core::DecideError;
use tonic::body::Body;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::server::{Grpc, NamedService, UnaryService};
use tonic::{Request, Response, Status};
use tonic_prost::{ProstCodec, ProstEncoder};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

use crate::app::{App, RlsError};
use crate::ops::trace;

/// The one method served.
const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Serves [`App`] to Envoy; messages larger than `max_message_bytes` are refused. With
/// `traced`, each call is a span in the trace the caller propagated.
#[derive(Clone)]
pub(crate) struct GrpcService {
    app: Arc<App>,
    max_message_bytes: usize,
    traced: bool,
}

impl GrpcService {
    pub(crate) fn new(app: Arc<App>, max_message_bytes: usize, traced: bool) -> Self {
        Self {
            app,
            max_message_bytes,
            traced,
        }
    }
}

impl NamedService for GrpcService {
    const NAME: &'static str = "envoy.service.ratelimit.v3.RateLimitService";
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl tower_service::Service<http::Request<Body>> for GrpcService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        if req.uri().path() != SHOULD_RATE_LIMIT {
            return Box::pin(async { Ok(Status::unimplemented("no such method").into_http()) });
        }
        let method = ShouldRateLimit {
            app: self.app.clone(),
            traced: self.traced,
        };
        let max = self.max_message_bytes;
        Box::pin(async move {
            let mut grpc = Grpc::new(RequestCodec).apply_max_message_size_config(Some(max), None);
            Ok(grpc.unary(method, req).await)
        })
    }
}

/// The method, as tonic's unary machinery calls it.
struct ShouldRateLimit {
    app: Arc<App>,
    traced: bool,
}

impl UnaryService<RateLimitRequest> for ShouldRateLimit {
    type Response = RateLimitResponse;
    type Future = BoxFuture<Result<Response<RateLimitResponse>, Status>>;

    fn call(&mut self, request: Request<RateLimitRequest>) -> Self::Future {
        let app = self.app.clone();
        if !self.traced {
            return Box::pin(async move { answer(&app, request.get_ref()).await });
        }
        let req = request.get_ref();
        let span = tracing::debug_span!(
            "ShouldRateLimit",
            domain = %req.domain,
            descriptors = req.descriptors.len(),
            decision = tracing::field::Empty,
        );
        if let Some(parent) = trace::incoming(request.metadata()) {
            // Fails only if the span is not exported (not sampled); then there is nothing to link.
            let _ = span.set_parent(parent);
        }
        Box::pin(async move {
            let answer = answer(&app, request.get_ref())
                .instrument(span.clone())
                .await;
            let decision = match &answer {
                Ok(resp) => match resp.get_ref().overall_code() {
                    Code::OverLimit => "OVER_LIMIT",
                    Code::Ok => "OK",
                    Code::Unknown => "UNKNOWN",
                },
                Err(status) => status.code().description(),
            };
            span.record("decision", decision);
            answer
        })
    }
}

/// The gRPC answer to one request.
async fn answer(app: &App, req: &RateLimitRequest) -> Result<Response<RateLimitResponse>, Status> {
    app.should_rate_limit(req)
        .await
        .map(Response::new)
        .map_err(|e| match e {
            // UNKNOWN, as the reference answers before its first config.
            RlsError::NoRules => Status::unknown(e.to_string()),
            RlsError::Decide(DecideError::InvalidArgument(why)) => {
                Status::invalid_argument(why.to_string())
            }
            RlsError::Decide(DecideError::Store(e)) => Status::unavailable(app.store_error(&e)),
        })
}

/// The first buffer for one message each way: requests and answers take a few hundred
/// bytes, and tonic's default held 8 KiB each way per call in flight. A larger message
/// grows its buffer in steps of this size.
fn message_buffer() -> BufferSettings {
    BufferSettings::new(512, 32 * 1024)
}

/// Protobuf both ways, with undecodable requests reported as the caller's fault.
struct RequestCodec;

impl Codec for RequestCodec {
    type Encode = RateLimitResponse;
    type Decode = RateLimitRequest;
    type Encoder = ProstEncoder<RateLimitResponse>;
    type Decoder = RequestDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<RateLimitResponse, RateLimitRequest>::raw_encoder(message_buffer())
    }

    fn decoder(&mut self) -> Self::Decoder {
        RequestDecoder
    }
}

struct RequestDecoder;

impl Decoder for RequestDecoder {
    type Item = RateLimitRequest;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<RateLimitRequest>, Status> {
        RateLimitRequest::decode(buf)
            .map(Some)
            .map_err(|e| Status::invalid_argument(format!("not a RateLimitRequest: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        message_buffer()
    }
}
