//! A throwaway public-key infrastructure for TLS tests: a CA and the certificates it
//! signs, made at test time with the `openssl` command (`scripts/install-test-deps.sh`
//! installs it) in a temporary directory removed on drop. EC P-256 keys, so that making
//! them takes milliseconds.

use std::path::{Path, PathBuf};
use std::process::Command;

use tempfile::TempDir;

/// A test CA in a temporary directory.
pub struct Pki {
    dir: TempDir,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    /// A new CA (`ca.crt`, `ca.key`). Panics with openssl's message if it cannot be made.
    pub fn new() -> Self {
        let dir = TempDir::new().expect("create a temporary directory for certificates");
        let pki = Self { dir };
        pki.openssl(&[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
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
        pki
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.path().join("ca.crt")
    }

    /// The directory holding every file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A certificate `name.crt` / `name.key` signed by the CA, valid for TLS servers and
    /// clients, with `subject_alt_names` in openssl's form (`IP:127.0.0.1,DNS:localhost`).
    pub fn issue(&self, name: &str, subject_alt_names: &str) -> Issued {
        let (cert, key, csr, ext) = (
            format!("{name}.crt"),
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.ext"),
        );
        self.openssl(&[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &key,
            "-out",
            &csr,
            "-subj",
            &format!("/CN={name}"),
        ]);
        let extensions = format!(
            "subjectAltName={subject_alt_names}\nbasicConstraints=CA:FALSE\n\
             keyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"
        );
        std::fs::write(self.dir.path().join(&ext), extensions).expect("write the extensions");
        self.openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
        Issued {
            cert: self.dir.path().join(cert),
            key: self.dir.path().join(key),
        }
    }

    fn openssl(&self, args: &[&str]) {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(self.dir.path())
            .output()
            .expect("run openssl (scripts/install-test-deps.sh installs it)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
