//! The rate-limit API over one HTTP/2 connection that h2 drives directly: the load
//! benchmark's client. It shares the machine's cores with the servers it measures, so
//! it takes the least CPU per call it can: no channel task between a caller and the
//! connection (tonic's `Channel` hands every call to one) and no streaming codec; the
//! request is encoded into its one frame and the answer decoded from the one it gets.

use std::error::Error;
use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};
use h2::client::SendRequest;
use hyper::http::{HeaderMap, HeaderValue, Method, Request, Uri, header};
use prost::Message;
use tokio::net::TcpStream;

use crate::grpc::{RateLimitRequest, RateLimitResponse};
use crate::load::Call;
use crate::raw_grpc::{Ended, SHOULD_RATE_LIMIT, frame_head, grpc_status};

type BoxError = Box<dyn Error + Send + Sync>;

/// A client of `ShouldRateLimit`; clones share one HTTP/2 connection.
#[derive(Clone)]
pub struct H2Rls {
    send: SendRequest<Bytes>,
    uri: Uri,
}

impl H2Rls {
    /// Connects to `addr` and completes the HTTP/2 handshake; the connection is driven by
    /// a task of its own until every clone is dropped or the server closes it.
    pub async fn connect(addr: SocketAddr) -> Result<Self, BoxError> {
        let tcp = TcpStream::connect(addr).await?;
        tcp.set_nodelay(true)?;
        // The windows hyper's clients (tonic's) advertise. h2's own 64 KiB would also
        // bound what the connection may hold of answers not yet read to about 160
        // (h2 counts each as a small DATA frame), and an open loop that falls behind
        // holds more: h2 would close the connection with ENHANCE_YOUR_CALM.
        let (send, connection) = h2::client::Builder::new()
            .initial_window_size(2 << 20)
            .initial_connection_window_size(5 << 20)
            .handshake(tcp)
            .await?;
        // Its end is seen by the callers, as a failed call.
        tokio::spawn(connection);
        let uri = format!("http://{addr}{SHOULD_RATE_LIMIT}").parse()?;
        Ok(Self {
            send: send.ready().await?,
            uri,
        })
    }

    async fn call(&mut self, req: RateLimitRequest) -> Result<RateLimitResponse, BoxError> {
        let mut head = Request::new(());
        *head.method_mut() = Method::POST;
        *head.uri_mut() = self.uri.clone();
        let headers = head.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/grpc"),
        );
        headers.insert(header::TE, HeaderValue::from_static("trailers"));
        let mut send = self.send.clone().ready().await?;
        let (response, mut stream) = send.send_request(head, false)?;
        stream.send_data(framed(&req)?, true)?;
        let response = response.await?;
        // A call that fails at once answers with headers only ("Trailers-Only").
        ended(response.headers())?;
        let mut body = response.into_body();
        let mut message = BytesMut::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk?;
            body.flow_control().release_capacity(chunk.len())?;
            message.extend_from_slice(&chunk);
        }
        match body.trailers().await? {
            Some(trailers) => ended(&trailers)?,
            None => return Err("the answer has no trailers".into()),
        }
        let message = message
            .get(5..)
            .ok_or("the answer holds no message frame")?;
        Ok(RateLimitResponse::decode(message)?)
    }
}

impl Call for H2Rls {
    async fn call(&mut self, req: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        H2Rls::call(self, req)
            .await
            .map_err(|e| match e.downcast::<tonic::Status>() {
                Ok(status) => *status,
                Err(e) => tonic::Status::unavailable(e.to_string()),
            })
    }
}

/// `req` as one uncompressed gRPC message frame.
fn framed(req: &RateLimitRequest) -> Result<Bytes, BoxError> {
    let mut frame = frame_head(u32::try_from(req.encoded_len())?);
    req.encode(&mut frame)?;
    Ok(frame.freeze())
}

/// Ok while `headers` carry no `grpc-status` or carry OK; the status otherwise.
fn ended(headers: &HeaderMap) -> Result<(), tonic::Status> {
    match grpc_status(headers) {
        Some(Ended { status, message }) if status != 0 => {
            Err(tonic::Status::new(tonic::Code::from_i32(status), message))
        }
        _ => Ok(()),
    }
}
