//! What instances sharing a store announce to each other: a counter reset, and a counter
//! that went down (a refund, a lease's units given back). The instance that changed the
//! counter announces its key (Redis PUBLISH, PostgreSQL NOTIFY) once the store answered;
//! every instance listens and drops the key from its local view, so the next request
//! anywhere asks the store. A view only ever under-counts while counts grow; a decrease
//! made elsewhere would leave it over the store's count, denying what the store admits.
//!
//! A reset also drops the instance's lease on the counter (its units went with the
//! counter); a decrease leaves leases alone (their units are still counted). A decrease
//! carries the store's time when it ran, so that an answer to a call that ran before it,
//! still on its way, is not adopted afterwards ([`super::super::local`]).
//!
//! A change of the runtime overrides kept in the store is announced as [`OVERRIDES`]: no
//! counter key lacks a `#`, so an instance of an older version reads it as a reset of a
//! key no counter has, and does nothing.
//!
//! A key too long to announce is announced as [`ALL`], and a listener that (re)subscribes
//! may have missed announcements: both drop every view and lease, which is always safe,
//! since the views only save round trips and a dropped lease only leaves its units unused
//! until its window ends.

use std::sync::Weak;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::future::BoxFuture;
use futures_util::stream::BoxStream;

use crate::clock::Timestamp;

/// The longest key announced as itself (PostgreSQL's NOTIFY takes under 8000 bytes).
const MAX_ANNOUNCED_KEY: usize = 7_900;
/// The announcement that drops every view (a counter key always holds a `#`).
const ALL: &str = "*";
/// The announcement that the stored overrides changed.
pub(crate) const OVERRIDES: &str = "overrides";
/// How long opening a subscription (connecting, then SUBSCRIBE or LISTEN) may take: a
/// server that accepts and never answers would otherwise leave resets unheard, silently.
pub(crate) const SUBSCRIBE_TIMEOUT: Duration = Duration::from_secs(5);
/// The wait before subscribing again after a failure, or after a subscription that
/// ended as soon as it opened.
const RETRY: Duration = Duration::from_secs(1);

/// Opens one subscription: the stream of announcements, or why it could not.
pub(crate) type Subscribe = Box<
    dyn Fn() -> BoxFuture<'static, Result<BoxStream<'static, String>, SubscribeError>>
        + Send
        + Sync,
>;

/// Why a subscription to announcements could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SubscribeError {
    /// The store did not answer in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The store or the connection to it failed.
    #[error(transparent)]
    Store(Box<dyn std::error::Error + Send + Sync>),
}

