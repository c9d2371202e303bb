//! The upstream behind the test Envoys: an HTTP/1.1 server on 127.0.0.1 that answers every
//! request 200 "upstream" and counts the requests that reached it.

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
                let answer = service_fn(move |_request| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let body = Full::new(Bytes::from_static(BODY.as_bytes()));
                    async move { Ok::<_, Infallible>(hyper::Response::new(body)) }
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
