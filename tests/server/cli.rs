//! Command line and environment: `check-config`, listener and config-path settings
//! through flags and environment variables, directory loading, and the memory store's
//! counter cap.

use std::path::Path;

use tollgate_testkit::grpc::{Code, Unit, assert_limited, limit};

use crate::grpc_api::assert_counters_accounted;
use tollgate_testkit::tollgate::{
    COMMAND_TIMEOUT, ConfigDir, Serve, Server, check_config, command,
};

const RULE: &str = "domain: cli\ndescriptors:\n  - key: k\n    rate_limit: {unit: minute, requests_per_unit: 2, name: cli_rule}\n";

/// Asserts the running server has `RULE` loaded (and that it counts).
async fn assert_rule_loaded(server: &Server) {
    let mut rls = server.client().await;
    let rule = limit(2, Unit::Minute, "cli_rule");
    assert_limited(&rls.check("cli", &[("k", "v")]).await, Code::Ok, &rule, 1);
    assert_limited(&rls.check("cli", &[("k", "v")]).await, Code::Ok, &rule, 0);
    assert_limited(
        &rls.check("cli", &[("k", "v")]).await,
        Code::OverLimit,
        &rule,
        0,
    );
}

/// `tollgate serve` with no flags at all: listeners from GRPC_ADDR/HTTP_ADDR, the config
/// path from the RUNTIME_* variables.
fn serve_from_runtime_env(root: &Path, subdirectory: &str, app_directory: Option<&str>) -> Server {
    let mut cmd = command();
    cmd.arg("serve")
        .env("GRPC_ADDR", "127.0.0.1:0")
        .env("HTTP_ADDR", "127.0.0.1:0")
        .env("RUNTIME_ROOT", root)
        .env("RUNTIME_SUBDIRECTORY", subdirectory);
    if let Some(app) = app_directory {
        cmd.env("RUNTIME_APPDIRECTORY", app);
    }
    Serve::custom(cmd).start()
}

/// `tollgate serve --config RULES` with its listeners set by environment variables.
fn serve_with_listener_env(vars: &[(&str, &str)]) -> Server {
    let dir = ConfigDir::with_file("rules.yaml", RULE);
    let mut cmd = command();
    cmd.arg("serve").arg("--config").arg(dir.file("rules.yaml"));
    for (key, value) in vars {
        cmd.env(key, value);
    }
    Serve::custom(cmd).keep(dir).start()
}

#[test]
fn check_config_accepts_a_valid_file() {
    let dir = ConfigDir::with_file("rules.yaml", RULE);
    let finished = check_config(&dir.file("rules.yaml"));
    assert!(finished.status.success(), "{finished:?}");
    assert_eq!(finished.stdout, "ok\n");
}

#[test]
fn check_config_accepts_a_valid_directory() {
    let dir = ConfigDir::new();
    dir.write("a.yaml", RULE);
    dir.write(
        "b.yml",
        "domain: other\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n",
    );
    let finished = check_config(dir.path());
    assert!(finished.status.success(), "{finished:?}");
    assert_eq!(finished.stdout, "ok\n");
}

#[tokio::test]
async fn directory_loads_yaml_and_yml_and_ignores_other_files() {
    let dir = ConfigDir::new();
    dir.write("rules.yml", RULE);
    dir.write(
        "more.yaml",
        "domain: more\ndescriptors:\n  - key: m\n    rate_limit: {unit: hour, requests_per_unit: 9}\n",
    );
    let garbage = "domain: [this is not valid\n";
    dir.write(".hidden.yaml", garbage);
    dir.write("notes.txt", garbage);

    let finished = check_config(dir.path());
    assert!(finished.status.success(), "{finished:?}");

    let server = Serve::path(dir.path()).keep(dir).start();
    assert_rule_loaded(&server).await;
    let mut rls = server.client().await;
    let status = rls.check("more", &[("m", "x")]).await;
    assert_limited(&status, Code::Ok, &limit(9, Unit::Hour, ""), 8);
}

#[tokio::test]
async fn readiness_line_is_the_only_stdout_output() {
    let server = Serve::rules(RULE).start();
    assert_eq!(
        server.other_stdout(),
        Vec::<String>::new(),
        "stdout before readiness"
    );
    assert_eq!(server.get("/healthcheck").await.status, 200);
    assert_rule_loaded(&server).await;
    let finished = server.stop();
    let lines: Vec<&str> = finished.stdout.lines().collect();
    assert_eq!(lines.len(), 1, "only the readiness line: {lines:?}");
    assert!(
        lines[0].starts_with("tollgate listening grpc="),
        "{lines:?}"
    );
}

#[tokio::test]
async fn listen_addresses_from_grpc_addr_and_http_addr() {
    let server =
        serve_with_listener_env(&[("GRPC_ADDR", "127.0.0.1:0"), ("HTTP_ADDR", "127.0.0.1:0")]);
    assert!(server.addrs.on_ipv4_loopback(), "{:?}", server.addrs);
    assert_eq!(server.get("/healthcheck").await.status, 200);
    assert_rule_loaded(&server).await;
}

#[tokio::test]
async fn listen_addresses_from_reference_host_and_port_variables() {
    let server = serve_with_listener_env(&[
        ("GRPC_HOST", "127.0.0.1"),
        ("GRPC_PORT", "0"),
        ("HOST", "127.0.0.1"),
        ("PORT", "0"),
    ]);
    assert!(server.addrs.on_ipv4_loopback(), "{:?}", server.addrs);
    assert_eq!(server.get("/healthcheck").await.status, 200);
    assert_rule_loaded(&server).await;
}

