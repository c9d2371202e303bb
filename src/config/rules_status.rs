//! The rules in force as operations see them: whether any have been loaded yet, where they
//! came from (files, or an xDS server's resources and version), and whether that counts
//! as healthy under `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Mutex;

use tokio::sync::watch;
use tollgate_core::Rules;
use tollgate_core::lock;

/// Where a rule set came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Source {
    /// The rules path (a file or a directory).
    Files { path: PathBuf },
    /// One State-of-the-World response of an xDS management server.
    Xds { server: String, version: String },
}

/// What health checks and startup wait on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Readiness {
    /// Some rules have been installed (possibly with no domain).
    pub(crate) loaded: bool,
    /// The rules satisfy the health setting.
    pub(crate) healthy: bool,
}

/// The state of the rules in force, shared by the loaders and the health checks.
#[derive(Debug)]
pub(crate) struct RulesStatus {
    /// `HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED`.
    require_domain: bool,
    source: Mutex<Option<Source>>,
    readiness: watch::Sender<Readiness>,
}

impl RulesStatus {
    /// Nothing loaded yet: healthy unless health requires a domain.
    pub(crate) fn new(require_domain: bool) -> Self {
        let (readiness, _) = watch::channel(Readiness {
            loaded: false,
            healthy: !require_domain,
        });
        Self {
            require_domain,
            source: Mutex::new(None),
            readiness,
        }
    }

    /// Rules with `domains` domains from `source` are in force. With the health setting,
    /// a load without any domain makes the service unhealthy, as in the reference.
    pub(crate) fn record(&self, source: Source, domains: usize) {
        *lock(&self.source) = Some(source);
        let healthy = !self.require_domain || domains > 0;
        self.readiness.send_replace(Readiness {
            loaded: true,
            healthy,
        });
    }

    pub(crate) fn readiness(&self) -> Readiness {
        *self.readiness.borrow()
    }

    /// Follows every change of [`Readiness`].
    pub(crate) fn subscribe(&self) -> watch::Receiver<Readiness> {
        self.readiness.subscribe()
    }

    /// Comment lines for `/rlconfig` saying where `rules` came from: the source, then each
    /// domain with the files or resources that define it.
    pub(crate) fn describe(&self, rules: &Rules) -> String {
        let source = lock(&self.source).clone();
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = match &source {
            None => writeln!(out, "# no rules loaded yet"),
            Some(Source::Files { path }) => writeln!(out, "# source: files at {}", path.display()),
            Some(Source::Xds { server, version }) => {
                writeln!(out, "# source: xDS server {server}, version {version:?}")
            }
        };
        let what = match source {
            Some(Source::Xds { .. }) => "resource",
            _ => "file",
        };
        for (name, domain) in rules.domains() {
            let _ = writeln!(
                out,
                "# domain {name}: {what} {}",
                domain.origins().join(", ")
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_the_domain_count_only_when_required() {
        let relaxed = RulesStatus::new(false);
        assert_eq!(
            relaxed.readiness(),
            Readiness {
                loaded: false,
                healthy: true
            }
        );
        let strict = RulesStatus::new(true);
        let changes = strict.subscribe();
        assert!(!strict.readiness().healthy);
        let files = Source::Files {
            path: "/rules".into(),
        };
        strict.record(files.clone(), 0);
        assert_eq!(
            strict.readiness(),
            Readiness {
                loaded: true,
                healthy: false
            }
        );
        strict.record(files.clone(), 2);
        assert!(strict.readiness().healthy);
        assert!(changes.has_changed().unwrap_or(false));
        strict.record(files, 0);
        assert!(
            !strict.readiness().healthy,
            "a load without domains is unhealthy again"
        );
        relaxed.record(Source::Files { path: "/r".into() }, 0);
        assert!(relaxed.readiness().healthy);
    }

    #[test]
    fn describes_the_source_and_each_domain_origin() {
        let status = RulesStatus::new(false);
        let rules = Rules::from_yaml("eg-domain", "domain: eg\n").expect("valid");
        assert_eq!(
            status.describe(&rules),
            "# no rules loaded yet\n# domain eg: file eg-domain\n"
        );
        status.record(
            Source::Xds {
                server: "https://127.0.0.1:18001".into(),
                version: "7".into(),
            },
            1,
        );
        assert_eq!(
            status.describe(&rules),
            "# source: xDS server https://127.0.0.1:18001, version \"7\"\n# domain eg: resource eg-domain\n"
        );
    }
}
