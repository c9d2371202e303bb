//! HTTP/2 with prior knowledge, as `curl --http2-prior-knowledge` speaks it to the HTTP
//! port: one request on a fresh connection, written with h2 so that the test chooses
//! every field: the `:authority`, and header values that are not UTF-8 or end in white
//! space (which an HTTP/1 server never sees, since HTTP/1 drops it).

use std::net::SocketAddr;

use bytes::Bytes;
use hyper::http::{HeaderName, HeaderValue, Request};
use tokio::net::TcpStream;

pub use crate::http::Method;
use crate::http::{Response, TIMEOUT, pairs};

/// `method path` to `addr` with `authority` as its `:authority`, `headers` as given (bytes)
/// and `body`; the failure as a message.
pub async fn send(
    addr: SocketAddr,
    authority: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &[u8])],
    body: &str,
) -> Result<Response, String> {
    let exchange = async {
        let tcp = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let (send, connection) = h2::client::handshake(tcp)
            .await
            .map_err(|e| format!("handshake: {e}"))?;
        // The connection is driven beside the request; it ends when the sender is dropped.
        let driver = tokio::spawn(connection);
        let mut request = Request::builder()
            .method(method)
            .uri(format!("http://{authority}{path}"));
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).map_err(|e| e.to_string())?;
            let value = HeaderValue::from_bytes(value).map_err(|e| e.to_string())?;
            request = request.header(name, value);
        }
        let request = request
            .body(())
            .map_err(|e| format!("build the request: {e}"))?;
        let mut send = send.ready().await.map_err(|e| format!("ready: {e}"))?;
        let (answer, mut stream) = send
            .send_request(request, body.is_empty())
            .map_err(|e| format!("send: {e}"))?;
        if !body.is_empty() {
            stream
                .send_data(Bytes::from(body.to_owned()), true)
                .map_err(|e| format!("send the body: {e}"))?;
        }
        let answer = answer.await.map_err(|e| format!("answer: {e}"))?;
        let status = answer.status().as_u16();
        let headers = pairs(answer.headers());
        let mut received = answer.into_body();
        let mut body = Vec::new();
        while let Some(data) = received.data().await {
            let data = data.map_err(|e| format!("read the body: {e}"))?;
            let _ = received.flow_control().release_capacity(data.len());
            body.extend_from_slice(&data);
        }
        drop(send);
        driver.abort();
        Ok(Response {
            status,
            headers,
            body: String::from_utf8_lossy(&body).into_owned(),
        })
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no complete HTTP/2 response within {TIMEOUT:?}"))?
}
