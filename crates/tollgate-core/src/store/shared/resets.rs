//! Counter resets across instances. The instance that resets a counter deletes it in the
//! store and announces its key (Redis PUBLISH, PostgreSQL NOTIFY); every instance listens
//! and drops the key from its local view (and its lease on it, whose units went with the
//! counter), so the next request anywhere asks the store and is admitted. A key too long to announce is announced as [`ALL`], and a listener that
//! (re)subscribes may have missed announcements: both drop every view and lease, which is
//! always safe, since the views only save round trips and a dropped lease only leaves its
//! units unused until its window ends.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

use super::SharedStore;

/// The longest key announced as itself (PostgreSQL's NOTIFY takes under 8000 bytes).
const MAX_ANNOUNCED_KEY: usize = 7_900;
/// The announcement that drops every view (a counter key always holds a `|`).
const ALL: &str = "*";
/// How long opening a subscription (connecting, then SUBSCRIBE or LISTEN) may take: a
/// server that accepts and never answers would otherwise leave resets unheard, silently.
pub(crate) const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The wait before subscribing again after a failure.
const RETRY: Duration = Duration::from_secs(1);

/// Opens one subscription: the stream of announcements, or why it could not.
pub(crate) type Subscribe = Box<
    dyn Fn() -> BoxFuture<'static, Result<BoxStream<'static, String>, SubscribeError>>
        + Send
        + Sync,
>;

/// Why a subscription to reset announcements could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubscribeError {
    /// The store did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The store or the connection to it failed.
    #[error(transparent)]
    Store(Box<dyn std::error::Error + Send + Sync>),
}

/// What is announced for a reset of `key`.
pub(crate) fn announcement(key: &str) -> &str {
    if key.len() > MAX_ANNOUNCED_KEY {
        ALL
    } else {
        key
    }
}

/// Listens for announcements while the store lives, subscribing again after each loss.
pub(super) fn spawn(store: Weak<SharedStore>, subscribe: Subscribe) {
    tokio::spawn(async move {
        while store.strong_count() > 0 {
            match subscribe().await {
                Ok(mut announcements) => {
                    forget(&store, ALL);
                    while let Some(key) = announcements.next().await {
                        if !forget(&store, &key) {
                            return;
                        }
                    }
                    tracing::debug!("the reset subscription ended; subscribing again");
                }
                Err(why) => tracing::debug!("cannot subscribe to counter resets: {why}"),
            }
            tokio::time::sleep(RETRY).await;
        }
    });
}

/// Drops the views `announced` names; false once the store is gone.
fn forget(store: &Weak<SharedStore>, announced: &str) -> bool {
    let Some(store) = store.upgrade() else {
        return false;
    };
    match announced {
        ALL => store.local.forget_all(),
        key => store.local.forget(key),
    }
    store
        .leases
        .forget(Some(announced).filter(|key| *key != ALL));
    true
}
