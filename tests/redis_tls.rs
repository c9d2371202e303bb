//! Redis over TLS: a redis-server with a certificate from a test CA made here with the
//! `openssl` command, trusted by Tollgate through `SSL_CERT_FILE` (rustls' native roots).

mod common;
mod redis_harness;

use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{Code, ConfigDir, Server, code, http_get, serve_command};
use redis_harness::{REDIS_START_TIMEOUT, free_port, wait_for};

const RULES: &str =
    "domain: tls\ndescriptors:\n  - {key: user, rate_limit: {unit: hour, requests_per_unit: 2}}\n";

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (scripts/install-test-deps.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1, in `dir`.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=tollgate-test-ca",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ],
    );
    std::fs::write(dir.join("san.cnf"), "subjectAltName=IP:127.0.0.1\n").expect("write san.cnf");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "san.cnf",
        ],
    );
}

/// A redis-server that speaks only TLS, killed on drop.
struct TlsRedis {
    child: Child,
    port: u16,
}

impl TlsRedis {
    fn start(dir: &Path) -> Self {
        let port = free_port();
        let child = Command::new("redis-server")
            .args([
                "--port",
                "0",
                "--tls-port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
            ])
            .args([
                "--tls-cert-file",
                "server.crt",
                "--tls-key-file",
                "server.key",
            ])
            .args(["--tls-ca-cert-file", "ca.crt", "--tls-auth-clients", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let addr = format!("127.0.0.1:{port}");
        wait_for(
            "the TLS port accepts",
            REDIS_START_TIMEOUT,
            || TcpStream::connect(&addr).ok(),
            String::new,
        );
        Self { child, port }
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn tollgate(url: &str, extra: &[&str], ca: Option<&Path>) -> Server {
    let config = ConfigDir::with_file("rules.yaml", RULES);
    let mut cmd = serve_command(&config.file("rules.yaml"));
    cmd.args(["--redis-url", url, "--on-store-error", "error"])
        .args(extra);
    if let Some(ca) = ca {
        cmd.env("SSL_CERT_FILE", ca);
    }
    Server::spawn(cmd).unwrap_or_else(|f| f.fail()).keep(config)
}

#[tokio::test]
async fn limits_over_tls_with_either_url_form() {
    let dir = tempfile::tempdir().expect("temp dir");
    certificates(dir.path());
    let redis = TlsRedis::start(dir.path());
    let ca = dir.path().join("ca.crt");

    let plain_form = format!("127.0.0.1:{}", redis.port);
    let url_form = format!("rediss://127.0.0.1:{}", redis.port);
    let by_flag = tollgate(&plain_form, &["--redis-tls"], Some(&ca));
    let by_scheme = tollgate(&url_form, &[], Some(&ca));
    assert_eq!(
        http_get(by_flag.http_addr(), "/healthcheck/store").status,
        200
    );
    assert_eq!(
        http_get(by_scheme.http_addr(), "/healthcheck/store").status,
        200
    );

    // One shared counter through both: 2 admitted, then denied.
    let mut a = by_flag.client().await;
    let mut b = by_scheme.client().await;
    assert_eq!(code(&a.check("tls", &[("user", "ann")]).await), Code::Ok);
    assert_eq!(code(&b.check("tls", &[("user", "ann")]).await), Code::Ok);
    assert_eq!(
        code(&a.check("tls", &[("user", "ann")]).await),
        Code::OverLimit
    );
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused() {
    let dir = tempfile::tempdir().expect("temp dir");
    certificates(dir.path());
    let redis = TlsRedis::start(dir.path());
    let server = tollgate(&format!("rediss://127.0.0.1:{}", redis.port), &[], None);
    // The store never comes up, and with --on-store-error error requests say so.
    assert_eq!(
        http_get(server.http_addr(), "/healthcheck/store").status,
        503
    );
    let mut rls = server.client().await;
    let err = rls
        .call(common::request("tls", &[&[("user", "ann")]]))
        .await
        .expect_err("no store, no answer");
    assert_eq!(err.code(), tonic::Code::Unavailable);
}
