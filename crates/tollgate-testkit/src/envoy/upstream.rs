//! The upstream behind the test Envoys: an HTTP/1.1 server on 127.0.0.1 that answers every
//! request 200 "upstream" and counts the requests that reached it. A request may ask it to
//! report usage, as a model server reports tokens: the value of its [`REPORT_USAGE`] header
//! comes back in the response's [`USAGE`] header.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// The upstream's response body.
pub const BODY: &str = "upstream";
/// A request header whose value the upstream reports back as its usage.
pub const REPORT_USAGE: &str = "x-report-usage";
/// The response header carrying the usage.
pub const USAGE: &str = "x-usage";

/// A running upstream; stops when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Upstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream");
        let addr = listener.local_addr().expect("the upstream's address");
        let hits = Arc::new(AtomicUsize::new(0));
        let counter = hits.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counter = counter.clone();
                let answer = service_fn(move |request: hyper::Request<_>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let body = Full::new(Bytes::from_static(BODY.as_bytes()));
                    let mut response = hyper::Response::new(body);
                    if let Some(usage) = request.headers().get(REPORT_USAGE) {
                        response.headers_mut().insert(USAGE, usage.clone());
                    }
                    async move { Ok::<_, Infallible>(response) }
                });
                tokio::spawn(async move {
                    // A connection Envoy drops mid-request is of no interest.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), answer)
                        .await;
                });
            }
        });
        Self { addr, hits, task }
    }

    /// Requests answered so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}
