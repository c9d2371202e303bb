//! Runtime overrides as the service keeps them: every change is checked, kept where the
//! settings say (the shared store, or else the process or `OVERRIDES_FILE`), installed
//! whole in the limiter, logged once and counted in a gauge. Changes are made one at a
//! time in an instance; in a shared store the store itself makes each one atomically
//! (`OVERRIDES_MAX` and the deadline enforced there), so none is lost or half-applied
//! across instances either.

mod file;
pub(crate) mod http;
pub(crate) mod refresh;
mod stored;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Mutex;
use tollgate_core::overrides::{
    ChangeError, Changed, Override, OverrideEntry, OverrideError, OverrideFeed, OverrideUpdate,
    Overrides, descriptor_id,
};
use tollgate_core::store::SharedStore;
use tollgate_core::{Clock as _, Limiter, SystemClock};

use crate::ops::metrics::RuleMetrics;

/// How often a shared store's whole set is read again.
const WHOLE_READ: Duration = Duration::from_secs(300);
/// The least time between two whole reads made because the log could not tell.
const WHOLE_READ_GAP: Duration = Duration::from_secs(10);

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
    /// The store did not say whether it made the change, and could not be asked.
    #[error("cannot tell whether the change was kept: {0}")]
    Unknown(String),
}

/// What a registry holds between changes: where it stands in a shared store's log, when
/// it last read the whole set there, and the file's log.
#[derive(Default)]
struct Kept {
    feed: OverrideFeed,
    whole_read: Option<Instant>,
    file: Option<Arc<std::sync::Mutex<file::Log>>>,
}

