//! The reset announcements of PostgreSQL: `pg_notify` on a channel named from the key
//! prefix, heard on a connection of its own that LISTENs to it.

use futures_util::StreamExt as _;
use tokio::sync::mpsc;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Client, Config, NoTls, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::connect::{PgError, PgTarget};
use super::describe::describe;
use crate::store::shared::resets::{Subscribe, SubscribeError};

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
            let client = match tls {
                Some(tls) => listener(&config, tls, tx).await,
                None => listener(&config, NoTls, tx).await,
            }
            .map_err(|e| SubscribeError::Store(PgError::Db(e).into()))?;
            client
                .batch_execute(&format!("LISTEN {channel}"))
                .await
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
