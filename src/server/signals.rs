//! Signals: SIGHUP reloads file rules, SIGTERM or Ctrl-C drains and stops.

use std::time::Duration;

use tokio::sync::watch;

use crate::config::reload::Reload;

/// SIGHUP reloads file rules; SIGTERM or Ctrl-C drains and stops.
pub(super) async fn handle_signals(
    reload: Option<Reload>,
    draining: watch::Sender<bool>,
    delay: Duration,
    stop: watch::Sender<bool>,
) {
    wait_for_stop(reload.as_ref()).await;
    tracing::info!(delay = ?delay, "draining: health checks fail, then listeners close");
    draining.send_replace(true);
    tokio::time::sleep(delay).await;
    let _ = stop.send(true);
}

#[cfg(unix)]
async fn wait_for_stop(reload: Option<&Reload>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return,
            _ = term.recv() => return,
            _ = hup.recv() => match reload {
                // Off this loop, so that SIGTERM is heard while rules load.
                Some(reload) => {
                    let reload = reload.clone();
                    tokio::spawn(async move { reload.run().await });
                }
                None => tracing::info!("SIGHUP: rules come from xDS; nothing to reload"),
            },
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_stop(_reload: Option<&Reload>) {
    let _ = tokio::signal::ctrl_c().await;
}

pub(super) async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}