/// Where overrides live, and the one change (or refresh) in progress.
pub(crate) struct OverrideRegistry {
    changing: Mutex<Kept>,
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
            changing: Mutex::new(Kept::default()),
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
    /// a store not answering yet is read within a second).
    pub(crate) async fn load(&self, limiter: &Limiter<RuleMetrics>) -> anyhow::Result<()> {
        if self.store.is_some() {
            if let Err(why) = self.refresh(limiter).await {
                tracing::warn!("overrides not read at start: {why}");
            }
            return Ok(());
        }
        let Some(path) = &self.file else {
            return Ok(());
        };
        let (log, specs) = file::Log::open(path, self.max, SystemClock.now())?;
        let source = self.kept_in();
        let mut all = Overrides::default();
        for spec in specs {
            let described = format!("{} {}", spec.domain, entries(&spec.entries));
            let compiled = limiter
                .restore_override(spec, &source)
                .map_err(|e| anyhow::anyhow!("{}: override of {described}: {e}", path.display()))?;
            all.insert(compiled, usize::MAX)?;
        }
        tracing::info!(count = all.len(), from = %source, "overrides loaded");
        self.changing.lock().await.file = Some(Arc::new(std::sync::Mutex::new(log)));
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
        let spec = compiled.spec().clone();
        let mut kept = self.changing.lock().await;
        let replaced = match &self.store {
            Some(store) => {
                let json = serde_json::to_string(&spec).map_err(|e| OverrideError {
                    field: "override".to_owned(),
                    message: e.to_string(),
                })?;
                let changed = store
                    .set_override(&spec.id(), &json, spec.expires_at, self.max)
                    .await;
                let previous = match changed.map_err(|e| self.unkept(e))? {
                    Changed::Full(_) => return Err(too_many(self.max).into()),
                    Changed::Made(previous) => previous,
                    Changed::Settled => None,
                };
                let mut all = Overrides::clone(&limiter.overrides());
                let replaced = all.insert(compiled, usize::MAX)?;
                self.install(limiter, all);
                self.catch_up(limiter, &mut kept).await;
                stored::parse(previous.as_deref()).or_else(|| replaced.map(|r| r.spec().clone()))
            }
            None => {
                // When full, the expired go first, freeing their places.
                let mut all = Overrides::clone(&limiter.overrides());
                let mut records = if all.len() >= self.max {
                    drop_expired(&mut all)
                } else {
                    Vec::new()
                };
                let replaced = all.insert(compiled, self.max)?;
                records.push(file::Record::Set(spec.clone()));
                self.keep_in_file(&kept, &all, records).await?;
                self.install(limiter, all);
                replaced.map(|r| r.spec().clone())
            }
        };
        // Debug-formatted: a client's value with control characters is logged escaped.
        tracing::info!(
            %who,
            domain = ?spec.domain,
            descriptor = ?entries(&spec.entries),
            limit = ?limit_text(&spec),
            replaced = ?replaced.as_ref().map_or_else(|| "none".to_owned(), limit_text),
            "override set"
        );
        Ok(replaced)
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
        let mut kept = self.changing.lock().await;
        let mut all = Overrides::clone(&limiter.overrides());
        let here = all.remove(domain, pairs());
        let removed = match &self.store {
            Some(store) => {
                let id = descriptor_id(domain, pairs());
                let here = here.map(|o| o.spec().clone());
                let removed = match store.delete_override(&id).await {
                    Ok(Changed::Made(previous)) => stored::parse(previous.as_deref()),
                    // Made, what it removed unseen: this instance's copy.
                    Ok(Changed::Settled) => here,
                    Ok(Changed::Full(_)) => None,
                    Err(e) => return Err(self.unkept(e)),
                };
                self.install(limiter, all);
                self.catch_up(limiter, &mut kept).await;
                removed.filter(|o| !o.expired(SystemClock.now()))
            }
            None => {
                let removed = here.map(|o| o.spec().clone());
                if let Some(o) = &removed {
                    let record = file::Record::deleted(o);
                    self.keep_in_file(&kept, &all, vec![record]).await?;
                    self.install(limiter, all);
                }
                removed
            }
        };
        let spec = removed.ok_or(Refused::Missing)?;
        tracing::info!(
            %who,
            domain = ?domain,
            descriptor = ?entries_text(pairs()),
            limit = ?limit_text(&spec),
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

    /// Brings the overrides in force up to date: from a shared store, what changed there
    /// (the whole set now and then); in this process, those expired dropped.
    pub(crate) async fn refresh(&self, limiter: &Limiter<RuleMetrics>) -> Result<(), Refused> {
        let mut kept = self.changing.lock().await;
        match &self.store {
            Some(store) => {
                let most = self.max.saturating_add(1);
                let read = |at: &Option<Instant>, gap| at.is_none_or(|at| at.elapsed() >= gap);
                let mut whole = read(&kept.whole_read, WHOLE_READ);
                let mut updated = store.override_updates(&mut kept.feed, whole, most).await;
                // A log that cannot tell is read whole, but not more often than the gap
                // (a forged log must not make every second a whole read).
                if matches!(updated, Ok(OverrideUpdate::Behind))
                    && read(&kept.whole_read, WHOLE_READ_GAP)
                {
                    whole = true;
                    updated = store.override_updates(&mut kept.feed, true, most).await;
                }
                let updated = updated.map_err(|e| self.unkept(ChangeError::NotMade(e)))?;
                if whole {
                    kept.whole_read = Some(Instant::now());
                }
                let source = format!("the store {}", store.name());
                if let Some(all) = stored::apply(limiter, updated, &source, self.max) {
                    self.install(limiter, all);
                }
                Ok(())
            }
            None => self.purge(limiter, &kept).await,
        }
    }

    /// Reads what changed in the shared store just after a change made here; a failure
    /// is left to the next refresh.
    async fn catch_up(&self, limiter: &Limiter<RuleMetrics>, kept: &mut Kept) {
        let Some(store) = &self.store else {
            return;
        };
        match store
            .override_updates(&mut kept.feed, false, self.max.saturating_add(1))
            .await
        {
            Ok(updated) => {
                let source = format!("the store {}", store.name());
                if let Some(all) = stored::apply(limiter, updated, &source, self.max) {
                    self.install(limiter, all);
                }
            }
            Err(why) => tracing::debug!("overrides not read after a change: {why}"),
        }
    }

    /// Drops the overrides expired now from this process (and its file).
    async fn purge(&self, limiter: &Limiter<RuleMetrics>, kept: &Kept) -> Result<(), Refused> {
        let current = limiter.overrides();
        if current.expired(SystemClock.now()).is_empty() {
            return Ok(());
        }
        let mut all = Overrides::clone(&current);
        let records = drop_expired(&mut all);
        let count = records.len();
        self.keep_in_file(kept, &all, records).await?;
        tracing::info!(count, "expired overrides dropped");
        self.install(limiter, all);
        Ok(())
    }

    /// Appends `records` to the file, if there is one; `all` is the set they make.
    async fn keep_in_file(
        &self,
        kept: &Kept,
        all: &Overrides,
        records: Vec<file::Record>,
    ) -> Result<(), Refused> {
        let Some(log) = kept.file.clone() else {
            return Ok(());
        };
        let count = all.len();
        let live: Vec<Override> = if file::Log::lock(&log).wants_whole(records.len(), count) {
            all.list(None)
                .into_iter()
                .map(|o| o.spec().clone())
                .collect()
        } else {
            Vec::new()
        };
        tokio::task::spawn_blocking(move || file::Log::lock(&log).append(&records, &live, count))
            .await
            .map_err(|e| Refused::Keep(e.to_string()))?
            .map_err(|e| Refused::Keep(format!("{e:#}")))
    }

    /// Installs `all`; the gauge counts them (an expired one until it is purged, within a
    /// second or two).
    fn install(&self, limiter: &Limiter<RuleMetrics>, all: Overrides) {
        self.count.set(i64::try_from(all.len()).unwrap_or(i64::MAX));
        limiter.set_overrides(all);
    }

    /// A shared store's failure, as a refusal that names the store.
    fn unkept(&self, e: ChangeError) -> Refused {
        match e {
            ChangeError::NotMade(e) => Refused::Keep(format!("{e} ({})", self.kept_in())),
            unknown @ ChangeError::Unknown(_) => {
                Refused::Unknown(format!("{unknown} ({})", self.kept_in()))
            }
        }
    }
}

/// Drops the overrides of `all` expired now: the records of their deletes.
fn drop_expired(all: &mut Overrides) -> Vec<file::Record> {
    all.expired(SystemClock.now())
        .iter()
        .filter_map(|id| all.remove_id(id))
        .map(|o| file::Record::deleted(o.spec()))
        .collect()
}

/// The refusal of one override more than `max`.
fn too_many(max: usize) -> OverrideError {
    OverrideError {
        field: "overrides".to_owned(),
        message: format!("too many: at most {max} (OVERRIDES_MAX)"),
    }
}

/// `k=v,k2=v2`.
pub(crate) fn entries(entries: &[OverrideEntry]) -> String {
    entries_text(entries.iter().map(|e| (e.key.as_str(), e.value.as_str())))
}

fn entries_text<'a>(pairs: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    pairs
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// `5 per minute` (with its multiplier, algorithm, name and expiry when given).
pub(crate) fn limit_text(spec: &Override) -> String {
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
