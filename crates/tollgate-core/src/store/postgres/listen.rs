//! The reset announcements of PostgreSQL: `pg_notify` on a channel named from the key
//! prefix, heard on a connection of its own that LISTENs to it.

use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::connect::{PgError, PgTarget};
use super::describe::describe;
use crate::store::shared::announce::{SUBSCRIBE_TIMEOUT, Subscribe, SubscribeError};

/// Announcements heard but not yet applied; past it, the connection waits.
const QUEUE: usize = 1024;

/// The channel of deployments using `prefix`: a fixed name and a stable hash of the
/// prefix (FNV-1a), since a channel is an identifier of at most 63 bytes.
pub(super) fn channel(prefix: &str) -> String {
    if prefix.is_empty() {
        return "tollgate_reset".to_owned();
    }
    let hash = prefix.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("tollgate_reset_{hash:016x}")
}

/// A LISTEN to `channel` at `target` on a connection of its own.
pub(super) fn subscription(
    target: PgTarget,
    tls: Option<MakeRustlsConnect>,
    channel: String,
) -> Subscribe {
    Box::new(move || {
        let (target, tls, channel) = (target.clone(), tls.clone(), channel.clone());
        Box::pin(async move {
            let (tx, rx) = mpsc::channel(QUEUE);
            // Named apart from the pool's connections, for whoever counts those.
            let mut config = target.config.clone();
            config.application_name("tollgate-resets");
            let listening = async {
                let client = match tls {
                    Some(tls) => listener(&config, tls, tx).await,
                    None => listener(&config, NoTls, tx).await,
                }?;
                client.batch_execute(&format!("LISTEN {channel}")).await?;
                Ok::<_, tokio_postgres::Error>(client)
            };
            let client = tokio::time::timeout(SUBSCRIBE_TIMEOUT, listening)
                .await
                .map_err(|_| SubscribeError::Timeout(SUBSCRIBE_TIMEOUT))?
                .map_err(|e| SubscribeError::Store(PgError::Db(e).into()))?;
            // The client lives as long as the stream: dropping it closes the connection.
            let keys = futures_util::stream::unfold((rx, client), |(mut rx, client)| async move {
                let key = rx.recv().await?;
                Some((key, (rx, client)))
            });
            Ok(keys.boxed())
        })
    })
}

/// A connection whose notifications go to `announcements` until it ends.
async fn listener<T>(
    config: &Config,
    tls: T,
    announcements: mpsc::Sender<String>,
) -> Result<Client, tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket> + Send,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, mut connection) = config.connect(tls).await?;
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            match message {
                Ok(AsyncMessage::Notification(n)) => {
                    if announcements.send(n.payload().to_owned()).await.is_err() {
                        return;
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!("the reset listener's connection ended: {}", describe(&e));
                    return;
                }
            }
        }
    });
    Ok(client)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::net::TcpListener;

    use super::*;

    /// A server that accepts the connection and never answers the startup (hung, or not
    /// PostgreSQL at all): the subscription gives up and says so, instead of waiting for
    /// ever and leaving resets unheard without a word.
    #[tokio::test]
    async fn a_server_that_never_answers_times_the_subscription_out() {
        let silent = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = silent.local_addr().expect("its address").port();
        let accepted = tokio::spawn(async move {
            // Kept open, unread: the client waits on an answer that never comes.
            let mut held = Vec::new();
            while let Ok((socket, _)) = silent.accept().await {
                held.push(socket);
            }
        });
        let target = PgTarget::parse(&format!(
            "postgres://u:p@127.0.0.1:{port}/x?sslmode=disable"
        ))
        .expect("a URL");
        let subscribe = subscription(target, None, channel("t_"));
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(Duration::from_secs(20), subscribe()).await;
        let Ok(opened) = outcome else {
            panic!("the subscription still waits after 20 s on a server that never answers")
        };
        let Err(err) = opened else {
            panic!("subscribed to a server that never answered")
        };
        assert!(
            matches!(err, SubscribeError::Timeout(t) if t == SUBSCRIBE_TIMEOUT),
            "{err:?}"
        );
        assert!(started.elapsed() >= SUBSCRIBE_TIMEOUT, "{err}");
        accepted.abort();
    }
}
