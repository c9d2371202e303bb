//! Helm, for the chart's tests: the binary, `helm lint`, and `helm template` with the
//! rendered manifests as JSON values to look into.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use serde_json::Value;
use tempfile::TempDir;

use crate::process::{self, Finished};
use crate::workspace;

/// The Helm release `scripts/install-test-deps.sh` builds.
pub const PINNED_VERSION: &str = "v3.22.0";
/// How long one helm command may take.
pub const TIMEOUT: Duration = Duration::from_secs(60);
/// Where `scripts/install-test-deps.sh` builds helm, relative to the workspace.
const INSTALLED: &str = "target/test-deps/helm/helm";

/// The repository's chart.
pub fn chart() -> PathBuf {
    workspace().join("deploy/helm/tollgate")
}

/// The helm binary: `$HELM_BIN`, else the one `scripts/install-test-deps.sh` built, else
/// `helm` on PATH. `None`, saying why on stderr, when that script skipped it (it sets
/// `HELM_BIN` empty where there is no Go to build helm with); a test then skips. Panics
/// with instructions when nothing was installed.
pub fn binary() -> Option<&'static Path> {
    static FOUND: OnceLock<Option<PathBuf>> = OnceLock::new();
    let found = FOUND.get_or_init(|| match std::env::var_os("HELM_BIN") {
        Some(path) if path.is_empty() => None,
        Some(path) => {
            let path = PathBuf::from(path);
            assert!(
                path.is_file(),
                "HELM_BIN={} is not a file; unset it or point it at a helm binary",
                path.display()
            );
            Some(path)
        }
        None => {
            let installed = workspace().join(INSTALLED);
            let on_path = std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|dir| dir.join("helm"))
                    .find(|candidate| candidate.is_file())
            });
            let path = Some(installed)
                .filter(|p| p.is_file())
                .or(on_path)
                .unwrap_or_else(|| {
                    panic!(
                        "no helm found: the chart tests need helm {PINNED_VERSION}. Run \
                         scripts/install-test-deps.sh (it builds it with `go install` into \
                         {INSTALLED}), or set HELM_BIN"
                    )
                });
            Some(path)
        }
    });
    if found.is_none() {
        eprintln!(
            "skipped: HELM_BIN is empty, as scripts/install-test-deps.sh leaves it where there \
             is no Go to build helm with"
        );
    }
    found.as_deref()
}

/// A values file for one rendering, removed on drop.
pub struct Values {
    dir: TempDir,
}

impl Values {
    /// `yaml` as a values file.
    pub fn new(yaml: &str) -> Self {
        let dir = TempDir::new().expect("create a directory for values.yaml");
        std::fs::write(dir.path().join("values.yaml"), yaml).expect("write values.yaml");
        Self { dir }
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("values.yaml")
    }
}

fn run(helm: &Path, args: &[&str], values: Option<&Values>) -> Finished {
    let mut cmd = Command::new(helm);
    cmd.args(args).arg(chart());
    if let Some(values) = values {
        cmd.arg("--values").arg(values.path());
    }
    let what = format!("helm {}", args.join(" "));
    process::run(&what, cmd, TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

/// `helm lint --strict` of the chart with the chart's values, or with `values` over them.
pub fn lint(helm: &Path, values: Option<&Values>) -> Finished {
    run(helm, &["lint", "--strict"], values)
}

/// `helm template` of the chart as release `release`: the manifests, or helm's complaint.
pub fn template(helm: &Path, release: &str, values: Option<&Values>) -> Result<Manifests, String> {
    let out = run(helm, &["template", release], values);
    if !out.status.success() {
        return Err(out.stderr);
    }
    let documents: Vec<Value> = serde_saphyr::from_multiple(&out.stdout)
        .unwrap_or_else(|e| panic!("helm template printed YAML that does not parse: {e}"));
    Ok(Manifests(
        documents.into_iter().filter(|d| !d.is_null()).collect(),
    ))
}

/// The objects `helm template` rendered.
#[derive(Debug, Clone)]
pub struct Manifests(pub Vec<Value>);

impl Manifests {
    /// Every object of `kind`.
    pub fn all(&self, kind: &str) -> Vec<&Value> {
        self.0.iter().filter(|o| o["kind"] == kind).collect()
    }

    /// The one object of `kind`; panics if there is none or several.
    pub fn one(&self, kind: &str) -> &Value {
        match self.all(kind).as_slice() {
            [one] => one,
            other => panic!("one {kind} expected, found {}: {self:#?}", other.len()),
        }
    }

    /// The kinds rendered, sorted.
    pub fn kinds(&self) -> Vec<&str> {
        let mut kinds: Vec<&str> = self.0.iter().filter_map(|o| o["kind"].as_str()).collect();
        kinds.sort_unstable();
        kinds
    }

    /// The Deployment's one container.
    pub fn container(&self) -> &Value {
        let containers = &self.one("Deployment")["spec"]["template"]["spec"]["containers"];
        match containers.as_array().map(Vec::as_slice) {
            Some([one]) => one,
            _ => panic!("one container expected: {containers:#}"),
        }
    }

    /// The container's environment, with values from the rendered Secrets resolved.
    pub fn env(&self) -> Vec<(String, String)> {
        let env = self.container()["env"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        env.iter()
            .map(|var| {
                let name = var["name"].as_str().expect("an env name").to_owned();
                let value = match (&var["value"], &var["valueFrom"]["secretKeyRef"]) {
                    (Value::String(value), _) => value.clone(),
                    (_, secret @ Value::Object(_)) => self.secret_value(secret),
                    _ => panic!("env {name} has neither a value nor a rendered Secret: {var:#}"),
                };
                (name, value)
            })
            .collect()
    }

    fn secret_value(&self, reference: &Value) -> String {
        let secret = self
            .all("Secret")
            .into_iter()
            .find(|s| s["metadata"]["name"] == reference["name"])
            .unwrap_or_else(|| panic!("no rendered Secret for {reference:#}"));
        let key = reference["key"].as_str().expect("a Secret key");
        secret["stringData"][key]
            .as_str()
            .unwrap_or_else(|| panic!("Secret has no stringData.{key}: {secret:#}"))
            .to_owned()
    }

    /// The container port named `name`.
    pub fn container_port(&self, name: &str) -> u16 {
        let ports = self.container()["ports"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        ports
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["containerPort"].as_u64())
            .and_then(|p| u16::try_from(p).ok())
            .unwrap_or_else(|| panic!("no container port named {name}: {ports:#?}"))
    }
}