#[tokio::test]
async fn config_path_from_runtime_variables_defaults_app_directory_to_config() {
    let dir = ConfigDir::new();
    dir.write("current/config/rules.yaml", RULE);
    let server = serve_from_runtime_env(dir.path(), "current", None);
    assert_rule_loaded(&server).await;
}

#[tokio::test]
async fn config_path_from_runtime_variables_with_app_directory() {
    let dir = ConfigDir::new();
    dir.write("srv/ratelimit/rules.yaml", RULE);
    // A decoy where the default app directory would point.
    dir.write(
        "srv/config/rules.yaml",
        "domain: cli\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n",
    );
    let server = serve_from_runtime_env(dir.path(), "srv", Some("ratelimit"));
    assert_rule_loaded(&server).await;
}

/// The reference's image contract: Envoy Gateway and most manifests run `/bin/ratelimit`
/// with no arguments and configure it through the environment alone. The image links
/// that name to `tollgate`; a plain invocation with no arguments serves.
#[tokio::test]
async fn the_binary_run_as_ratelimit_with_no_arguments_serves_from_the_environment() {
    let dir = ConfigDir::new();
    dir.write("data/ratelimit/config/rules.yaml", RULE);
    let link = dir.path().join("ratelimit");
    let binary = tollgate_testkit::tollgate::binary().expect("the tollgate binary");
    std::os::unix::fs::symlink(&binary, &link).expect("link the binary as ratelimit");
    let mut cmd = tollgate_testkit::tollgate::command_at(&link);
    cmd.env("GRPC_ADDR", "127.0.0.1:0")
        .env("HTTP_ADDR", "127.0.0.1:0")
        .env("RUNTIME_ROOT", dir.path().join("data"))
        .env("RUNTIME_SUBDIRECTORY", "ratelimit")
        .env("USE_STATSD", "false");
    let server = Serve::custom(cmd).keep(dir).start();
    assert_rule_loaded(&server).await;
}

/// `--precision 1` and a small `--max-counters` keep burst limits exact; counters past
/// the cap are evicted (and counted), not refused.
#[tokio::test]
async fn precision_and_max_counters_flags_keep_exact_burst_limits() {
    let server = Serve::rules(RULE)
        .args(["--precision", "1", "--max-counters", "10"])
        .start();
    assert_rule_loaded(&server).await;
    let mut rls = server.client().await;
    let rule = limit(2, Unit::Minute, "cli_rule");
    for i in 0..30 {
        let status = rls.check("cli", &[("k", &format!("other-{i}"))]).await;
        assert_limited(&status, Code::Ok, &rule, 1);
    }
    assert_counters_accounted(&server, 10, 31).await;
}

/// Settings with which no server could answer (every call refused or left waiting) stop
/// startup with a message naming the setting and its range, instead of serving.
#[test]
fn settings_that_cannot_work_stop_startup() {
    let cases: [(&[&str], &str); 5] = [
        (&["--grpc-max-message-bytes", "0"], "1024..=67108864"),
        (
            &["--grpc-max-message-bytes", "1000000000"],
            "1024..=67108864",
        ),
        (&["--grpc-max-concurrent-streams", "0"], "1..=10000"),
        (&["--xds-max-msg-size", "10"], "256..=1073741824"),
        (&["--detailed-metric-limit", "100000000"], "0..=100000"),
    ];
    for (args, range) in cases {
        let flag = args[0];
        let refused = Serve::rules(RULE).args(args).refused(&format!("{args:?}"));
        assert_eq!(
            refused.status.code(),
            Some(2),
            "{args:?}: {}",
            refused.stderr
        );
        assert!(
            refused.stderr.contains(flag) && refused.stderr.contains(range),
            "{args:?}: want {flag} and {range} in\n{}",
            refused.stderr
        );
    }
}

/// The help of `tollgate` and `tollgate serve`, as a newcomer reads it.
fn help(args: &[&str]) -> String {
    let mut cmd = command();
    cmd.args(args);
    let finished = tollgate_testkit::process::run("tollgate --help", cmd, COMMAND_TIMEOUT)
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(finished.status.success(), "{finished:?}");
    finished.stdout
}

/// The help's paragraph of one flag, up to the next flag.
fn flag_help<'a>(help: &'a str, flag: &str) -> &'a str {
    let start = help
        .find(&format!("\n      {flag} "))
        .unwrap_or_else(|| panic!("no {flag} in:\n{help}"));
    let rest = &help[start + 6..];
    let end = rest.find("\n      -").unwrap_or(rest.len());
    &rest[..end]
}

#[test]
fn help_says_what_no_command_does_and_shows_one_default_per_setting() {
    let top = help(&["--help"]);
    assert!(
        top.contains("Run without arguments, tollgate serves: `tollgate` is `tollgate serve`"),
        "{top}"
    );
    let serve = help(&["serve", "--help"]);
    let instance = flag_help(&serve, "--tracing-service-instance-id");
    assert_eq!(instance.matches("[default:").count(), 1, "{instance}");
    assert!(instance.contains("[default: a random UUID]"), "{instance}");
    for (flag, default) in [
        ("--statsd-host", "[default: localhost]"),
        ("--statsd-port", "[default: 8125]"),
    ] {
        let text = flag_help(&serve, flag);
        assert!(text.contains(default), "{text}");
    }
}
