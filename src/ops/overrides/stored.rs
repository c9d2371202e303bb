//! Overrides in a shared store (Redis, PostgreSQL), their truth: read whole at start, on
//! every announcement of a change, and every [`REREAD`] in case one was missed; at most
//! `OVERRIDES_MAX` of them, the rest refused with a log line.

use std::sync::{Arc, Weak};
use std::time::Duration;

use tollgate_core::overrides::{Override, Overrides};
use tollgate_core::store::SharedStore;
use tollgate_core::{Limiter, StoreError};

use crate::app::App;
use crate::ops::metrics::RuleMetrics;

/// How often the stored overrides are read again without an announcement.
const REREAD: Duration = Duration::from_secs(1);

/// The overrides in `store`, at most `max`; `last_read` holds their JSON as last read, and
/// when it is unchanged the overrides in force are kept as they are.
pub(super) async fn read(
    store: &SharedStore,
    limiter: &Limiter<RuleMetrics>,
    max: usize,
    last_read: &mut Vec<String>,
) -> Result<Overrides, StoreError> {
    let mut raw = store.read_overrides(max.saturating_add(1)).await?;
    if raw.len() > max {
        tracing::warn!(
            "the store holds more than {max} overrides (OVERRIDES_MAX); those past it are \
             refused"
        );
        raw.truncate(max);
    }
    if raw == *last_read {
        return Ok(Overrides::clone(&limiter.overrides()));
    }
    let source = format!("the store {}", store.name());
    let mut all = Overrides::default();
    for json in &raw {
        let restored = serde_json::from_str::<Override>(json)
            .map_err(|e| e.to_string())
            .and_then(|spec| {
                limiter
                    .restore_override(spec, &source)
                    .map_err(|e| e.to_string())
            });
        match restored {
            Ok(compiled) => {
                if let Err(why) = all.insert(compiled, max) {
                    tracing::warn!("a stored override is refused: {why}");
                }
            }
            Err(why) => tracing::warn!("a stored override is ignored: {why}: {json}"),
        }
    }
    *last_read = raw;
    Ok(all)
}

/// Reads the stored overrides again on every announcement and every [`REREAD`], while the
/// application lives.
pub(crate) fn spawn(app: Weak<App>, store: &Arc<SharedStore>) {
    let store = Arc::downgrade(store);
    tokio::spawn(async move {
        loop {
            let Some(heard) = store.upgrade() else {
                return;
            };
            tokio::select! {
                () = heard.overrides_changed() => {}
                () = tokio::time::sleep(REREAD) => {}
            }
            drop(heard);
            let Some(app) = app.upgrade() else {
                return;
            };
            if let Err(why) = app.overrides.reread(&app.limiter).await {
                tracing::debug!("overrides not read again: {why}");
            }
        }
    });
}
