//! Watching the rules path: any change there (an edit, a new file, a Kubernetes ConfigMap
//! swapping its `..data` link) triggers a reload shortly after the writes settle.

use std::path::{Path, PathBuf};
use std::time::Duration;

use notify::{RecursiveMode, Watcher};
use tokio::sync::mpsc;

/// Writes closer together than this are one change (editors write in several steps).
const SETTLE: Duration = Duration::from_millis(150);

/// Keeps the watch alive; dropping it stops watching.
pub struct RulesWatch {
    _watcher: notify::RecommendedWatcher,
}

/// Calls `reload` after every settled change at `path`, from a background task.
pub fn watch(path: &Path, reload: impl Fn() + Send + 'static) -> Result<RulesWatch, String> {
    let (target, mode, only) = if path.is_dir() {
        (path.to_owned(), RecursiveMode::Recursive, None)
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
            (Ok(e), Some(name)) => {
                e.paths.is_empty()
                    || e.paths
                        .iter()
                        .any(|p| p.file_name() == Some(name.as_os_str()))
            }
            _ => true,
        };
        if relevant {
            let _ = tx.send(());
        }
    })
    .map_err(|e| format!("cannot watch {}: {e}", path.display()))?;
    watcher
        .watch(&target, mode)
        .map_err(|e| format!("cannot watch {}: {e}", target.display()))?;
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
            reload();
        }
    });
    Ok(RulesWatch { _watcher: watcher })
}
