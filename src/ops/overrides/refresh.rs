//! Keeps the overrides in force up to date while the application lives: every
//! [`REFRESH`], and at once when a shared store announces a change, what changed in the
//! store is read (now and then the whole set, healing what a change made around its log
//! left out: see the registry's `WHOLE_READ`); in a process of its own, the expired are dropped.

use std::sync::Weak;
use std::time::Duration;

use tollgate_core::Store;

use crate::app::App;

/// How often the overrides are brought up to date without an announcement.
const REFRESH: Duration = Duration::from_secs(1);

/// Refreshes the overrides of `app` until it is gone.
pub(crate) fn spawn(app: Weak<App>) {
    tokio::spawn(async move {
        loop {
            let Some(store) = app.upgrade().map(|app| match app.limiter.store() {
                Store::Shared(shared) => Some(shared.clone()),
                _ => None,
            }) else {
                return;
            };
            match store {
                Some(store) => tokio::select! {
                    () = store.overrides_changed() => {}
                    () = tokio::time::sleep(REFRESH) => {}
                },
                None => tokio::time::sleep(REFRESH).await,
            }
            let Some(app) = app.upgrade() else {
                return;
            };
            if let Err(why) = app.overrides.refresh(&app.limiter).await {
                tracing::debug!("overrides not brought up to date: {why}");
            }
        }
    });
}
