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

/// One request on `stream`, a connection to `host` (plain or TLS; the `Host` header
/// unless `headers` hold one); the failure as a message. The caller bounds the time.
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
    let mut request = hyper::Request::builder().method(method).uri(path);
    // The connection's host, unless the test names another.
    if !headers
        .iter()
        .any(|(name, _)| name.eq_ignore_ascii_case("host"))
    {
        request = request.header(hyper::header::HOST, host);
    }
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
    let headers = pairs(response.headers());
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

/// `headers` as the tests look at them: names in lower case, values as text, in order.
pub(crate) fn pairs(headers: &hyper::HeaderMap) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(name, value)| {
            let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
            (name.as_str().to_owned(), value)
        })
        .collect()
}

/// One request written byte for byte on a fresh connection, for what no client library
/// sends: two `Authorization` headers, bytes that are not UTF-8, no `Host` (HTTP/1.0).
/// `request` must have the server close the connection after it (HTTP/1.0, or
/// `Connection: close`); its answer is read to that close.
pub async fn send_raw(addr: SocketAddr, request: &[u8]) -> Result<Response, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        stream
            .write_all(request)
            .await
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = Vec::new();
        stream
            .read_to_end(&mut raw)
            .await
            .map_err(|e| format!("read: {e}"))?;
        Ok::<_, String>(raw)
    };
    let raw = tokio::time::timeout(TIMEOUT, exchange)
        .await
        .map_err(|_| format!("no complete response within {TIMEOUT:?}"))??;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|line| line.split(' ').nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("no status: {head:?}"))?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.to_ascii_lowercase(), value.trim().to_owned()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: body.to_owned(),
    })
}
