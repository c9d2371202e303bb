//! Runtime overrides on the memory store: `PUT`, `GET` and `DELETE /overrides` behind the
//! admin token, every bad input refused naming the field, answers showing the override,
//! the gauge, the change logged once, and `OVERRIDES_FILE` across a restart.

use tollgate_testkit::admin::{self, TOKEN, override_body};
use tollgate_testkit::grpc::{Code, code};
use tollgate_testkit::http::{self, Method};
use tollgate_testkit::overrides::assert_an_expired_override_frees_its_place;
use tollgate_testkit::pki::Pki;
use tollgate_testkit::process;
use tollgate_testkit::tollgate::{self, COMMAND_TIMEOUT, Serve};

use crate::in_process::InProcess;

const RULES: &str = "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

fn acme(requests_per_unit: &str, unit: &str) -> String {
    override_body("api", ("tenant", "acme"), requests_per_unit, unit)
}

const ACME: &str = r#"{"domain":"api","entries":[{"key":"tenant","value":"acme"}]}"#;

#[tokio::test]
async fn the_api_is_refused_without_the_right_token_or_with_none_set() {
    let off = InProcess::rules(RULES).start();
    let refused = admin::overrides(
        &off,
        Method::PUT,
        "/overrides",
        &acme("5", "minute"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(refused.status, 403, "{refused:?}");
    assert!(
        refused
            .body
            .contains("overrides are off: the server has no ADMIN_TOKEN"),
        "{refused:?}"
    );

    let on = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    for method in [Method::PUT, Method::GET, Method::DELETE] {
        let missing = admin::overrides(
            &on,
            method.clone(),
            "/overrides",
            &acme("5", "minute"),
            None,
        )
        .await;
        assert_eq!(missing.status, 401, "{method}: {missing:?}");
        assert_eq!(missing.header("www-authenticate"), Some("Bearer"));
        let wrong = admin::overrides(
            &on,
            method.clone(),
            "/overrides",
            ACME,
            Some("not-the-token"),
        )
        .await;
        assert_eq!(wrong.status, 403, "{method}: {wrong:?}");
    }
    let mut rls = on.client().await;
    for want in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(
            code(&rls.check("api", &[("tenant", "acme")]).await),
            want,
            "no override was set"
        );
    }
}

#[tokio::test]
async fn an_override_limits_its_tenant_shows_in_answers_and_delete_restores_the_rule() {
    let server = Serve::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let set = admin::overrides(
        &server,
        Method::PUT,
        "/overrides",
        &acme("5", "MINUTE"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(set.status, 200, "{set:?}");
    assert!(set.body.contains(r#""replaced":null"#), "{set:?}");
    let mut rls = server.client().await;
    for _ in 0..5 {
        let status = rls.check("api", &[("tenant", "acme")]).await;
        assert_eq!(code(&status), Code::Ok);
        assert_eq!(
            status.current_limit.map(|l| l.requests_per_unit),
            Some(5),
            "the override's limit"
        );
    }
    assert_eq!(
        code(&rls.check("api", &[("tenant", "acme")]).await),
        Code::OverLimit
    );
    for want in [Code::Ok, Code::Ok, Code::OverLimit] {
        assert_eq!(
            code(&rls.check("api", &[("tenant", "other")]).await),
            want,
            "the rule serves the rest"
        );
    }

    let listed = admin::overrides(
        &server,
        Method::GET,
        "/overrides?domain=api",
        "",
        Some(TOKEN),
    )
    .await;
    assert_eq!(listed.status, 200, "{listed:?}");
    let listed: serde_json::Value = serde_json::from_str(&listed.body).expect("JSON");
    assert_eq!(
        listed["overrides"][0]["override"]["limit"]["requests_per_unit"],
        5
    );
    assert_eq!(listed["keptIn"], "this process");
    let other = admin::overrides(
        &server,
        Method::GET,
        "/overrides?domain=web",
        "",
        Some(TOKEN),
    )
    .await;
    assert!(other.body.contains(r#""overrides":[]"#), "{other:?}");

    let explained = admin::explain(&server, &admin::body("api", "tenant", "acme")).await;
    let by = &explained["descriptors"][0]["override"];
    assert_eq!(
        by["override"]["limit"]["requests_per_unit"], 5,
        "{explained}"
    );
    // Who set it is shown only with the token (explain.rs).
    assert!(
        by["source"]
            .as_str()
            .is_some_and(|s| s.starts_with("hidden")),
        "{explained}"
    );

    let metrics = http::get(server.http_addr(), "/metrics").await;
    assert!(
        metrics.body.contains("tollgate_overrides 1\n"),
        "{}",
        metrics.body
    );

    let deleted = admin::overrides(&server, Method::DELETE, "/overrides", ACME, Some(TOKEN)).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    let again = admin::overrides(&server, Method::DELETE, "/overrides", ACME, Some(TOKEN)).await;
    assert_eq!(again.status, 404, "{again:?}");
    let status = rls.check("api", &[("tenant", "acme")]).await;
    assert_eq!(
        code(&status),
        Code::OverLimit,
        "six counted, over the rule's 2"
    );
    assert_eq!(status.current_limit.map(|l| l.requests_per_unit), Some(2));
    let metrics = http::get(server.http_addr(), "/metrics").await;
    assert!(
        metrics.body.contains("tollgate_overrides 0\n"),
        "{}",
        metrics.body
    );

    let stderr = server.stop().stderr;
    let set_lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("override set"))
        .collect();
    assert_eq!(set_lines.len(), 1, "{stderr}");
    for part in [
        "INFO",
        "domain=\"api\"",
        "tenant=acme",
        "5 per minute",
        "replaced=\"none\"",
    ] {
        assert!(
            set_lines[0].contains(part),
            "{part} not in {}",
            set_lines[0]
        );
    }
    assert_eq!(stderr.matches("override deleted").count(), 1, "{stderr}");
}

#[tokio::test]
async fn every_bad_input_is_a_400_naming_the_field_and_nothing_is_applied() {
    let server = InProcess::rules(RULES)
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_MAX", "1")
        .start();
    let region = override_body("api", ("region", "eu"), "5", "minute");
    let expired = acme("5", "minute").replace(r#""limit""#, r#""expires_at":1,"limit""#);
    for (body, says) in [
        (
            acme("5", "fortnight"),
            "limit.unit: invalid rate limit unit 'fortnight'",
        ),
        (
            region,
            "entries: no rule of domain 'api' matches the descriptor region=eu",
        ),
        (
            acme("-5", "minute"),
            "limit.requests_per_unit: must not be negative",
        ),
        (
            acme("1e30", "minute"),
            "limit.requests_per_unit: must be a whole number up to 4294967295",
        ),
        (
            acme("5.5", "minute"),
            "limit.requests_per_unit: must be a whole number",
        ),
        (
            override_body("web", ("tenant", "acme"), "5", "minute"),
            "domain: no rules for domain 'web'",
        ),
        (
            acme("5", "minute").replace("\"unit\"", "\"units\""),
            "unknown field `units`",
        ),
        (expired, "expires_at: 1 is not in the future"),
        ("{".to_owned(), "invalid override"),
    ] {
        let refused =
            admin::overrides(&server, Method::PUT, "/overrides", &body, Some(TOKEN)).await;
        assert_eq!(refused.status, 400, "{body}: {refused:?}");
        assert!(
            refused.body.contains(says),
            "{body}: {says} not in {refused:?}"
        );
    }
    let first = admin::overrides(
        &server,
        Method::PUT,
        "/overrides",
        &acme("5", "minute"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(first.status, 200, "{first:?}");
    let too_many = override_body("api", ("tenant", "zeta"), "5", "minute");
    let refused =
        admin::overrides(&server, Method::PUT, "/overrides", &too_many, Some(TOKEN)).await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(
        refused
            .body
            .contains("overrides: too many: at most 1 (OVERRIDES_MAX)"),
        "{refused:?}"
    );
    let listed = admin::overrides(&server, Method::GET, "/overrides", "", Some(TOKEN)).await;
    let listed: serde_json::Value = serde_json::from_str(&listed.body).expect("JSON");
    let all = listed["overrides"].as_array().expect("a list");
    assert_eq!(all.len(), 1, "only the valid one: {listed}");
    let bad_query = admin::overrides(
        &server,
        Method::GET,
        "/overrides?domian=api",
        "",
        Some(TOKEN),
    )
    .await;
    assert_eq!(bad_query.status, 400, "{bad_query:?}");
    assert!(
        bad_query.body.contains("domian: unknown parameter"),
        "{bad_query:?}"
    );
}

#[tokio::test]
async fn overrides_in_a_file_survive_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("overrides.json");
    let file = file.to_str().expect("a UTF-8 path");
    let first = Serve::rules(RULES)
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_FILE", file)
        .start();
    let set = admin::overrides(
        &first,
        Method::PUT,
        "/overrides",
        &acme("5", "minute"),
        Some(TOKEN),
    )
    .await;
    assert_eq!(set.status, 200, "{set:?}");
    drop(first.stop());
    let second = Serve::rules(RULES)
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_FILE", file)
        .start();
    let mut rls = second.client().await;
    let status = rls.check("api", &[("tenant", "acme")]).await;
    assert_eq!(
        status.current_limit.map(|l| l.requests_per_unit),
        Some(5),
        "read back at start"
    );
    let listed = admin::overrides(&second, Method::GET, "/overrides", "", Some(TOKEN)).await;
    assert!(listed.body.contains("OVERRIDES_FILE"), "{listed:?}");
}

#[tokio::test]
async fn an_expired_override_is_purged_and_frees_its_place() {
    let server = InProcess::rules(RULES)
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_MAX", "1")
        .start();
    assert_an_expired_override_frees_its_place(&server, "api", "tenant").await;
}

#[test]
fn a_file_past_the_maximum_or_with_a_descriptor_twice_is_refused_at_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("overrides.json");
    let list = |values: &[&str]| {
        let specs: Vec<String> = values
            .iter()
            .map(|v| acme("5", "minute").replace("acme", v))
            .collect();
        format!("[{}]", specs.join(","))
    };
    std::fs::write(&file, list(&["a", "b", "c"])).expect("write the file");
    let refused = Serve::rules(RULES)
        .env("OVERRIDES_FILE", &file)
        .env("OVERRIDES_MAX", "2")
        .refused("three overrides, at most two");
    assert!(
        refused.stderr.contains("overrides.json")
            && refused
                .stderr
                .contains("more than 2 overrides (OVERRIDES_MAX)"),
        "{refused:?}"
    );
    std::fs::write(&file, list(&["a", "b", "a"])).expect("write the file");
    let refused = Serve::rules(RULES)
        .env("OVERRIDES_FILE", &file)
        .refused("a descriptor twice");
    assert!(
        refused.stderr.contains("overrides.json")
            && refused.stderr.contains("tenant=a is overridden twice"),
        "{refused:?}"
    );
}

#[tokio::test]
async fn the_cli_lists_pages_and_every_part_of_a_limit() {
    let server = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let body = acme("5", "second").replace(
        r#""unit":"second""#,
        r#""unit":"second","unit_multiplier":3600,"algorithm":"fixed_window","name":"gold""#,
    );
    let set = admin::overrides(&server, Method::PUT, "/overrides", &body, Some(TOKEN)).await;
    assert_eq!(set.status, 200, "{set:?}");
    for i in 0..2_500 {
        let body = override_body("api", ("tenant", &format!("t{i:04}")), "1", "hour");
        let set = admin::overrides(&server, Method::PUT, "/overrides", &body, Some(TOKEN)).await;
        assert_eq!(set.status, 200, "{set:?}");
    }
    let page = admin::overrides(&server, Method::GET, "/overrides?limit=2", "", Some(TOKEN)).await;
    let page: serde_json::Value = serde_json::from_str(&page.body).expect("JSON");
    assert_eq!(
        page["overrides"].as_array().map(Vec::len),
        Some(2),
        "{page}"
    );
    let next = page["next"].as_str().expect("a cursor to the next page");
    let path = format!(
        "/overrides?limit=2&cursor={}",
        form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
    );
    let second = admin::overrides(&server, Method::GET, &path, "", Some(TOKEN)).await;
    assert!(second.body.contains(r#""value":"t0001""#), "{second:?}");
    let addr = server.http_addr().to_string();
    let mut cmd = tollgate::command();
    cmd.args(["override", "--http-addr", &addr, "list"])
        .env("ADMIN_TOKEN", TOKEN);
    let listed = process::run("tollgate override list", cmd, COMMAND_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(listed.status.success(), "{listed:?}");
    let lines: Vec<&str> = listed.stdout.lines().collect();
    assert_eq!(
        lines[0], "2501 override(s), kept in this process",
        "{}",
        lines[0]
    );
    assert_eq!(
        lines[1],
        "override api tenant=acme: 5 per 3600 second (fixed_window) name=gold"
    );
    assert_eq!(lines.len(), 2_502, "every page followed");
    assert_eq!(lines[2_501], "override api tenant=t2499: 1 per hour");
}

#[tokio::test]
async fn the_cli_sets_lists_and_deletes_an_override() {
    let server = Serve::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let addr = server.http_addr().to_string();
    let run = |args: &[&str]| {
        let mut cmd = tollgate::command();
        cmd.args(["override", "--http-addr", &addr])
            .args(args)
            .env("ADMIN_TOKEN", TOKEN);
        process::run("tollgate override", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
    };
    let acme = ["--domain", "api", "--descriptor", "tenant=acme"];
    let set = run(&[
        &["set"][..],
        &acme,
        &["--requests-per-unit", "5", "--unit", "minute"],
    ]
    .concat());
    assert!(set.status.success(), "{set:?}");
    assert_eq!(set.stdout, "set api tenant=acme: 5 per minute\n", "{set:?}");
    let mut rls = server.client().await;
    let status = rls.check("api", &[("tenant", "acme")]).await;
    assert_eq!(status.current_limit.map(|l| l.requests_per_unit), Some(5));
    let listed = run(&["list", "--domain", "api"]);
    assert!(listed.status.success(), "{listed:?}");
    assert_eq!(
        listed.stdout,
        "1 override(s), kept in this process\noverride api tenant=acme: 5 per minute\n"
    );
    let bad = run(&[
        &["set"][..],
        &acme,
        &["--requests-per-unit", "5", "--unit", "fortnight"],
    ]
    .concat());
    assert!(!bad.status.success(), "{bad:?}");
    assert!(
        bad.stderr
            .contains("answered 400: limit.unit: invalid rate limit unit 'fortnight'"),
        "{bad:?}"
    );
    let deleted = run(&[&["delete"][..], &acme].concat());
    assert!(deleted.status.success(), "{deleted:?}");
    assert_eq!(deleted.stdout, "deleted api tenant=acme: 5 per minute\n");
    let status = rls.check("api", &[("tenant", "acme")]).await;
    assert_eq!(
        status.current_limit.map(|l| l.requests_per_unit),
        Some(2),
        "the rule again"
    );
}

/// The HTTP port served over TLS: `tollgate override` reaches it with the `--tls` options
/// (trusting the test CA), and without them gets no answer.
#[tokio::test]
async fn the_cli_reaches_an_http_port_served_over_tls() {
    let pki = Pki::new();
    let issued = pki.issue("server", "DNS:localhost,IP:127.0.0.1");
    let server = Serve::rules(RULES)
        .env("ADMIN_TOKEN", TOKEN)
        .env("GRPC_SERVER_USE_TLS", "true")
        .env("GRPC_SERVER_TLS_CERT", &issued.cert)
        .env("GRPC_SERVER_TLS_KEY", &issued.key)
        .env("HTTP_SERVER_USE_TLS", "true")
        .start();
    let addr = server.http_addr().to_string();
    let ca = pki.ca().display().to_string();
    let run = |tls: &[&str], args: &[&str]| {
        let mut cmd = tollgate::command();
        cmd.args(["override", "--http-addr", &addr])
            .args(tls)
            .args(args)
            .env("ADMIN_TOKEN", TOKEN);
        process::run("tollgate override", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
    };
    let set = run(
        &["--tls-ca", &ca],
        &[
            "set",
            "--domain",
            "api",
            "--descriptor",
            "tenant=acme",
            "--requests-per-unit",
            "5",
            "--unit",
            "minute",
        ],
    );
    assert!(set.status.success(), "{set:?}");
    assert_eq!(set.stdout, "set api tenant=acme: 5 per minute\n", "{set:?}");
    let listed = run(&["--tls-ca", &ca], &["list"]);
    assert!(listed.status.success(), "{listed:?}");
    assert!(
        listed
            .stdout
            .contains("override api tenant=acme: 5 per minute"),
        "{listed:?}"
    );
    let plain = run(&[], &["list"]);
    assert!(
        !plain.status.success(),
        "plain HTTP to a TLS port: {plain:?}"
    );
    let stranger = Pki::new();
    let untrusted = run(
        &["--tls-ca", &stranger.ca().display().to_string()],
        &["list"],
    );
    assert!(
        !untrusted.status.success(),
        "an untrusted certificate: {untrusted:?}"
    );
    assert!(untrusted.stderr.contains("no TLS with"), "{untrusted:?}");
}
