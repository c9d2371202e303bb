//! Files kept under watch: an action runs once after every settled burst of changes. Rules
//! and TLS material use it; both are replaced rather than written in place by editors and
//! Kubernetes (a ConfigMap or Secret swaps its `..data` link), so directories are watched.

use std::ffi::OsString;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use notify::event::{EventKind, MetadataKind, ModifyKind};
use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Writes closer together than this are one change (editors write in several steps).
const SETTLE: Duration = Duration::from_millis(150);
/// The link Kubernetes swaps when a mounted ConfigMap or Secret changes.
const KUBERNETES_DATA_LINK: &str = "..data";

/// What to watch.
#[derive(Debug, Clone)]
pub(crate) enum Watched {
    /// Everything under a directory.
    Tree(PathBuf),
    /// Some files of one directory (and its Kubernetes `..data` link).
    Files { dir: PathBuf, names: Vec<OsString> },
}

impl Watched {
    /// `path` itself: its tree if it is a directory, else the file in its directory.
    pub(crate) fn path(path: &Path) -> Self {
        // Events name paths under what was watched; an absolute form compares with them
        // whatever the working directory.
        let path = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
        if path.is_dir() {
            return Self::Tree(path);
        }
        let dir = path.parent().unwrap_or(Path::new("/"));
        Self::Files {
            dir: dir.to_owned(),
            names: path.file_name().map(OsString::from).into_iter().collect(),
        }
    }

    /// Files, grouped by directory so that each directory is watched once.
    pub(crate) fn files<'a>(paths: impl IntoIterator<Item = &'a Path>) -> Vec<Self> {
        let mut watched: Vec<Self> = Vec::new();
        for path in paths {
            let Self::Files { dir, names } = Self::path(path) else {
                watched.push(Self::path(path));
                continue;
            };
            match watched
                .iter_mut()
                .find(|w| matches!(w, Self::Files { dir: d, .. } if *d == dir))
            {
                Some(Self::Files { names: known, .. }) => known.extend(names),
                _ => watched.push(Self::Files { dir, names }),
            }
        }
        watched
    }

    fn covers(&self, changed: &Path) -> bool {
        match self {
            Self::Tree(root) => changed.starts_with(root),
            Self::Files { dir, names } => {
                changed.parent() == Some(dir.as_path())
                    && changed.file_name().is_some_and(|name| {
                        name == KUBERNETES_DATA_LINK || names.iter().any(|n| n == name)
                    })
            }
        }
    }
}

/// Keeps the watch alive; dropping it stops watching.
pub(crate) struct FileWatch {
    _watcher: notify::RecommendedWatcher,
}

/// Runs `on_change` after every settled change to `watched`, from a background task; one
/// run at a time.
pub(crate) fn watch<F, Fut>(watched: Vec<Watched>, mut on_change: F) -> anyhow::Result<FileWatch>
where
    F: FnMut() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let (tx, mut rx) = mpsc::unbounded_channel::<()>();
    let filter = watched.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let relevant = match &event {
            Ok(e) if !changes_content(&e.kind) => false,
            // Events with paths name what changed; those without (overflow) may be anything.
            Ok(e) => {
                e.paths.is_empty() || e.paths.iter().any(|p| filter.iter().any(|w| w.covers(p)))
            }
            Err(_) => true,
        };
        if relevant {
            // The receiver lives as long as the watch; a send can only fail after it.
            let _ = tx.send(());
        }
    })
    .context("cannot start watching files")?;
    for w in &watched {
        let (target, mode) = match w {
            Watched::Tree(root) => (root, RecursiveMode::Recursive),
            Watched::Files { dir, .. } => (dir, RecursiveMode::NonRecursive),
        };
        watcher
            .watch(target, mode)
            .with_context(|| format!("cannot watch {}", target.display()))?;
    }
    tokio::spawn(async move {
        while rx.recv().await.is_some() {
            // Let the burst of writes finish, then act once.
            loop {
                match tokio::time::timeout(SETTLE, rx.recv()).await {
                    Ok(Some(())) => continue,
                    Ok(None) => return,
                    Err(_) => break,
                }
            }
            on_change().await;
        }
    });
    Ok(FileWatch { _watcher: watcher })
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

    #[test]
    fn files_in_one_directory_are_watched_together() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
        let other = tempfile::tempdir().expect("temporary directory");
        let ca = other.path().join("ca.crt");
        let watched = Watched::files([cert.as_path(), key.as_path(), ca.as_path()]);
        assert_eq!(watched.len(), 2, "{watched:?}");
        assert!(watched[0].covers(&key));
        assert!(
            watched[0].covers(&dir.path().join("..data")),
            "Secret swaps"
        );
        assert!(!watched[0].covers(&dir.path().join("unrelated")));
        assert!(watched[1].covers(&ca));
        assert!(!watched[1].covers(&other.path().join("tls.crt")));
    }
}
