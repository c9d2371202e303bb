//! The one HTTP/1.1 client of the suites (hyper): GET and POST with headers, a fresh
//! connection per request, bodies decoded whatever their framing (length or chunked),
//! and a timeout so that a hung server fails the test.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
pub use hyper::Method;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

/// Longest a request may take, connection included.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A response as the tests look at it.
#[derive(Clone, Debug)]
pub struct Response {
    pub status: u16,
    /// Header names in lower case, in the order received.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    /// The first value of header `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    }

    /// A header that must be present and be an integer.
    pub fn header_u64(&self, name: &str) -> u64 {
        let value = self
            .header(name)
            .unwrap_or_else(|| panic!("response has no `{name}` header: {self:#?}"));
        value
            .parse()
            .unwrap_or_else(|_| panic!("`{name}: {value}` is not an integer: {self:#?}"))
    }
}

/// `GET path`; panics on any failure.
pub async fn get(addr: SocketAddr, path: &str) -> Response {
    get_with(addr, path, &[]).await
}

/// `GET path` with extra headers; panics on any failure.
pub async fn get_with(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response {
    expect(addr, Method::GET, path, headers, "").await
}

/// `POST path` with a JSON body; panics on any failure.
pub async fn post_json(addr: SocketAddr, path: &str, body: &str) -> Response {
    let headers = [("content-type", "application/json")];
    expect(addr, Method::POST, path, &headers, body).await
}

/// [`send`], panicking on any failure.
async fn expect(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Response {
    let what = format!("{method} http://{addr}{path}");
    send(addr, method, path, headers, body)
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// One request on a fresh connection; the failure as a message.
pub async fn send(
    addr: SocketAddr,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Response, String> {
    let exchange = async {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        send_on(stream, &addr.to_string(), method, path, headers, body).await
    };
    tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no complete response within {TIMEOUT:?}"))?
}

/// One request on `stream`, a connection to `host` (plain or TLS); the failure as a
/// message. The caller bounds the time.
pub async fn send_on<S>(
    stream: S,
    host: &str,
    method: Method,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Result<Response, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    // The connection is driven beside the request; it ends when the sender is dropped.
    let driver = tokio::spawn(connection);
    let mut request = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header(hyper::header::HOST, host);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_owned())))
        .map_err(|e| format!("build the request: {e}"))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| format!("send: {e}"))?;
    let status = response.status().as_u16();
    let headers = response
        .headers()
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        })
        .collect();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("read the body: {e}"))?
        .to_bytes();
    drop(sender);
    driver.abort();
    Ok(Response {
        status,
        headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    })
}
