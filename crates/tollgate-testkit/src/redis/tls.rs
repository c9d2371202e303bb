//! Redis over TLS: a redis-server that speaks only TLS, with a certificate for 127.0.0.1
//! issued by a test CA ([`crate::pki`]).

use std::net::TcpStream;
use std::process::Command;

use super::{START_TIMEOUT, server_binary};
use crate::pki::Pki;
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
        let mut cmd = Command::new(server_binary());
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
