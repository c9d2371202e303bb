//! Runtime overrides as the service keeps them: every change is checked, kept where the
//! settings say (the shared store, or else the process or `OVERRIDES_FILE`), installed
//! whole in the limiter, logged once and counted in a gauge. Changes are made one at a
//! time, so none is lost or half-applied.

mod file;
pub(crate) mod http;
pub(crate) mod stored;

use std::path::PathBuf;
use std::sync::Arc;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Mutex;
use tollgate_core::Limiter;
use tollgate_core::overrides::{Override, OverrideEntry, OverrideError, Overrides};
use tollgate_core::store::SharedStore;

use crate::ops::metrics::RuleMetrics;

/// Why a change was refused.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Refused {
    /// The override is invalid: a 400 naming the field.
    #[error(transparent)]
    Invalid(#[from] OverrideError),
    /// Overrides are off in this mode: the reason.
    #[error("{0}")]
    Off(&'static str),
    /// There is no override for that descriptor.
    #[error("no override for that descriptor")]
    Missing,
    /// Keeping the change failed; nothing changed.
    #[error("cannot keep the overrides: {0}")]
    Keep(String),
}

/// One change to write to the shared store.
enum Write {
    /// Set the override of a descriptor id to this JSON.
    Set { id: String, spec: String },
    /// Delete the override of a descriptor id.
    Delete { id: String },
}

/// Where overrides live, and the one change (or re-read) in progress, holding the stored
/// overrides' JSON as last read.
pub(crate) struct OverrideRegistry {
    changing: Mutex<Vec<String>>,
    max: usize,
    file: Option<PathBuf>,
    store: Option<Arc<SharedStore>>,
    off: Option<&'static str>,
    count: Gauge,
}

impl OverrideRegistry {
    /// At most `max` overrides, kept in `store` when shared, else in `file` when one is
    /// given; `reference` mode refuses them; `count` is the gauge of how many there are.
    pub(crate) fn new(
        max: usize,
        file: Option<PathBuf>,
        store: Option<Arc<SharedStore>>,
        reference: bool,
        count: Gauge,
    ) -> Self {
        let off = reference.then_some(
            "REFERENCE_MODE serves the reference's rules only; runtime overrides are Tollgate's",
        );
        Self {
            changing: Mutex::new(Vec::new()),
            max,
            file,
            store,
            off,
            count,
        }
    }

    /// Where overrides are kept, for a person.
    pub(crate) fn kept_in(&self) -> String {
        match (&self.store, &self.file) {
            (Some(store), _) => format!("the store {}", store.name()),
            (None, Some(path)) => format!("OVERRIDES_FILE {}", path.display()),
            (None, None) => "this process".to_owned(),
        }
    }

    /// Installs the overrides kept in the file, if any, or in the shared store (at start;
    /// a store not answering yet is read again within a second).
    pub(crate) async fn load(&self, limiter: &Limiter<RuleMetrics>) -> anyhow::Result<()> {
        if self.store.is_some() {
            if let Err(why) = self.reread(limiter).await {
                tracing::warn!("overrides not read at start: {why}");
            }
            return Ok(());
        }
        let Some(path) = &self.file else {
            return Ok(());
        };
        let source = self.kept_in();
        let mut all = Overrides::default();
        for (i, spec) in file::read(path)?.into_iter().enumerate() {
            let compiled = limiter
                .restore_override(spec, &source)
                .map_err(|e| anyhow::anyhow!("{}: override {i}: {e}", path.display()))?;
            all.insert(compiled, usize::MAX)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        }
        tracing::info!(count = all.len(), from = %source, "overrides loaded");
        self.install(limiter, all);
        Ok(())
    }

    /// Sets `spec` (checked against the rules now serving); returns the one it replaced.
    pub(crate) async fn set(
        &self,
        limiter: &Limiter<RuleMetrics>,
        spec: Override,
        who: &str,
    ) -> Result<Option<Override>, Refused> {
        self.refuse_if_off()?;
        let compiled = limiter.compile_override(spec, &format!("set over HTTP by {who}"))?;
        self.change(limiter, |all| {
            let spec = compiled.spec().clone();
            let write = Write::Set {
                id: spec.id(),
                spec: serde_json::to_string(&spec).map_err(|e| OverrideError {
                    field: "override".to_owned(),
                    message: e.to_string(),
                })?,
            };
            let replaced = all.insert(compiled, self.max)?;
            Ok(((spec, replaced), Some(write)))
        })
        .await
        .map(|(spec, replaced)| {
            let replaced = replaced.map(|r| r.spec().clone());
            tracing::info!(
                %who,
                domain = %spec.domain,
                descriptor = %entries(&spec.entries),
                limit = %limit_text(&spec),
                replaced = %replaced.as_ref().map_or_else(|| "none".to_owned(), limit_text),
                "override set"
            );
            replaced
        })
    }

    /// Removes the override of `domain`'s descriptor of `entries`; returns it.
    pub(crate) async fn delete(
        &self,
        limiter: &Limiter<RuleMetrics>,
        domain: &str,
        entries: &[OverrideEntry],
        who: &str,
    ) -> Result<Override, Refused> {
        self.refuse_if_off()?;
        let pairs = || entries.iter().map(|e| (e.key.as_str(), e.value.as_str()));
        let removed = self
            .change(limiter, |all| {
                let removed = all.remove(domain, pairs());
                let write = removed
                    .as_ref()
                    .map(|o| Write::Delete { id: o.spec().id() });
                Ok((removed, write))
            })
            .await?
            .ok_or(Refused::Missing)?;
        let spec = removed.spec().clone();
        tracing::info!(
            %who,
            domain,
            descriptor = %entries_text(pairs()),
            limit = %limit_text(&spec),
            "override deleted"
        );
        Ok(spec)
    }

    /// The overrides in force.
    pub(crate) fn all(&self, limiter: &Limiter<RuleMetrics>) -> Result<Arc<Overrides>, Refused> {
        self.refuse_if_off()?;
        Ok(limiter.overrides())
    }

    fn refuse_if_off(&self) -> Result<(), Refused> {
        self.off.map_or(Ok(()), |why| Err(Refused::Off(why)))
    }

    /// Applies `edit` to a copy of the overrides in force (read again first from a shared
    /// store, their truth), keeps the change, then installs the copy: a refused edit or a
    /// failed write changes nothing here.
    async fn change<T>(
        &self,
        limiter: &Limiter<RuleMetrics>,
        edit: impl FnOnce(&mut Overrides) -> Result<(T, Option<Write>), OverrideError>,
    ) -> Result<T, Refused> {
        let mut last_read = self.changing.lock().await;
        let mut all = match &self.store {
            Some(store) => stored::read(store, limiter, self.max, &mut last_read)
                .await
                .map_err(|e| self.unkept(&e))?,
            None => Overrides::clone(&limiter.overrides()),
        };
        let (out, write) = edit(&mut all)?;
        if let Some(store) = &self.store {
            let written = match write {
                Some(Write::Set { id, spec }) => store.write_override(&id, spec).await,
                Some(Write::Delete { id }) => store.delete_override(&id).await,
                None => Ok(()),
            };
            written.map_err(|e| self.unkept(&e))?;
        } else if let Some(path) = &self.file {
            let specs: Vec<Override> = all
                .list(None)
                .into_iter()
                .map(|o| o.spec().clone())
                .collect();
            let path = path.clone();
            tokio::task::spawn_blocking(move || file::write(&path, &specs))
                .await
                .map_err(|e| Refused::Keep(e.to_string()))?
                .map_err(|e| Refused::Keep(format!("{e:#}")))?;
        }
        self.install(limiter, all);
        Ok(out)
    }

    /// Reads the overrides of the shared store again and installs them when they changed.
    pub(crate) async fn reread(&self, limiter: &Limiter<RuleMetrics>) -> Result<(), Refused> {
        let Some(store) = &self.store else {
            return Ok(());
        };
        let mut last_read = self.changing.lock().await;
        let before = last_read.clone();
        let all = stored::read(store, limiter, self.max, &mut last_read)
            .await
            .map_err(|e| self.unkept(&e))?;
        if *last_read != before {
            tracing::info!(count = all.len(), from = %self.kept_in(), "overrides read from the store");
            self.install(limiter, all);
        }
        Ok(())
    }

    fn install(&self, limiter: &Limiter<RuleMetrics>, all: Overrides) {
        self.count.set(i64::try_from(all.len()).unwrap_or(i64::MAX));
        limiter.set_overrides(all);
    }

    /// A shared store's failure, as a refusal that names the store.
    fn unkept(&self, e: &tollgate_core::StoreError) -> Refused {
        Refused::Keep(format!("{e} ({})", self.kept_in()))
    }
}

/// `k=v,k2=v2`.
fn entries(entries: &[OverrideEntry]) -> String {
    entries_text(entries.iter().map(|e| (e.key.as_str(), e.value.as_str())))
}

fn entries_text<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    pairs
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `5 per minute` (with its multiplier, algorithm, name and expiry when given).
fn limit_text(spec: &Override) -> String {
    let l = &spec.limit;
    let mut text = format!("{} per", l.requests_per_unit);
    if let Some(m) = l.unit_multiplier {
        text.push_str(&format!(" {m}"));
    }
    text.push_str(&format!(" {}", l.unit.to_lowercase()));
    if let Some(algorithm) = &l.algorithm {
        text.push_str(&format!(" ({algorithm})"));
    }
    if let Some(name) = &l.name {
        text.push_str(&format!(" name={name}"));
    }
    if let Some(at) = spec.expires_at {
        text.push_str(&format!(" until {at}"));
    }
    text
}

#[cfg(test)]
mod tests {
    use tollgate_core::overrides::OverrideLimit;
    use tollgate_core::{MemoryStore, Options, Rules, Store};

    use super::*;
    use crate::ops::metrics::Metrics;

    /// An override of `tenant=acme` in `api`: 5 a minute.
    pub(super) fn acme() -> Override {
        Override {
            domain: "api".into(),
            entries: vec![OverrideEntry {
                key: "tenant".into(),
                value: "acme".into(),
            }],
            limit: OverrideLimit {
                requests_per_unit: 5,
                unit: "minute".into(),
                unit_multiplier: None,
                algorithm: None,
                name: None,
            },
            expires_at: None,
        }
    }

    #[tokio::test]
    async fn reference_mode_refuses_every_change_with_a_reason() {
        let (_, recorder) = Metrics::new(0.8, 10);
        let store = Store::Memory(MemoryStore::default());
        let limiter = Limiter::with_recorder(Rules::default(), store, Options::default(), recorder);
        let registry = OverrideRegistry::new(10, None, None, true, Gauge::default());
        let spec = acme();
        let refused = registry.set(&limiter, spec.clone(), "test").await;
        assert!(
            matches!(&refused, Err(Refused::Off(why)) if why.contains("REFERENCE_MODE")),
            "{refused:?}"
        );
        let deleted = registry
            .delete(&limiter, "api", &spec.entries, "test")
            .await;
        assert!(matches!(deleted, Err(Refused::Off(_))), "{deleted:?}");
        assert!(matches!(registry.all(&limiter), Err(Refused::Off(_))));
    }
}
