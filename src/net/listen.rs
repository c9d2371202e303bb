//! Connections as a hostile client would use them, bounded: a connection that stays silent
//! past the idle timeout is closed, one whose first request (HTTP/2 preface and headers
//! included) does not arrive in time too, HTTP/1 request headers and TLS handshakes must
//! arrive in time, and each port holds at most so many connections, so idle, slow or
//! silent clients cannot take every file descriptor and starve the other port.
//! Handshakes run off the accept loop, so a slow one delays nobody else.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::time::{Instant, Sleep};
use tokio_rustls::server::TlsStream;

use tollgate_core::{Clock, LogLimit};

use crate::net::tls::{Port, ServerTls};

/// A TLS handshake must finish within this.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// At most one line per port about refused handshakes in this long.
const REFUSAL_LOG_PERIOD: Duration = Duration::from_secs(10);
/// Connections handshaken and not yet taken by the gRPC server.
const READY_QUEUE: usize = 64;

/// How long connections may idle or dawdle, and how many a port holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    /// A connection with no bytes either way for this long is closed.
    pub(crate) idle: Duration,
    /// An HTTP/1 request's headers must arrive within this.
    pub(crate) header_read: Duration,
    /// A connection's first request (its headers) must arrive within this of its accept.
    pub(crate) first_request: Duration,
    /// Connections open at once per port; more wait in the backlog.
    pub(crate) max_connections: usize,
    /// A connection still open this long after it was accepted is cut, whatever it is
    /// doing (the gRPC port's age plus grace; the polite close comes first, from tonic).
    pub(crate) lifetime: Option<Duration>,
}

/// Whether a connection's first request has arrived: shared by the connection, which
/// closes itself if none comes in time, and the service that sees the request.
#[derive(Debug, Clone, Default)]
pub(crate) struct FirstRequest(Arc<AtomicBool>);

impl FirstRequest {
    pub(crate) fn arrived(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    fn has_arrived(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A connection that fails once nothing has moved in either direction for `idle`, once
/// its first request is late, or once its lifetime is over; it holds one of its port's
/// connection slots until dropped.
pub(crate) struct IdleIo<T> {
    inner: T,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    /// Until the first request arrives: when the connection is given up.
    first: Option<Pin<Box<Sleep>>>,
    first_request: FirstRequest,
    cutoff: Option<Pin<Box<Sleep>>>,
    _slot: OwnedSemaphorePermit,
}

impl<T> IdleIo<T> {
    fn new(inner: T, limits: &ConnLimits, slot: OwnedSemaphorePermit) -> Self {
        Self {
            inner,
            idle: limits.idle,
            deadline: Box::pin(tokio::time::sleep(limits.idle)),
            first: Some(Box::pin(tokio::time::sleep(limits.first_request))),
            first_request: FirstRequest::default(),
            cutoff: limits.lifetime.map(|l| Box::pin(tokio::time::sleep(l))),
            _slot: slot,
        }
    }

    /// What the service marks when the connection's first request arrives.
    pub(crate) fn first_request(&self) -> FirstRequest {
        self.first_request.clone()
    }

    fn touch(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }

    /// While `inner` is pending: an error once a deadline has passed.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
        if let Some(cutoff) = &mut self.cutoff
            && cutoff.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "connection past its maximum age and grace",
            ));
        }
        if self.first_request.has_arrived() {
            self.first = None;
        } else if let Some(first) = &mut self.first
            && first.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(io::Error::new(
                io::ErrorKind::TimedOut,
                "no request within the first-request timeout",
            ));
        }
        ready!(self.deadline.as_mut().poll(cx));
        Poll::Ready(io::Error::new(
            io::ErrorKind::TimedOut,
            "connection idle too long",
        ))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleIo<T> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                if buf.filled().len() > before {
                    self.touch();
                }
                Poll::Ready(result)
            }
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleIo<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match Pin::new(&mut self.inner).poll_write(cx, data) {
            Poll::Ready(result) => {
                self.touch();
                Poll::Ready(result)
            }
            Poll::Pending => self.check_idle(cx).map(Err),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A served connection: plaintext, or TLS over it.
pub(crate) enum Conn {
    Plain(IdleIo<TcpStream>),
    Tls(Box<TlsStream<IdleIo<TcpStream>>>),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_read(cx, buf),
            Self::Tls(io) => Pin::new(io).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_write(cx, data),
            Self::Tls(io) => Pin::new(io).poll_write(cx, data),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_flush(cx),
            Self::Tls(io) => Pin::new(io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(io) => Pin::new(io).poll_shutdown(cx),
            Self::Tls(io) => Pin::new(io).poll_shutdown(cx),
        }
    }
}

impl Conn {
    fn io(&self) -> &IdleIo<TcpStream> {
        match self {
            Self::Plain(io) => io,
            Self::Tls(io) => io.get_ref().0,
        }
    }
}

