//! What the suites share: Tollgate started the way the reference is, from environment
//! variables alone, and where their files go.

use std::path::PathBuf;

use tollgate_testkit::free_port;
use tollgate_testkit::tollgate::{self, Serve};

/// Where the suites keep their files (rules, rewritten scripts and configurations):
/// under `target/`, removed when each test ends.
pub fn work_dir(suite: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("reference")
        .join(suite)
}

/// `tollgate serve` with `env` (a clean environment otherwise) and the reference's
/// listener variables (`HOST`/`PORT`, `GRPC_HOST`/`GRPC_PORT`, `DEBUG_HOST`/`DEBUG_PORT`)
/// on free loopback ports, as the reference is started.
pub fn tollgate_with_env(env: &[(String, String)]) -> Serve {
    let mut serve = Serve::custom(tollgate::command()).args(["serve"]);
    for (name, value) in env {
        serve = serve.env(name, value);
    }
    for (host, port) in [
        ("HOST", "PORT"),
        ("GRPC_HOST", "GRPC_PORT"),
        ("DEBUG_HOST", "DEBUG_PORT"),
    ] {
        serve = serve
            .env(host, "127.0.0.1")
            .env(port, free_port().to_string());
    }
    serve
}

/// `(name, value)` pairs as owned strings.
pub fn vars(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}
