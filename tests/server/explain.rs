//! `POST /explain` and `tollgate explain` on the memory store: the rule that matched (or
//! why none did), the counter's key and state, the decision it would get, and nothing
//! counted by asking.

use serde_json::Value;
use tollgate_testkit::admin::{self, TOKEN, override_body};
use tollgate_testkit::free_port;
use tollgate_testkit::grpc::{Code, code, request};
use tollgate_testkit::http::{self, Method, post_json};
use tollgate_testkit::process;
use tollgate_testkit::tollgate::{self, COMMAND_TIMEOUT, ConfigDir, Listening};

use crate::in_process::InProcess;

const RULES: &str = r#"
domain: ex
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2, name: per_user}
"#;

const ANN_AND_TYPO: &str = r#"{"domain":"ex","descriptors":[{"entries":[{"key":"user","value":"ann"}]},{"entries":[{"key":"usr","value":"ann"}]}]}"#;

async fn explain(server: &Listening, body: &str) -> Value {
    let answer = post_json(server.http_addr(), "/explain", body).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    serde_json::from_str(&answer.body).expect("JSON")
}

#[tokio::test]
async fn explain_shows_the_rule_the_counter_and_the_decision_without_counting() {
    let config = ConfigDir::with_file("rules.yaml", RULES);
    let file = config.file("rules.yaml");
    let server = InProcess::path(config.path()).keep(config).start();
    let mut rls = server.client().await;
    assert_eq!(code(&rls.check("ex", &[("user", "ann")]).await), Code::Ok);
    for _ in 0..3 {
        let got = explain(&server, ANN_AND_TYPO).await;
        assert_eq!(got["overallCode"], "OK", "{got}");
        let ann = &got["descriptors"][0];
        assert_eq!(ann["rule"]["path"], "user", "{got}");
        assert_eq!(ann["rule"]["names"][0], "per_user", "{got}");
        assert_eq!(ann["rule"]["origins"][0], file.to_str().expect("UTF-8"));
        assert!(
            ann["key"]
                .as_str()
                .is_some_and(|k| k.starts_with("ex|user=ann#")),
            "{got}"
        );
        let limit = &ann["local"]["limits"][0];
        assert_eq!(
            (limit["count"].as_u64(), limit["remaining"].as_u64()),
            (Some(1), Some(1))
        );
        assert_eq!(ann["decision"], "OK");
        assert!(
            ann.get("store").is_none(),
            "the memory store has no shared value"
        );
        let typo = &got["descriptors"][1];
        assert_eq!(
            typo["noRule"], "domain ex has no rule for the entries usr",
            "{got}"
        );
        assert_eq!(typo["decision"], "OK (not limited)");
    }
    // Explaining three times counted nothing: one more fits, then the limit denies.
    assert_eq!(code(&rls.check("ex", &[("user", "ann")]).await), Code::Ok);
    assert_eq!(
        code(&rls.check("ex", &[("user", "ann")]).await),
        Code::OverLimit
    );
    let full = explain(&server, ANN_AND_TYPO).await;
    assert_eq!(full["overallCode"], "OVER_LIMIT", "{full}");
    assert_eq!(full["descriptors"][0]["local"]["limits"][0]["count"], 2);

    let nosuch = explain(
        &server,
        r#"{"domain":"nosuch","descriptors":[{"entries":[{"key":"user","value":"ann"}]}]}"#,
    )
    .await;
    assert_eq!(
        nosuch["descriptors"][0]["noRule"],
        "domain nosuch has no rules"
    );
    let bad = post_json(server.http_addr(), "/explain", r#"{"domain":"ex"}"#).await;
    assert_eq!(bad.status, 400, "{bad:?}");
}

#[tokio::test]
async fn tollgate_explain_prints_it_for_a_person() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    for _ in 0..2 {
        rls.check("ex", &[("user", "ann")]).await;
    }
    let mut cmd = tollgate::command();
    cmd.args(["explain", "--http-addr", &server.http_addr().to_string()])
        .args([
            "--domain",
            "ex",
            "--descriptor",
            "user=ann",
            "--descriptor",
            "usr=x",
        ]);
    let out =
        process::run("tollgate explain", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "overall: OVER_LIMIT", "{out:?}");
    assert!(
        lines[1].starts_with("descriptor 0: user=ann: rule ex.user (per_user) from "),
        "{out:?}"
    );
    assert!(lines[2].starts_with("  key: ex|user=ann#"), "{out:?}");
    assert!(
        lines[3].starts_with("  counter: count 2 of 2/minute (window 60.000s), remaining 0"),
        "{out:?}"
    );
    assert_eq!(lines[4], "  decision: OVER_LIMIT", "{out:?}");
    assert_eq!(
        lines[5],
        "descriptor 1: usr=x: no rule matched (domain ex has no rule for the entries usr)"
    );
}

