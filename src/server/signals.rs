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

/// Completes on SIGTERM or Ctrl-C: the process's shutdown.
pub async fn terminated() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// SIGHUP reloads file rules, for as long as the server runs.
#[cfg(unix)]
pub(super) async fn reload_on_hangup(reload: Option<Reload>) {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut hup) = signal(SignalKind::hangup()) else {
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
pub(super) async fn reload_on_hangup(_reload: Option<Reload>) {}

pub(super) async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}
