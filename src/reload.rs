//! Rules from files, kept current: loaded off the async workers with a time budget, and
//! loaded again on every change under the rules path (an edit, a new file, a Kubernetes
//! ConfigMap swapping its `..data` link) or on SIGHUP. Invalid rules leave the previous
//! ones serving.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use std::sync::Arc;
use std::time::Duration;

use notify::event::{EventKind, MetadataKind, ModifyKind};
use notify::{RecursiveMode, Watcher};
use tokio::sync::{Mutex, mpsc};
use tollgate_core::rules::RulesBuilder;
use tollgate_core::{ConfigError, ConfigErrors, Rules};

use crate::settings::RuleArgs;

use crate::rls::Rls;
use crate::rules_status::Source;

/// Writes closer together than this are one change (editors write in several steps).
const SETTLE: Duration = Duration::from_millis(150);
/// The longest one load may take; a slower one is abandoned and counted as failed.
const LOAD_BUDGET: Duration = Duration::from_secs(30);

/// Loads `path` into `builder` on a blocking thread, within [`LOAD_BUDGET`].
pub(crate) async fn load(path: &Path, mut builder: RulesBuilder) -> Result<Rules, ConfigErrors> {
    let owned = path.to_owned();
    let loading = tokio::task::spawn_blocking(move || {
        builder.add_path(&owned);
        builder.finish()
    });
    let whole = |message: String| {
        ConfigErrors(vec![ConfigError {
            origin: path.display().to_string(),
            path: String::new(),
            message,
        }])
    };
    match tokio::time::timeout(LOAD_BUDGET, loading).await {
        Ok(Ok(result)) => result,
        Ok(Err(e)) => Err(whole(format!("loading failed: {e}"))),
        Err(_) => Err(whole(format!(
            "loading took longer than {LOAD_BUDGET:?}; abandoned"
        ))),
    }
}

/// Reloads the rules into the service: the new rules serve from the next request, or, if
/// they are invalid, the old ones keep serving and the problem is logged and counted.
/// Clones share one lock, so reloads never overlap.
#[derive(Clone)]
pub(crate) struct Reload {
    rls: Arc<Rls>,
    path: PathBuf,
    settings: Arc<RuleArgs>,
    one_at_a_time: Arc<Mutex<()>>,
}

impl Reload {
    pub(crate) fn new(rls: Arc<Rls>, path: PathBuf, settings: Arc<RuleArgs>) -> Self {
        Self {
            rls,
            path,
            settings,
            one_at_a_time: Arc::default(),
        }
    }

    pub(crate) async fn run(&self) {
        let _turn = self.one_at_a_time.lock().await;
        let metrics = &self.rls.metrics;
        match load(&self.path, self.settings.builder()).await {
            Ok(rules) => {
                let domains = rules.domains().count();
                let source = Source::Files {
                    path: self.path.clone(),
                };
                self.rls.install(rules, source);
                tracing::info!(path = %self.path.display(), domains, "rules reloaded");
            }
            Err(problems) => {
                metrics.config_load_error.inc_by(1);
                for problem in &problems.0 {
                    tracing::error!("{problem}");
                }
                tracing::error!("rules rejected; the previous rules keep serving");
            }
        }
    }
}

/// Keeps the watch alive; dropping it stops watching.
pub(crate) struct RulesWatch {
    _watcher: notify::RecommendedWatcher,
}

/// Runs `reload` after every settled change at its path, from a background task.
pub(crate) fn watch(reload: Reload) -> anyhow::Result<RulesWatch> {
    let path = reload.path.clone();
    let (target, mode, only) = if path.is_dir() {
        (path.clone(), RecursiveMode::Recursive, None)
    } else {
        // Watch the directory: editors and ConfigMaps replace files rather than write them.
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        (
            parent.to_owned(),
            RecursiveMode::NonRecursive,
            path.file_name().map(PathBuf::from),
        )
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match (&event, &only) {
            (Ok(e), _) if !changes_content(&e.kind) => false,
            (Ok(e), Some(name)) => {
                e.paths.is_empty()
                    || e.paths
                        .iter()
                        .any(|p| p.file_name() == Some(name.as_os_str()))
            }
            _ => true,
        };
        if relevant {
            // The receiver lives as long as the watch; a send can only fail after it.
            let _ = tx.send(());
        }
    })
    .with_context(|| format!("cannot watch {}", path.display()))?;
    watcher
        .watch(&target, mode)
        .with_context(|| format!("cannot watch {}", target.display()))?;
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            // Let the burst of writes finish, then reload once.
            loop {
                match tokio::time::timeout(SETTLE, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            reload.run().await;
        }
    });
    Ok(RulesWatch { _watcher: watcher })
}

/// Whether an event can change what a load reads. Reading files (the loader's own reads,
/// a `cat`, another instance) produces access events; reacting to those would reload
/// forever.
fn changes_content(kind: &EventKind) -> bool {
    match kind {
        EventKind::Access(_) => false,
        EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)) => false,
        EventKind::Any
        | EventKind::Create(_)
        | EventKind::Modify(_)
        | EventKind::Remove(_)
        | EventKind::Other => true,
    }
}

#[cfg(test)]
mod tests {
    use notify::event::{AccessKind, AccessMode, CreateKind, DataChange, RenameMode};

    use super::*;

    #[test]
    fn reads_are_not_changes() {
        for quiet in [
            EventKind::Access(AccessKind::Open(AccessMode::Read)),
            EventKind::Access(AccessKind::Close(AccessMode::Read)),
            EventKind::Modify(ModifyKind::Metadata(MetadataKind::AccessTime)),
        ] {
            assert!(!changes_content(&quiet), "{quiet:?}");
        }
        for change in [
            EventKind::Create(CreateKind::File),
            EventKind::Modify(ModifyKind::Data(DataChange::Any)),
            EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
            EventKind::Remove(notify::event::RemoveKind::File),
        ] {
            assert!(changes_content(&change), "{change:?}");
        }
    }
}
