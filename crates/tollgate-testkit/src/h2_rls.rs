//! The rate-limit API over one HTTP/2 connection that h2 drives directly: the load
//! benchmark's client. It shares the machine's cores with the servers it measures, so
//! it takes the least CPU per call it can: no channel task between a caller and the
//! connection (tonic's `Channel` hands every call to one) and no streaming codec; the
//! request is encoded into its one frame and the answer decoded from the one it gets.

use std::error::Error;
use std::net::SocketAddr;

use bytes::Bytes;
use h2::client::SendRequest;
use hyper::http::Uri;
use prost::Message;
use tokio::net::TcpStream;

use crate::grpc::{RateLimitRequest, RateLimitResponse};
use crate::load::Call;
use crate::raw_grpc::{Ended, SHOULD_RATE_LIMIT, answer, frame_head, request_head};

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
        let mut send = self.send.clone().ready().await?;
        let (response, mut stream) = send.send_request(request_head(self.uri.clone()), false)?;
        stream.send_data(framed(&req)?, true)?;
        match answer(response).await? {
            (_, Some(Ended { status, message })) if status != 0 => {
                Err(tonic::Status::new(tonic::Code::from_i32(status), message).into())
            }
            (_, None) => Err("the answer says not how the call ended".into()),
            (body, Some(_)) => Ok(RateLimitResponse::decode(
                body.get(5..).ok_or("the answer holds no message frame")?,
            )?),
        }
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
