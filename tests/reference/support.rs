//! What the suites share: Tollgate started the way the reference is, from environment
//! variables alone; whether it knows reference mode; where their files go.

use std::path::PathBuf;

use tollgate_testkit::tollgate::{self, Serve};
use tollgate_testkit::{free_port, process};

/// Where the suites keep their files (rules, rewritten scripts and configurations):
/// under `target/`, removed when each test ends.
pub fn work_dir(suite: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("reference")
        .join(suite)
}

/// `tollgate serve` with `env` (a clean environment otherwise) and the reference's
/// listener variables on loopback: `HOST`/`PORT` and `GRPC_HOST`/`GRPC_PORT` on ports the
/// OS assigns (its readiness line tells them), `DEBUG_HOST`/`DEBUG_PORT` on a free one.
pub fn tollgate_with_env(env: &[(String, String)]) -> Serve {
    let mut serve = Serve::custom(tollgate::command()).args(["serve"]);
    for (name, value) in env {
        serve = serve.env(name, value);
    }
    let debug_port = free_port().to_string();
    for (name, value) in [
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("DEBUG_HOST", "127.0.0.1"),
        ("DEBUG_PORT", &debug_port),
    ] {
        serve = serve.env(name, value);
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

/// Empty if this Tollgate knows `REFERENCE_MODE` (its `serve --help` lists every
/// setting); else a note for failure messages saying that it ignored it.
pub fn reference_mode_note() -> String {
    let mut cmd = tollgate::command();
    cmd.args(["serve", "--help"]);
    let help = process::run("tollgate serve --help", cmd, tollgate::COMMAND_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    if help.stdout.contains("REFERENCE_MODE") {
        String::new()
    } else {
        "\nNOTE: this Tollgate has no REFERENCE_MODE setting (`tollgate serve --help` does \
         not list it): it ignored REFERENCE_MODE=true and answered and counted with its \
         defaults (sliding windows, its own keys and counting). What fails here is what \
         reference mode is to fix.\n"
            .to_owned()
    }
}