/// One announcement as heard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Heard<'a> {
    /// Counter `key` was reset.
    Reset(&'a str),
    /// Counter `key` went down at store time `at`.
    Decrease { key: &'a str, at: Timestamp },
    /// The stored overrides changed.
    Overrides,
    /// Anything may have changed.
    All,
    /// An instance's heavy keys (`top/snapshot.rs`): no counter changed.
    Top(&'a str),
}

/// What is announced for a reset of `key`: the key itself.
pub(crate) fn announcement(key: &str) -> &str {
    if key.len() > MAX_ANNOUNCED_KEY {
        ALL
    } else {
        key
    }
}

/// What is announced for a decrease of `key` at store time `at`: `MICROS#KEY`. A counter
/// key holds exactly one unescaped `#` (`key.rs`), so two mark a decrease; an instance
/// of an older version reads it as a reset of a key no counter has, and does nothing.
pub(crate) fn decrease(key: &str, at: Timestamp) -> String {
    if key.len() > MAX_ANNOUNCED_KEY {
        return ALL.to_owned();
    }
    format!("{}#{key}", at.as_micros())
}

/// Reads an announcement.
pub(crate) fn hear(announced: &str) -> Heard<'_> {
    if announced == ALL {
        return Heard::All;
    }
    if announced == OVERRIDES {
        return Heard::Overrides;
    }
    if crate::top::snapshot::is_snapshot(announced) {
        return Heard::Top(announced);
    }
    match announced.split_once('#') {
        Some((micros, key)) if key.contains('#') => match micros.parse() {
            Ok(micros) => Heard::Decrease {
                key,
                at: Timestamp::from_micros(micros),
            },
            Err(_) => Heard::Reset(announced),
        },
        _ => Heard::Reset(announced),
    }
}

/// Listens for announcements while `store` lives, telling each to `hear`, subscribing
/// again after each loss: at once when the subscription had lasted the retry period
/// (the store closed a connection that worked, and announcements go unheard until it is
/// back), else after it, as after a failure.
pub(super) fn spawn<S: Send + Sync + 'static>(
    store: Weak<S>,
    hear: fn(&S, Heard<'_>),
    subscribe: Subscribe,
) {
    // False once the store is gone.
    let tell = move |heard: Heard<'_>| store.upgrade().map(|store| hear(&store, heard)).is_some();
    tokio::spawn(async move {
        loop {
            match subscribe().await {
                Ok(mut announcements) => {
                    let opened = tokio::time::Instant::now();
                    // A fresh subscription may have missed announcements.
                    if !tell(Heard::All) {
                        return;
                    }
                    while let Some(announced) = announcements.next().await {
                        if !tell(self::hear(&announced)) {
                            return;
                        }
                    }
                    tracing::debug!("the announcement subscription ended; subscribing again");
                    if opened.elapsed() >= RETRY {
                        continue;
                    }
                }
                Err(why) => tracing::debug!("cannot subscribe to counter announcements: {why}"),
            }
            tokio::time::sleep(RETRY).await;
        }
    });
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures_util::stream;
    use tokio::sync::{mpsc, oneshot};
    use tokio::time::Instant;

    use super::*;

    /// A store whose subscriptions the test opens, ends or fails: each call of the
    /// returned [`Subscribe`] is told to the test with its time.
    fn subscriptions() -> (Subscribe, mpsc::UnboundedReceiver<Asked>) {
        let (calls, asked) = mpsc::unbounded_channel();
        let subscribe: Subscribe = Box::new(move || {
            let calls = calls.clone();
            Box::pin(async move {
                let (answer, answered) = oneshot::channel();
                let _ = calls.send(Asked {
                    at: Instant::now(),
                    answer,
                });
                match answered.await {
                    // Announces nothing, and ends when the test says.
                    Ok(Some(end)) => Ok(stream::once(end)
                        .filter_map(|_| async { None::<String> })
                        .boxed()),
                    _ => Err(SubscribeError::Timeout(SUBSCRIBE_TIMEOUT)),
                }
            })
        });
        (subscribe, asked)
    }

    /// One subscription asked for at `at`: `Some(end)` opens it until `end` is told,
    /// `None` fails it.
    struct Asked {
        at: Instant,
        answer: oneshot::Sender<Option<oneshot::Receiver<()>>>,
    }

    impl Asked {
        /// Opens the subscription; it ends when the sender returned is used or dropped.
        fn open(self) -> oneshot::Sender<()> {
            let (end, ended) = oneshot::channel();
            let _ = self.answer.send(Some(ended));
            end
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_subscription_that_worked_and_ended_is_opened_again_at_once() {
        let store = Arc::new(AtomicUsize::new(0));
        let hear = |heard: &AtomicUsize, _: Heard<'_>| {
            heard.fetch_add(1, Ordering::Relaxed);
        };
        let (subscribe, mut asked) = subscriptions();
        spawn(Arc::downgrade(&store), hear, subscribe);
        let mut next = async || asked.recv().await.expect("asked again");

        // Open past the retry period, then lost: asked again at once.
        let end = next().await.open();
        tokio::time::sleep(RETRY * 3).await;
        let lost = Instant::now();
        drop(end);
        let second = next().await;
        assert_eq!(second.at, lost, "subscribed again at once");

        // Lost as soon as it opened: the next waits the retry period, so that a server
        // that drops every subscription is not asked again and again.
        let lost = Instant::now();
        drop(second.open());
        let third = next().await;
        assert_eq!(third.at - lost, RETRY);

        // Failed: the next waits the retry period too.
        let failed = Instant::now();
        let _ = third.answer.send(None);
        assert_eq!(next().await.at - failed, RETRY);
        assert_eq!(
            store.load(Ordering::Relaxed),
            2,
            "each opening heard as all"
        );
    }

    #[test]
    fn announcements_read_back_as_what_was_announced() {
        let key = "api|user=a%23b#s60000000000.10";
        assert_eq!(hear(announcement(key)), Heard::Reset(key));
        let at = Timestamp::from_micros(1_700_000_000_123_456);
        assert_eq!(hear(&decrease(key, at)), Heard::Decrease { key, at });
        assert_eq!(hear(ALL), Heard::All);
        assert_eq!(hear(OVERRIDES), Heard::Overrides);
        let long = format!("d|k={}#s1", "x".repeat(MAX_ANNOUNCED_KEY));
        assert_eq!(hear(announcement(&long)), Heard::All);
        assert_eq!(hear(&decrease(&long, at)), Heard::All);
        let top = "%top|beef\nd\tm\tweb\tip\tip=a\t3\t0";
        assert_eq!(hear(top), Heard::Top(top));
        // Not a decrease: a key whose first part is not a time stays a reset.
        assert_eq!(hear("x#y#z"), Heard::Reset("x#y#z"));
    }
}
