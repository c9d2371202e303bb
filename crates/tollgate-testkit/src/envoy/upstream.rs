//! The upstream behind the test Envoys: an HTTP/1.1 server on 127.0.0.1 that answers every
//! request 200 "upstream" and counts the requests that reached it. A request may ask it to
//! report usage, as a model server reports tokens: the value of its [`REPORT_USAGE`] header
//! comes back in the response's [`USAGE`] header. A request with the [`HOLD`] header is
//! a slow one: it is answered only once the test lets it through ([`Upstream::let_through`]).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;

/// The upstream's response body.
pub const BODY: &str = "upstream";
/// A request header whose value the upstream reports back as its usage.
pub const REPORT_USAGE: &str = "x-report-usage";
/// The response header carrying the usage.
pub const USAGE: &str = "x-usage";
/// A request header asking the upstream to hold the request until the test lets it go.
pub const HOLD: &str = "x-hold";

/// A running upstream; stops when dropped.
pub struct Upstream {
    pub addr: SocketAddr,
    hits: Arc<AtomicUsize>,
    /// Requests held now.
    held: Arc<AtomicUsize>,
    /// One permit per held request let through.
    gate: Arc<Semaphore>,
    task: JoinHandle<()>,
}

impl Upstream {
    pub async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the upstream");
        let addr = listener.local_addr().expect("the upstream's address");
        let hits = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(Semaphore::new(0));
        let (counter, holding, gates) = (hits.clone(), held.clone(), gate.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (counter, holding, gates) = (counter.clone(), holding.clone(), gates.clone());
                let answer = service_fn(move |request: hyper::Request<_>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let body = Full::new(Bytes::from_static(BODY.as_bytes()));
                    let mut response = hyper::Response::new(body);
                    if let Some(usage) = request.headers().get(REPORT_USAGE) {
                        response.headers_mut().insert(USAGE, usage.clone());
                    }
                    let hold = request.headers().contains_key(HOLD);
                    let (holding, gates) = (holding.clone(), gates.clone());
                    async move {
                        if hold {
                            holding.fetch_add(1, Ordering::SeqCst);
                            // Closed only when the upstream is dropped: answered then.
                            let _ = gates.acquire().await.map(|p| p.forget());
                            holding.fetch_sub(1, Ordering::SeqCst);
                        }
                        Ok::<_, Infallible>(response)
                    }
                });
                tokio::spawn(async move {
                    // A connection Envoy drops mid-request is of no interest.
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), answer)
                        .await;
                });
            }
        });
        Self {
            addr,
            hits,
            held,
            gate,
            task,
        }
    }

    /// Requests held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// Lets `n` held requests (or the next to come) be answered.
    pub fn let_through(&self, n: usize) {
        self.gate.add_permits(n);
    }

    /// Requests answered so far.
    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
        self.gate.close();
    }
}