/// Before the first xDS rules arrive calls get `UNKNOWN: no rate limit configuration
/// loaded`, and explaining one says so (it used to say "OK (not limited)").
#[tokio::test]
async fn explain_before_the_first_rules_says_what_a_call_gets() {
    let xds_server = format!("127.0.0.1:{}", free_port());
    let server = InProcess::from_env()
        .env("CONFIG_TYPE", "GRPC_XDS_SOTW")
        .env("FORCE_START_WITHOUT_INITIAL_CONFIG", "true")
        .env("CONFIG_GRPC_XDS_SERVER_URL", &xds_server)
        .start();
    let status = server
        .client()
        .await
        .call(request("ex", &[&[("user", "ann")]]))
        .await
        .expect_err("no rules yet");
    assert_eq!(
        (status.code(), status.message()),
        (tonic::Code::Unknown, "no rate limit configuration loaded")
    );
    let got = explain(&server, ANN_AND_TYPO).await;
    assert_eq!(got["overallCode"], "UNKNOWN", "{got}");
    assert_eq!(got["error"], "no rate limit configuration loaded", "{got}");

    let mut cmd = tollgate::command();
    cmd.args(["explain", "--http-addr", &server.http_addr().to_string()])
        .args(["--domain", "ex", "--descriptor", "user=ann"]);
    let out =
        process::run("tollgate explain", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        out.stdout,
        "overall: UNKNOWN: no rate limit configuration loaded (every call gets this error)\n"
    );
}

/// Explain needs no token, yet it showed who set an override: the admin's address. That
/// is shown only with the admin token now; a wrong token is refused as everywhere else.
#[tokio::test]
async fn explain_shows_who_set_an_override_only_with_the_admin_token() {
    let server = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let set = override_body("ex", ("user", "ann"), "5", "minute");
    let set = admin::overrides(&server, Method::PUT, "/overrides", &set, Some(TOKEN)).await;
    assert_eq!(set.status, 200, "{set:?}");
    let ann = admin::body("ex", "user", "ann");

    let open = explain(&server, &ann).await;
    let overridden = &open["descriptors"][0]["override"];
    assert_eq!(
        overridden["override"]["limit"]["requests_per_unit"], 5,
        "{open}"
    );
    assert_eq!(
        overridden["source"], "hidden: shown with Authorization: Bearer <ADMIN_TOKEN>",
        "{open}"
    );
    assert!(!open.to_string().contains("127.0.0.1"), "{open}");

    let ask = async |token: &str| {
        let bearer = format!("Bearer {token}");
        let headers = [
            ("content-type", "application/json"),
            ("authorization", &bearer),
        ];
        http::send(server.http_addr(), Method::POST, "/explain", &headers, &ann)
            .await
            .expect("POST /explain")
    };
    let with_token = ask(TOKEN).await;
    assert_eq!(with_token.status, 200, "{with_token:?}");
    let shown: Value = serde_json::from_str(&with_token.body).expect("JSON");
    let source = shown["descriptors"][0]["override"]["source"].as_str();
    assert!(
        source.is_some_and(|s| s.starts_with("set over HTTP by 127.0.0.1:")),
        "{shown}"
    );
    let wrong = ask("not-the-token").await;
    assert_eq!(wrong.status, 403, "{wrong:?}");
    assert!(!wrong.body.contains("127.0.0.1"), "{wrong:?}");
}
