//! gRPC written by hand over HTTP/2, for what a well-behaved client never sends:
//! undecodable bodies, oversized or unfinished messages, and the server's HTTP/2 settings
//! as a client sees them.

use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use h2::client::SendRequest;
use hyper::http::{HeaderValue, Method, Request, Uri, header};
use tokio::net::TcpStream;

use crate::grpc::TIMEOUT;

/// The path of `ShouldRateLimit`.
pub const SHOULD_RATE_LIMIT: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
/// The path of RLQS's `StreamRateLimitQuotas`.
pub const STREAM_RATE_LIMIT_QUOTAS: &str =
    "/envoy.service.rate_limit_quota.v3.RateLimitQuotaService/StreamRateLimitQuotas";

/// How a call ended: its `grpc-status` and `grpc-message`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ended {
    pub status: i32,
    pub message: String,
}

/// One HTTP/2 connection to a gRPC port.
pub struct RawGrpc {
    send: SendRequest<Bytes>,
    connection: tokio::task::JoinHandle<Result<(), h2::Error>>,
}

impl RawGrpc {
    /// Connects and completes the HTTP/2 handshake, including the server's settings.
    pub async fn connect(addr: SocketAddr) -> Self {
        let tcp = TcpStream::connect(addr)
            .await
            .expect("connect to the gRPC port");
        let (send, connection) = h2::client::handshake(tcp).await.expect("HTTP/2 handshake");
        // The connection ends when the test drops its handle or the server closes it.
        let connection = tokio::spawn(connection);
        let send = send.ready().await.expect("connection ready");
        Self { send, connection }
    }

    /// Whether the server closes the connection within `timeout`.
    pub async fn closed_within(self, timeout: std::time::Duration) -> bool {
        tokio::time::timeout(timeout, self.connection).await.is_ok()
    }

    /// The concurrent streams the server allows this connection (its
    /// SETTINGS_MAX_CONCURRENT_STREAMS, once a call has brought its settings in).
    pub fn max_concurrent_streams(&self) -> usize {
        self.send.current_max_send_streams()
    }

    /// Sends `body` to `path` and returns how the call ended. With `finish` false the
    /// request stream stays open, as from a client that never sends the rest.
    pub async fn call(&mut self, path: &str, body: Bytes, finish: bool) -> Ended {
        let uri = format!("http://tollgate{path}")
            .parse()
            .expect("a gRPC path");
        let request = request_head(uri);
        let send = self.send.clone().ready().await.expect("stream available");
        self.send = send;
        let (response, mut stream) = self
            .send
            .send_request(request, false)
            .expect("send request head");
        stream.send_data(body, finish).expect("send body");
        let answer = tokio::time::timeout(TIMEOUT, answer(response)).await;
        let (_, ended) = answer
            .unwrap_or_else(|_| panic!("no answer to a call on {path} within {TIMEOUT:?}"))
            .expect("an answer");
        ended.unwrap_or_else(|| panic!("no grpc-status in the answer to a call on {path}"))
    }
}

/// The head of a gRPC call to `uri`.
pub(crate) fn request_head(uri: Uri) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = Method::POST;
    *head.uri_mut() = uri;
    let headers = head.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    head
}

/// A call's answer: the bytes of its body, and how it ended as its trailers say, or its
/// head for a call that failed at once ("Trailers-Only"); none if neither says.
pub(crate) async fn answer(
    response: h2::client::ResponseFuture,
) -> Result<(BytesMut, Option<Ended>), h2::Error> {
    let response = response.await?;
    if let Some(ended) = grpc_status(response.headers()) {
        return Ok((BytesMut::new(), Some(ended)));
    }
    let mut body = response.into_body();
    let mut bytes = BytesMut::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        body.flow_control().release_capacity(chunk.len())?;
        bytes.extend_from_slice(&chunk);
    }
    let trailers = body.trailers().await?;
    Ok((bytes, trailers.as_ref().and_then(grpc_status)))
}

/// A gRPC message frame: uncompressed, length-prefixed `message`.
pub fn frame(message: &[u8]) -> Bytes {
    let mut out = frame_head(u32::try_from(message.len()).expect("message under 4 GiB"));
    out.put_slice(message);
    out.freeze()
}

/// The five bytes that announce an uncompressed message of `len` bytes, with room for
/// the message after them.
pub fn frame_head(len: u32) -> BytesMut {
    let mut out = BytesMut::with_capacity(5 + len as usize);
    out.put_u8(0);
    out.put_u32(len);
    out
}

/// How a call ended, as `headers` (the answer's head or its trailers) say; none if they
/// carry no `grpc-status`.
pub(crate) fn grpc_status(headers: &hyper::http::HeaderMap) -> Option<Ended> {
    let status = headers.get("grpc-status")?.to_str().ok()?.parse().ok()?;
    let message = headers
        .get("grpc-message")
        .map(|m| percent_decode(m.as_bytes()))
        .unwrap_or_default();
    Some(Ended { status, message })
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2, "Responses").
fn percent_decode(encoded: &[u8]) -> String {
    let mut out = Vec::with_capacity(encoded.len());
    let mut rest = encoded;
    while let Some((&byte, tail)) = rest.split_first() {
        let hex = tail
            .get(..2)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (byte, hex) {
            (b'%', Some(decoded)) => {
                out.push(decoded);
                rest = &tail[2..];
            }
            _ => {
                out.push(byte);
                rest = tail;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