/// What tonic puts in each request's extensions: the flag its connection's first request
/// lifts.
impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = FirstRequest;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io().first_request()
    }
}

/// A service that marks its connection's first request as arrived, lifting the
/// connection's first-request deadline: the HTTP port's knows its connection, the gRPC
/// port's finds the flag in the request's extensions.
#[derive(Debug, Clone)]
pub(crate) struct MarkFirstRequest<S> {
    inner: S,
    first_request: Option<FirstRequest>,
}

impl<S> MarkFirstRequest<S> {
    pub(crate) fn new(inner: S, first_request: FirstRequest) -> Self {
        Self {
            inner,
            first_request: Some(first_request),
        }
    }
}

impl<S, B> tower_service::Service<http::Request<B>> for MarkFirstRequest<S>
where
    S: tower_service::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let from_request = request.extensions().get::<FirstRequest>();
        if let Some(first) = self.first_request.as_ref().or(from_request) {
            first.arrived();
        }
        self.inner.call(request)
    }
}

/// [`MarkFirstRequest`] for every connection of a tonic server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct MarkFirstRequestLayer;

impl<S> tower_layer::Layer<S> for MarkFirstRequestLayer {
    type Service = MarkFirstRequest<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MarkFirstRequest {
            inner,
            first_request: None,
        }
    }
}

/// A port's TLS: the shared configuration, which port's variant to use, and the log of
/// refused handshakes.
#[derive(Clone)]
pub(crate) struct PortTls {
    tls: Arc<ServerTls>,
    port: Port,
    refusals: Arc<LogLimit>,
    clock: Arc<dyn Clock>,
}

impl PortTls {
    pub(crate) fn new(tls: Arc<ServerTls>, port: Port, clock: Arc<dyn Clock>) -> Self {
        Self {
            tls,
            port,
            refusals: Arc::new(LogLimit::new(REFUSAL_LOG_PERIOD)),
            clock,
        }
    }

    /// A refused handshake, at WARN: the server's side of a certificate mistake is only
    /// here, and a client may retry many times a second, so one line per period. A
    /// connection closed before saying anything (a TCP probe) is no refusal.
    fn refused(&self, peer: Option<SocketAddr>, why: &str) {
        let Some(held) = self.refusals.admit(self.clock.now()) else {
            return;
        };
        let port = match self.port {
            Port::Grpc => "gRPC",
            Port::Http => "HTTP",
        };
        let from = peer.map(|p| format!(" from {p}")).unwrap_or_default();
        tracing::warn!(
            "TLS handshake refused on the {port} port{from}: {why} ({held} more since the last \
             such line)"
        );
    }
}

/// Accepts connections within `limits`: waits for a free slot before accepting, so excess
/// clients queue in the kernel's backlog instead of taking descriptors.
pub(crate) struct Acceptor {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    limits: ConnLimits,
    tls: Option<PortTls>,
}

impl Acceptor {
    pub(crate) fn new(listener: TcpListener, limits: ConnLimits, tls: Option<PortTls>) -> Self {
        Self {
            listener,
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
            tls,
        }
    }

    /// The next connection; accept errors (a full descriptor table) are waited out.
    pub(crate) async fn accept(&self) -> IdleIo<TcpStream> {
        loop {
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                // The semaphore is never closed; waiting again is all there is to do.
                continue;
            };
            match self.listener.accept().await {
                Ok((stream, _)) => {
                    // Latency matters more than packet count for small RPCs.
                    let _ = stream.set_nodelay(true);
                    return IdleIo::new(stream, &self.limits, slot);
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// The connections as a stream for tonic, each once its handshake is done. Accepting
    /// stops when tonic drops the stream.
    pub(crate) fn incoming(self) -> impl futures_util::Stream<Item = io::Result<Conn>> {
        let (ready, mut queue) = mpsc::channel(READY_QUEUE);
        tokio::spawn(async move {
            loop {
                let io = tokio::select! {
                    io = self.accept() => io,
                    () = ready.closed() => return,
                };
                let (ready, tls) = (ready.clone(), self.tls.clone());
                tokio::spawn(async move {
                    if let Some(conn) = secure(io, tls.as_ref()).await {
                        // Only fails once the server stopped; the connection closes.
                        let _ = ready.send(Ok(conn)).await;
                    }
                });
            }
        });
        futures_util::stream::poll_fn(move |cx| queue.poll_recv(cx))
    }
}

/// The connection as served: after the TLS handshake if the port has TLS. A failed or
/// slow handshake (a client without a valid certificate, say) ends the connection.
async fn secure(io: IdleIo<TcpStream>, tls: Option<&PortTls>) -> Option<Conn> {
    let Some(tls) = tls else {
        return Some(Conn::Plain(io));
    };
    let peer = io.inner.peer_addr().ok();
    let handshake = tls.tls.acceptor(tls.port).accept(io);
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(stream)) => Some(Conn::Tls(Box::new(stream))),
        Ok(Err(e)) if e.kind() == io::ErrorKind::UnexpectedEof => {
            tracing::debug!(?peer, "connection closed before its TLS handshake: {e}");
            None
        }
        Ok(Err(e)) => {
            tls.refused(peer, &e.to_string());
            None
        }
        Err(_) => {
            tls.refused(peer, &format!("no handshake within {HANDSHAKE_TIMEOUT:?}"));
            None
        }
    }
}

/// The router, each request carrying its connection's peer address as axum's
/// `ConnectInfo`, for handlers that log who asked (resets).
#[derive(Clone)]
struct WithPeer {
    router: axum::Router,
    peer: Option<SocketAddr>,
}

impl<B> tower_service::Service<http::Request<B>> for WithPeer
where
    B: axum::body::HttpBody<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = axum::response::Response;
    type Error = std::convert::Infallible;
    type Future = <axum::Router as tower_service::Service<http::Request<B>>>::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        tower_service::Service::<http::Request<B>>::poll_ready(&mut self.router, cx)
    }

    fn call(&mut self, mut req: http::Request<B>) -> Self::Future {
        if let Some(peer) = self.peer {
            req.extensions_mut()
                .insert(axum::extract::ConnectInfo(peer));
        }
        self.router.call(req)
    }
}

