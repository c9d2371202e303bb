//! What a deployment sees at startup: one line naming the store and every listener, a
//! warning for each variable that looks like a setting but is none, and a refusal of a
//! log level or a thread count that is none.

use tollgate_testkit::tollgate::{STARTUP_TIMEOUT, Serve};

const RULES: &str =
    "domain: up\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

#[test]
fn one_line_names_the_store_and_every_listener() {
    let server = Serve::rules(RULES)
        .env("DEBUG_HOST", "127.0.0.1")
        .env("DEBUG_PORT", "0")
        .start();
    let line = server
        .stderr()
        .wait_for(|l| l.contains("serving: "), STARTUP_TIMEOUT)
        .unwrap_or_else(|e| panic!("no startup line ({e:?}): {}", server.stderr().text()));
    let listeners = format!(
        "serving: store memory; listening grpc {}, http {}, debug 127.0.0.1:",
        server.grpc_addr(),
        server.http_addr()
    );
    assert!(line.contains(&listeners), "{line}");
    assert!(line.contains("INFO"), "{line}");
}

/// A misspelt REDIS_URL used to run on the memory store without a word.
#[test]
fn a_misspelt_setting_is_warned_about_naming_the_one_meant() {
    let server = Serve::rules(RULES)
        .env("REDIS_ULR", "redis://127.0.0.1:6379")
        .env("PATH", "/usr/bin")
        .env("HOME", "/root")
        .start();
    let finished = server.stop();
    let warned: Vec<&str> = finished
        .stderr
        .lines()
        .filter(|l| l.contains("is not a setting"))
        .collect();
    assert_eq!(warned.len(), 1, "{}", finished.stderr);
    assert!(warned[0].contains("WARN"), "{}", warned[0]);
    assert!(
        warned[0].contains("REDIS_ULR is not a setting (it is ignored); did you mean REDIS_URL?"),
        "{}",
        warned[0]
    );
    assert!(
        finished.stderr.contains("serving: store memory;"),
        "{}",
        finished.stderr
    );
}

/// `verbose` is no level: taken as a target's name it turned every log line off.
#[test]
fn a_log_level_that_is_none_is_refused_naming_the_levels() {
    let refused = Serve::rules(RULES)
        .env("LOG_LEVEL", "verbose")
        .refused("LOG_LEVEL=verbose");
    assert_ne!(refused.status.code(), Some(0), "{refused:?}");
    assert!(
        refused
            .stderr
            .contains("'verbose' is not a log level: use error, warn, info, debug, trace or off"),
        "{refused:?}"
    );
}

/// The threads serving requests are a setting, checked like any other; tokio's own
/// variable, whose bad value made tokio panic at startup, is warned about and not read.
#[test]
fn worker_threads_are_a_checked_setting_and_tokios_variable_is_not_read() {
    let refused = Serve::rules(RULES)
        .env("WORKER_THREADS", "0")
        .refused("WORKER_THREADS=0");
    assert_ne!(refused.status.code(), Some(0), "{refused:?}");
    assert!(refused.stderr.contains("--worker-threads"), "{refused:?}");
    assert!(!refused.stderr.contains("panicked"), "{refused:?}");

    let server = Serve::rules(RULES)
        .env("TOKIO_WORKER_THREADS", "many")
        .env("WORKER_THREADS", "1")
        .start();
    let finished = server.stop();
    assert!(
        finished.stderr.contains(
            "TOKIO_WORKER_THREADS is not a setting (it is ignored); did you mean WORKER_THREADS?"
        ),
        "{}",
        finished.stderr
    );
    assert!(
        finished.stderr.contains("serving: store memory;"),
        "{}",
        finished.stderr
    );
    assert!(!finished.stderr.contains("panicked"), "{}", finished.stderr);
}
