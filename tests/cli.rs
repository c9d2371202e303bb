//! Command line and environment: `check-config`, listener and config-path
//! settings through flags and environment variables, directory loading.

mod common;

use std::path::Path;

use common::*;

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

/// `tollgate serve` with no flags at all: listeners from GRPC_ADDR/HTTP_ADDR,
/// config path from the RUNTIME_* variables.
fn serve_from_runtime_env(root: &Path, subdirectory: &str, app_directory: Option<&str>) -> Server {
    let mut cmd = tollgate();
    cmd.arg("serve")
        .env("GRPC_ADDR", "127.0.0.1:0")
        .env("HTTP_ADDR", "127.0.0.1:0")
        .env("RUNTIME_ROOT", root)
        .env("RUNTIME_SUBDIRECTORY", subdirectory);
    if let Some(app) = app_directory {
        cmd.env("RUNTIME_APPDIRECTORY", app);
    }
    Server::spawn(cmd).unwrap_or_else(|finished| finished.fail())
}

#[test]
fn check_config_accepts_a_valid_file() {
    let dir = ConfigDir::with_file("rules.yaml", RULE);
    let finished = check_config(&dir.file("rules.yaml"));
    assert!(finished.status.success(), "{finished:?}");
    assert_eq!(finished.stdout.trim(), "ok");
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
    assert_eq!(finished.stdout.trim(), "ok");
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

    let server = Server::spawn(serve_command(dir.path()))
        .unwrap_or_else(|finished| finished.fail())
        .keep(dir);
    assert_rule_loaded(&server).await;
    let mut rls = server.client().await;
    let status = rls.check("more", &[("m", "x")]).await;
    assert_limited(&status, Code::Ok, &limit(9, Unit::Hour, ""), 8);
}

#[test]
fn readiness_line_is_the_only_stdout_output() {
    let dir = ConfigDir::with_file("rules.yaml", RULE);
    let server = Server::spawn(serve_command(&dir.file("rules.yaml")))
        .unwrap_or_else(|finished| finished.fail());
    assert!(
        server.stdout_before_ready.is_empty(),
        "stdout before readiness: {:?}",
        server.stdout_before_ready
    );
    let response = http_get(server.http_addr(), "/healthcheck");
    assert_eq!(response.status, 200);
    let finished = server.stop();
    assert_eq!(finished.stdout, "", "stdout after readiness line");
}

#[tokio::test]
async fn listen_addresses_from_grpc_addr_and_http_addr() {
    let dir = ConfigDir::with_file("rules.yaml", RULE);
    let mut cmd = tollgate();
    cmd.arg("serve")
        .arg("--config")
        .arg(dir.file("rules.yaml"))
        .env("GRPC_ADDR", "127.0.0.1:0")
        .env("HTTP_ADDR", "127.0.0.1:0");
    let server = Server::spawn(cmd)
        .unwrap_or_else(|finished| finished.fail())
        .keep(dir);
    assert!(is_loopback_v4(server.grpc_addr()), "{:?}", server.addrs);
    assert!(is_loopback_v4(server.http_addr()), "{:?}", server.addrs);
    assert_eq!(http_get(server.http_addr(), "/healthcheck").status, 200);
    assert_rule_loaded(&server).await;
}

#[tokio::test]
async fn listen_addresses_from_reference_host_and_port_variables() {
    let dir = ConfigDir::with_file("rules.yaml", RULE);
    let mut cmd = tollgate();
    cmd.arg("serve")
        .arg("--config")
        .arg(dir.file("rules.yaml"))
        .env("GRPC_HOST", "127.0.0.1")
        .env("GRPC_PORT", "0")
        .env("HOST", "127.0.0.1")
        .env("PORT", "0");
    let server = Server::spawn(cmd)
        .unwrap_or_else(|finished| finished.fail())
        .keep(dir);
    assert!(is_loopback_v4(server.grpc_addr()), "{:?}", server.addrs);
    assert!(is_loopback_v4(server.http_addr()), "{:?}", server.addrs);
    assert_eq!(http_get(server.http_addr(), "/healthcheck").status, 200);
    assert_rule_loaded(&server).await;
}

#[tokio::test]
async fn config_path_from_runtime_variables_defaults_app_directory_to_config() {
    let dir = ConfigDir::new();
    dir.write("current/config/rules.yaml", RULE);
    let server = serve_from_runtime_env(dir.path(), "current", None).keep(dir);
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
    let server = serve_from_runtime_env(dir.path(), "srv", Some("ratelimit")).keep(dir);
    assert_rule_loaded(&server).await;
}

#[tokio::test]
async fn precision_and_max_counters_flags_keep_exact_burst_limits() {
    let server = Server::start_with_args(RULE, &["--precision", "1", "--max-counters", "10"]);
    assert_rule_loaded(&server).await;
}
