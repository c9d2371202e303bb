//! Redis over TLS: a redis-server that speaks only TLS, with a certificate for 127.0.0.1
//! issued by a test CA ([`crate::pki`]).

use std::net::TcpStream;
use std::process::Command;

use super::{Engine, START_TIMEOUT};
use crate::pki::{Issued, Pki};
use crate::process::Process;
use crate::{free_port, loopback, wait};

/// A redis-server that speaks only TLS, on a free port; killed on drop.
pub struct TlsRedis {
    _process: Process,
    port: u16,
}

impl TlsRedis {
    /// Serves with a certificate for 127.0.0.1 that `pki` issues; clients must trust
    /// `pki.ca()`.
    pub fn start(pki: &Pki) -> Self {
        Self::start_with(pki, "IP:127.0.0.1", false)
    }

    /// Serves with a certificate for `names` (openssl's form) that `pki` issues; with
    /// `auth_clients`, clients must present a certificate of `pki` too.
    pub fn start_with(pki: &Pki, names: &str, auth_clients: bool) -> Self {
        let port = free_port();
        let server = pki.issue("redis", names);
        let mut cmd = Command::new(Engine::Redis.binary());
        cmd.args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
        ])
        .arg("--tls-cert-file")
        .arg(&server.cert)
        .arg("--tls-key-file")
        .arg(&server.key)
        .arg("--tls-ca-cert-file")
        .arg(pki.ca())
        .args([
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .current_dir(pki.dir());
        let mut process =
            Process::start("redis-server (TLS)", cmd).unwrap_or_else(|e| panic!("{e}"));
        wait::until("the TLS port accepting connections", START_TIMEOUT, || {
            if let Some(status) = process.exit_status() {
                panic!(
                    "redis-server (TLS) exited ({status}); log:\n{}",
                    process.stdout().text()
                );
            }
            TcpStream::connect(loopback(port)).map_err(|e| e.to_string())
        });
        Self {
            _process: process,
            port,
        }
    }

    /// `127.0.0.1:PORT`.
    pub fn host_port(&self) -> String {
        loopback(self.port).to_string()
    }
}

/// redis-server's TLS settings, as `(name, value)` pairs: a second, TLS port serving
/// `server`'s certificate, the CA of `pki`, TLS between nodes (`tls-cluster`,
/// `tls-replication`), and with `auth_clients` client certificates required.
pub(crate) fn settings(
    pki: &Pki,
    server: &Issued,
    port: u16,
    auth_clients: bool,
) -> Vec<(String, String)> {
    let path = |p: &std::path::Path| p.to_string_lossy().into_owned();
    [
        ("tls-port", port.to_string()),
        ("tls-cert-file", path(&server.cert)),
        ("tls-key-file", path(&server.key)),
        ("tls-ca-cert-file", path(&pki.ca())),
        ("tls-cluster", "yes".into()),
        ("tls-replication", "yes".into()),
        (
            "tls-auth-clients",
            if auth_clients { "yes" } else { "no" }.into(),
        ),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_owned(), value))
    .collect()
}

/// [`settings`] as command-line arguments.
pub(crate) fn args(pki: &Pki, server: &Issued, port: u16, auth_clients: bool) -> Vec<String> {
    settings(pki, server, port, auth_clients)
        .into_iter()
        .flat_map(|(name, value)| [format!("--{name}"), value])
        .collect()
}
