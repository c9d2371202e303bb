//! Rules from files, kept current: loaded off the async workers with a time budget, and
//! loaded again on every change under the rules path (an edit, a new file, a Kubernetes
//! ConfigMap swapping its `..data` link) or on SIGHUP. Invalid rules leave the previous
//! ones serving.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tollgate_core::rules::RulesBuilder;
use tollgate_core::{ConfigError, ConfigErrors, Rules};

use crate::config::settings::RuleArgs;

use crate::app::App;
use crate::config::rules_status::Source;
use crate::config::watch::{self, FileWatch, Watched};

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
    app: Arc<App>,
    path: PathBuf,
    settings: Arc<RuleArgs>,
    one_at_a_time: Arc<Mutex<()>>,
}

impl Reload {
    pub(crate) fn new(app: Arc<App>, path: PathBuf, settings: Arc<RuleArgs>) -> Self {
        Self {
            app,
            path,
            settings,
            one_at_a_time: Arc::default(),
        }
    }

    pub(crate) async fn run(&self) {
        let _turn = self.one_at_a_time.lock().await;
        let metrics = &self.app.metrics;
        match load(&self.path, self.settings.builder()).await {
            Ok(rules) => {
                let domains = rules.domains().count();
                let source = Source::Files {
                    path: self.path.clone(),
                };
                self.app.install(rules, source);
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

/// Runs `reload` after every settled change under its path.
pub(crate) fn watch(reload: Reload) -> anyhow::Result<FileWatch> {
    let watched = vec![Watched::path(&reload.path)];
    watch::watch(watched, move || {
        let reload = reload.clone();
        async move { reload.run().await }
    })
}
