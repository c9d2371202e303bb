//! Overrides read from a shared store, their truth: what changed there applied to the set
//! in force, or the whole set read again. Each is read as the JSON it was stored as,
//! under the id it names; one that is not (a forged or broken entry) is ignored with a
//! log line, and past `OVERRIDES_MAX` the rest are refused with one.

use tollgate_core::Limiter;
use tollgate_core::overrides::{
    CompiledOverride, Override, OverrideError, OverrideUpdate, Overrides,
};

use crate::ops::metrics::RuleMetrics;

/// An override as stored (JSON), if it reads as one.
pub(super) fn parse(json: Option<&str>) -> Option<Override> {
    serde_json::from_str(json?).ok()
}

/// The set `update` makes of the overrides in force, at most `max` of them; none when
/// nothing changed.
pub(super) fn apply(
    limiter: &Limiter<RuleMetrics>,
    update: OverrideUpdate,
    source: &str,
    max: usize,
) -> Option<Overrides> {
    let mut refused = 0_usize;
    let mut put =
        |all: &mut Overrides, id: &str, json: &str| match restore(limiter, id, json, source) {
            Ok(compiled) => {
                if all.insert(compiled, max).is_err() {
                    refused += 1;
                }
            }
            Err(why) => {
                all.remove_id(id);
                tracing::warn!("a stored override is ignored: {why}: {json:.300}");
            }
        };
    let all = match update {
        OverrideUpdate::Behind => return None,
        OverrideUpdate::Changed(changed) if changed.is_empty() => return None,
        OverrideUpdate::Changed(changed) => {
            let mut all = Overrides::clone(&limiter.overrides());
            for (id, json) in &changed {
                match json {
                    Some(json) => put(&mut all, id, json),
                    None => {
                        all.remove_id(id);
                    }
                }
            }
            tracing::debug!(
                count = changed.len(),
                "override changes read from the store"
            );
            all
        }
        OverrideUpdate::All(stored) => {
            let mut all = Overrides::default();
            for (id, json) in &stored {
                put(&mut all, id, json);
            }
            let before = limiter.overrides();
            let same = before.len() == all.len()
                && all.list(None).iter().all(|o| {
                    before
                        .get(&o.spec().id())
                        .is_some_and(|b| b.spec() == o.spec())
                });
            if same {
                return None;
            }
            tracing::info!(count = all.len(), from = %source, "overrides read from the store");
            all
        }
    };
    if refused > 0 {
        tracing::warn!(
            "the store holds more than {max} overrides (OVERRIDES_MAX); {refused} past it are \
             refused"
        );
    }
    Some(all)
}

/// The override stored as `json` under descriptor `id`, compiled.
fn restore(
    limiter: &Limiter<RuleMetrics>,
    id: &str,
    json: &str,
    source: &str,
) -> Result<CompiledOverride, Unusable> {
    let spec: Override = serde_json::from_str(json)?;
    if spec.id() != id {
        return Err(Unusable::Misfiled(id.chars().take(200).collect()));
    }
    Ok(limiter.restore_override(spec, source)?)
}

/// Why a stored override is ignored.
#[derive(Debug, thiserror::Error)]
enum Unusable {
    /// Not the JSON of an override.
    #[error(transparent)]
    Unreadable(#[from] serde_json::Error),
    /// Kept under an id that is not its descriptor's (a hand's or a forger's write).
    #[error("stored under another descriptor's id ({0})")]
    Misfiled(String),
    /// An override these rules refuse.
    #[error(transparent)]
    Refused(#[from] OverrideError),
}
