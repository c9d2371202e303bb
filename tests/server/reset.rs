//! `DELETE /counters` and `tollgate reset` on the memory store: refused without the token,
//! with a wrong one, or with resets off; with it, the counter starts again empty, and the
//! reset is logged with what and from where.

use std::time::{Duration, Instant};

use tollgate_testkit::admin::{self, TOKEN};
use tollgate_testkit::grpc::{Code, code};
use tollgate_testkit::process;
use tollgate_testkit::tollgate::{self, COMMAND_TIMEOUT, Serve};

use crate::in_process::InProcess;

const RULES: &str =
    "domain: rs\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, requests_per_unit: 2}\n";

#[tokio::test]
async fn resets_are_refused_without_the_right_token_or_with_none_set() {
    let ann = admin::body("rs", "user", "ann");
    let off = InProcess::rules(RULES).start();
    let refused = admin::reset(&off, &ann, Some(TOKEN)).await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(refused.body.contains("no ADMIN_TOKEN"), "{refused:?}");

    let on = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let mut rls = on.client().await;
    for want in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(code(&rls.check("rs", &[("user", "ann")]).await), want);
    }
    let missing = admin::reset(&on, &ann, None).await;
    assert_eq!(missing.status, 401, "{missing:?}");
    assert_eq!(missing.header("www-authenticate"), Some("Bearer"));
    let wrong = admin::reset(&on, &ann, Some("test-admin-token-0124")).await;
    assert_eq!(wrong.status, 403, "{wrong:?}");
    // Refused resets changed nothing.
    assert_eq!(
        code(&rls.check("rs", &[("user", "ann")]).await),
        Code::OverLimit
    );
}

#[tokio::test]
async fn a_memory_counter_reset_admits_the_next_request_and_is_logged() {
    let server = Serve::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let mut rls = server.client().await;
    for want in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(code(&rls.check("rs", &[("user", "ann")]).await), want);
    }
    let answer = admin::reset(&server, &admin::body("rs", "user", "ann"), Some(TOKEN)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(
        answer.body.contains(r#""reset":["rs|user=ann#"#),
        "{answer:?}"
    );
    for want in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(code(&rls.check("rs", &[("user", "ann")]).await), want);
    }
    let mut cmd = tollgate::command();
    cmd.args(["reset", "--http-addr", &server.http_addr().to_string()])
        .args(["--domain", "rs", "--descriptor", "user=ann"])
        .env("ADMIN_TOKEN", TOKEN);
    let out =
        process::run("tollgate reset", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.starts_with("reset rs|user=ann#"), "{out:?}");
    assert_eq!(code(&rls.check("rs", &[("user", "ann")]).await), Code::Ok);
    // Stopped, so that every line it wrote has been read.
    let stderr = server.stop().stderr;
    let logged: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("counters reset"))
        .collect();
    assert_eq!(logged.len(), 2, "{stderr}");
    for part in [
        "INFO",
        "peer=127.0.0.1:",
        "domain=rs",
        "user=ann",
        "rs|user=ann#",
    ] {
        assert!(logged[0].contains(part), "{part} not in {}", logged[0]);
    }
}

/// A client sending refused resets by the thousand gets one log line per period, not
/// one per request (6,000 refusals wrote 6,006 WARN lines).
#[tokio::test]
async fn refused_resets_are_logged_at_most_once_a_period() {
    const REFUSALS: u32 = 300;
    /// The server's period for such lines.
    const PERIOD: Duration = Duration::from_secs(10);
    let server = Serve::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let ann = admin::body("rs", "user", "ann");
    let started = Instant::now();
    for _ in 0..REFUSALS {
        let wrong = admin::reset(&server, &ann, Some("not-the-token")).await;
        assert_eq!(wrong.status, 403, "{wrong:?}");
    }
    let took = started.elapsed();
    let stderr = server.stop().stderr;
    let logged: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("admin call refused"))
        .collect();
    let periods = u32::try_from(took.as_secs() / PERIOD.as_secs()).unwrap_or(u32::MAX);
    assert!(
        !logged.is_empty() && logged.len() <= periods as usize + 1,
        "{} lines for {REFUSALS} refusals in {took:?}:\n{stderr}",
        logged.len()
    );
    assert!(
        logged[0].contains("wrong admin token (0 more refused since the last such line)"),
        "{}",
        logged[0]
    );
}
