//! Redis over TLS: a test CA and a certificate for 127.0.0.1 made with the `openssl`
//! command at test time, and a redis-server that speaks only TLS.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

use super::{START_TIMEOUT, server_binary};
use crate::process::Process;
use crate::{free_port, loopback, process, wait};

/// A CA and a server certificate for 127.0.0.1 it signed, in a temporary directory.
pub struct Certificates {
    dir: TempDir,
}

impl Certificates {
    pub fn make() -> Self {
        let certs = Self {
            dir: TempDir::new().expect("create a directory for certificates"),
        };
        certs.openssl(&[
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
        ]);
        certs.openssl(&[
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
        ]);
        std::fs::write(
            certs.dir.path().join("san.cnf"),
            "subjectAltName=IP:127.0.0.1\n",
        )
        .expect("write san.cnf");
        certs.openssl(&[
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
        ]);
        certs
    }

    fn openssl(&self, args: &[&str]) {
        let mut cmd = Command::new("openssl");
        cmd.args(args).current_dir(self.dir.path());
        let out = process::run("openssl", cmd, START_TIMEOUT)
            .unwrap_or_else(|e| panic!("{e} (scripts/install-test-deps.sh installs openssl)"));
        assert!(out.status.success(), "openssl {args:?}: {}", out.stderr);
    }

    /// The CA certificate, for a client to trust.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

/// A redis-server that speaks only TLS, on a free port; killed on drop.
pub struct TlsRedis {
    _process: Process,
    port: u16,
}

impl TlsRedis {
    pub fn start(certs: &Certificates) -> Self {
        let port = free_port();
        let mut cmd = Command::new(server_binary());
        cmd.args([
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
        .current_dir(certs.path());
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
