//! A real headless Chromium (Debian's `chromium`), for the tests of the `/ui` page: the
//! page loaded, its scripts run, and the document as it then stands.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use crate::process;

/// How long one page load may take, browser start included.
pub const TIMEOUT: Duration = Duration::from_secs(60);

/// How much page time the browser lets pass before it dumps the document: enough for
/// the page's first fetches and their answers. Virtual time: it runs as fast as they come.
const PAGE_TIME_MS: u32 = 3_000;

/// The browser: `$CHROMIUM_BIN`, else `chromium` on PATH. `None`, saying why on stderr,
/// when there is neither (`scripts/install-test-deps.sh` installs it): a test then skips.
pub fn binary() -> Option<PathBuf> {
    let found = match std::env::var_os("CHROMIUM_BIN") {
        Some(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|dir| dir.join("chromium"))
                .find(|candidate| candidate.is_file())
        }),
    };
    if found.is_none() {
        eprintln!(
            "skipped: no CHROMIUM_BIN and no chromium on PATH (scripts/install-test-deps.sh \
             installs Debian's chromium)"
        );
    }
    found
}

/// The document of `url` after its scripts ran, as HTML, loaded by `browser` in a
/// profile of its own.
pub fn dump_dom(browser: &PathBuf, url: &str) -> String {
    let profile = tempfile::tempdir().expect("a profile directory");
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        // Tests may run as root, where Chromium's sandbox refuses to start.
        "--no-sandbox",
        "--disable-gpu",
        "--no-first-run",
        &format!("--user-data-dir={}", profile.path().display()),
        &format!("--virtual-time-budget={PAGE_TIME_MS}"),
        "--dump-dom",
        url,
    ]);
    let out = process::run("chromium", cmd, TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "chromium failed: {out:?}");
    out.stdout
}
