//! Connections as a hostile client would use them, bounded: a connection that stays silent
//! past the idle timeout is closed, HTTP/1 request headers must arrive in time, and each
//! port holds at most so many connections, so idle or slow clients cannot take every file
//! descriptor and starve the other port.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// How long connections may idle or dawdle, and how many a port holds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ConnLimits {
    /// A connection with no bytes either way for this long is closed.
    pub(crate) idle: Duration,
    /// An HTTP/1 request's headers must arrive within this.
    pub(crate) header_read: Duration,
    /// Connections open at once per port; more wait in the backlog.
    pub(crate) max_connections: usize,
}

/// A connection that fails once nothing has moved in either direction for `idle`; it
/// holds one of its port's connection slots until dropped.
pub(crate) struct IdleIo<T> {
    inner: T,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
    _slot: OwnedSemaphorePermit,
}

impl<T> IdleIo<T> {
    fn new(inner: T, idle: Duration, slot: OwnedSemaphorePermit) -> Self {
        Self {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
            _slot: slot,
        }
    }

    fn touch(&mut self) {
        self.deadline.as_mut().reset(Instant::now() + self.idle);
    }

    /// While `inner` is pending: an error once the deadline has passed.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Poll<io::Error> {
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

impl tonic::transport::server::Connected for IdleIo<TcpStream> {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// Accepts connections within `limits`: waits for a free slot before accepting, so excess
/// clients queue in the kernel's backlog instead of taking descriptors.
pub(crate) struct Acceptor {
    listener: TcpListener,
    slots: Arc<Semaphore>,
    limits: ConnLimits,
}

impl Acceptor {
    pub(crate) fn new(listener: TcpListener, limits: ConnLimits) -> Self {
        Self {
            listener,
            slots: Arc::new(Semaphore::new(limits.max_connections)),
            limits,
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
                    return IdleIo::new(stream, self.limits.idle, slot);
                }
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// The connections as a stream, for tonic.
    pub(crate) fn incoming(
        self,
    ) -> impl futures_util::Stream<Item = io::Result<IdleIo<TcpStream>>> {
        futures_util::stream::unfold(self, |acceptor| async move {
            let io = acceptor.accept().await;
            Some((Ok(io), acceptor))
        })
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
        let service = TowerToHyperService::new(router.clone());
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service);
        let connection = graceful.watch(connection.into_owned());
        tokio::spawn(async move {
            // A client that goes away or times out ends its connection; nothing to report.
            let _ = connection.await;
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
            max_connections,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_is_closed_and_a_busy_one_is_not() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let acceptor = Acceptor::new(listener, limits(1_000, 8));
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

    #[tokio::test]
    async fn a_full_port_accepts_again_when_a_connection_ends() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let acceptor = Acceptor::new(listener, limits(60_000, 1));
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
