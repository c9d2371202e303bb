//! The log lines an operator debugs with: one per decision at debug level, naming the
//! domain, descriptor, rule, counter key, count and who decided; one at info when a
//! counter goes over its limit; and no HTTP/2 frame dumps under `LOG_LEVEL=debug`.

use tollgate_testkit::grpc::{Code, code};
use tollgate_testkit::tollgate::Serve;

const RULES: &str = "domain: logs\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2, name: per_user}\n";

#[tokio::test]
async fn debug_logs_every_decision_and_info_the_counter_going_over() {
    let server = Serve::rules(RULES).env("LOG_LEVEL", "debug").start();
    let mut rls = server.client().await;
    for want in [Code::Ok, Code::Ok, Code::OverLimit, Code::OverLimit] {
        assert_eq!(code(&rls.check("logs", &[("user", "ann")]).await), want);
    }
    // Stopped, so that every line it wrote has been read.
    let stderr = server.stop().stderr;
    let decisions: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("DEBUG") && l.contains(" decision "))
        .collect();
    assert_eq!(decisions.len(), 4, "{stderr}");
    for (line, count, decision) in [
        (decisions[0], "count=1/2", "decision=\"OK\""),
        (decisions[3], "count=2/2", "decision=\"OVER_LIMIT\""),
    ] {
        for part in [
            "domain=\"logs\"",
            "descriptor=user=ann",
            "rule=logs/user name=per_user",
            "key=\"logs|user=ann#",
            count,
            decision,
            "decided_by=\"memory\"",
        ] {
            assert!(line.contains(part), "{part} not in {line}");
        }
    }
    let over: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("INFO") && l.contains("counter went over its limit"))
        .collect();
    assert_eq!(
        over.len(),
        1,
        "one line for the transition, not per denial: {stderr}"
    );
    assert!(
        stderr
            .lines()
            .all(|l| !l.contains("h2::") && !l.contains("hyper")),
        "frame dumps under LOG_LEVEL=debug: {stderr}"
    );
}

#[tokio::test]
async fn a_directive_still_asks_for_a_library_by_module() {
    let server = Serve::rules(RULES)
        .env("LOG_LEVEL", "info,h2=debug")
        .start();
    let mut rls = server.client().await;
    rls.check("logs", &[("user", "ann")]).await;
    let stderr = server.stop().stderr;
    assert!(stderr.contains("h2::"), "{stderr}");
    assert!(!stderr.contains(" decision "), "{stderr}");
}

/// A client's value that holds a line end, an escape or a bidi override cannot forge a
/// log line or paint the operator's terminal: the lines naming it (a decision at debug,
/// the counter going over at info) show those characters escaped.
#[tokio::test]
async fn a_value_cannot_forge_a_log_line_or_paint_the_terminal() {
    const FORGED: &str =
        "ann\n2020-01-01T00:00:00.000000Z  WARN forged: admin logged in\x1b[2J\u{202e}";
    let server = Serve::rules(RULES).env("LOG_LEVEL", "debug").start();
    let mut rls = server.client().await;
    for _ in 0..3 {
        rls.check("logs", &[("user", FORGED)]).await;
    }
    let stderr = server.stop().stderr;
    assert!(
        !stderr.lines().any(|l| l.starts_with("2020-01-01")),
        "{stderr}"
    );
    assert!(
        !stderr.contains(['\x1b', '\u{202e}']),
        "a raw escape or override: {stderr:?}"
    );
    let over = stderr
        .lines()
        .find(|l| l.contains("counter went over its limit"))
        .unwrap_or_else(|| panic!("no line for the counter going over: {stderr}"));
    assert!(
        over.contains(r"user=ann\n2020-01-01T00:00:00.000000Z  WARN forged"),
        "{over}"
    );
}
