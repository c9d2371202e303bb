//! Signals and the stop: SIGHUP reloads file rules; SIGTERM or Ctrl-C (the process's
//! shutdown) drains, then stops.

use std::future::Future;
use std::time::Duration;

use tokio::sync::watch;

use crate::config::reload::Reload;

/// Once `shutdown` completes: health checks fail for `delay`, then the listeners close.
pub(super) async fn drain_on(
    shutdown: impl Future<Output = ()>,
    draining: watch::Sender<bool>,
    delay: Duration,
    stop: watch::Sender<bool>,
) {
    shutdown.await;
    tracing::info!(delay = ?delay, "draining: health checks fail, then listeners close");
    draining.send_replace(true);
    tokio::time::sleep(delay).await;
    let _ = stop.send(true);
}

/// Completes on SIGTERM or Ctrl-C: the process's shutdown. The handlers are in place
/// once this returns, before the future is first awaited: a signal that arrives while the
/// server starts (connecting, waiting for its first rules) is heard, not fatal.
#[cfg(unix)]
pub fn terminated() -> impl Future<Output = ()> + Send + 'static {
    use tokio::signal::unix::{SignalKind, signal};
    let term = signal(SignalKind::terminate());
    let interrupt = signal(SignalKind::interrupt());
    async move {
        match (term, interrupt) {
            (Ok(mut term), Ok(mut interrupt)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = interrupt.recv() => {}
                }
            }
            (Ok(mut term), Err(_)) => {
                term.recv().await;
            }
            (Err(_), _) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
}

/// Completes on Ctrl-C: the process's shutdown.
#[cfg(not(unix))]
pub fn terminated() -> impl Future<Output = ()> + Send + 'static {
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// SIGHUP, heard from now on (a SIGHUP's default is to end the process); none where the
/// platform has no SIGHUP.
#[cfg(unix)]
pub(super) fn hangups() -> Option<tokio::signal::unix::Signal> {
    use tokio::signal::unix::{SignalKind, signal};
    signal(SignalKind::hangup()).ok()
}

/// Each of `hangups` reloads file rules, for as long as the server runs.
#[cfg(unix)]
pub(super) async fn reload_on_hangup(
    hangups: Option<tokio::signal::unix::Signal>,
    reload: Option<Reload>,
) {
    let Some(mut hup) = hangups else {
        return;
    };
    while hup.recv().await.is_some() {
        match &reload {
            // Off this loop, so that the next SIGHUP is heard while rules load.
            Some(reload) => {
                let reload = reload.clone();
                tokio::spawn(async move { reload.run().await });
            }
            None => tracing::info!("SIGHUP: rules come from xDS; nothing to reload"),
        }
    }
}

#[cfg(not(unix))]
pub(super) fn hangups() -> Option<()> {
    None
}

#[cfg(not(unix))]
pub(super) async fn reload_on_hangup(_hangups: Option<()>, _reload: Option<Reload>) {}

pub(super) async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}

#[cfg(test)]
mod tests {
    #[cfg(unix)]
    #[tokio::test]
    async fn a_sigterm_before_the_shutdown_is_awaited_is_heard() {
        use std::time::Duration;

        use tollgate_testkit::process::{Signal, signal_self};

        let shutdown = super::terminated();
        // Before the future is first polled: with the handler not yet in place, SIGTERM's
        // default action would end this test binary here.
        signal_self(Signal::Term);
        let heard = tokio::time::timeout(Duration::from_secs(10), shutdown).await;
        assert!(heard.is_ok(), "the shutdown did not complete");
    }
}