/// Serves `router` over HTTP/1 and HTTP/2 on the acceptor's connections until `stop`
/// resolves, then lets requests in flight finish.
pub(crate) async fn serve_http(
    acceptor: Acceptor,
    router: axum::Router,
    stop: impl Future<Output = ()>,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(acceptor.limits.header_read);
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let io = tokio::select! {
            io = acceptor.accept() => io,
            () = &mut stop => break,
        };
        let (builder, watcher, tls) = (builder.clone(), graceful.watcher(), acceptor.tls.clone());
        let peer = io.inner.peer_addr().ok();
        let first_request = io.first_request();
        let service = TowerToHyperService::new(MarkFirstRequest::new(
            WithPeer {
                router: router.clone(),
                peer,
            },
            first_request,
        ));
        tokio::spawn(async move {
            let Some(conn) = secure(io, tls.as_ref()).await else {
                return;
            };
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(conn), service);
            // A client that goes away or times out ends its connection; nothing to report.
            let _ = watcher.watch(connection.into_owned()).await;
        });
    }
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn limits(idle_ms: u64, max_connections: usize) -> ConnLimits {
        ConnLimits {
            idle: Duration::from_millis(idle_ms),
            header_read: Duration::from_secs(1),
            first_request: Duration::from_secs(3_600),
            max_connections,
            lifetime: None,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_and_a_busy_one_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let acceptor = Acceptor::new(listener, limits(1_000, 8), None);
        let mut client = TcpStream::connect(addr).await.expect("connect");
        let mut server = acceptor.accept().await;
        // Traffic keeps it open past the idle time.
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(600)).await;
            client.write_all(b"x").await.expect("write");
            let mut byte = [0u8; 1];
            server.read_exact(&mut byte).await.expect("read");
        }
        // Silence closes it.
        let mut byte = [0u8; 1];
        let err = server.read(&mut byte).await.expect_err("idle");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_is_cut_at_the_end_of_its_lifetime() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let lifetime = ConnLimits {
            lifetime: Some(Duration::from_secs(2)),
            ..limits(1_000, 8)
        };
        let acceptor = Acceptor::new(listener, lifetime, None);
        let mut client = TcpStream::connect(addr).await.expect("connect");
        let mut server = acceptor.accept().await;
        let mut byte = [0u8; 1];
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(600)).await;
            client.write_all(b"x").await.expect("write");
            server.read_exact(&mut byte).await.expect("read");
        }
        let err = server.read(&mut byte).await.expect_err("past its lifetime");
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("maximum age"), "{err}");
    }

    #[tokio::test]
    async fn a_full_port_accepts_again_when_a_connection_ends() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let acceptor = Acceptor::new(listener, limits(60_000, 1), None);
        let _first_client = TcpStream::connect(addr).await.expect("connect");
        let first = acceptor.accept().await;
        let _second_client = TcpStream::connect(addr).await.expect("connect");
        let while_full = tokio::time::timeout(Duration::from_millis(300), acceptor.accept()).await;
        assert!(while_full.is_err(), "the only slot is taken");
        drop(first);
        let second = tokio::time::timeout(Duration::from_secs(5), acceptor.accept()).await;
        assert!(second.is_ok(), "the freed slot accepts the next");
    }
}
