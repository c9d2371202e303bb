//! TLS material from PEM files, read into rustls and tonic types. Every failure names the
//! file and what is wrong with it, so that a bad mount stops startup with a message a
//! person can act on rather than a handshake error later. The xDS client and the ports'
//! server TLS (`server`) load their certificates and CAs here.

mod client_auth;
mod server;

pub(crate) use server::{Port, ServerTls, ServerTlsFiles};

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// Why TLS material could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error("{}: cannot read: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: not valid PEM: {message}", path.display())]
    Pem { path: PathBuf, message: String },
    #[error("{}: holds no PEM {what}", path.display())]
    Missing { path: PathBuf, what: &'static str },
    #[error("{}: {message}", path.display())]
    Unusable { path: PathBuf, message: String },
    #[error("{} and {}: the key does not belong to the certificate ({message})", cert.display(), key.display())]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        message: String,
    },
    #[error("no trusted CA: the system has no root certificates; give a CA file ({setting})")]
    NoRoots { setting: &'static str },
}

/// A certificate chain and its private key, checked to belong together.
pub(crate) struct KeyPair {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    certified: CertifiedKey,
}

impl KeyPair {
    /// Reads the chain at `cert` and the key at `key`.
    pub(crate) fn load(cert: &Path, key: &Path) -> Result<Self, TlsError> {
        let cert_pem = read(cert)?;
        let key_pem = read(key)?;
        let chain = certificates(cert, &cert_pem)?;
        let private = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| match e {
            rustls::pki_types::pem::Error::NoItemsFound => TlsError::Missing {
                path: key.to_owned(),
                what: "private key",
            },
            e => TlsError::Pem {
                path: key.to_owned(),
                message: e.to_string(),
            },
        })?;
        let provider = provider();
        let certified = CertifiedKey::from_der(chain, private, &provider).map_err(|e| match e {
            rustls::Error::InconsistentKeys(_) => TlsError::Mismatch {
                cert: cert.to_owned(),
                key: key.to_owned(),
                message: e.to_string(),
            },
            e => TlsError::Unusable {
                path: key.to_owned(),
                message: format!("unusable private key: {e}"),
            },
        })?;
        Ok(Self {
            cert_pem,
            key_pem,
            certified,
        })
    }

    /// The pair as rustls presents it.
    pub(crate) fn certified(&self) -> &CertifiedKey {
        &self.certified
    }

    /// The PEM files' contents: chain, key.
    pub(crate) fn into_pem(self) -> (Vec<u8>, Vec<u8>) {
        (self.cert_pem, self.key_pem)
    }

    /// The pair as tonic presents it.
    pub(crate) fn identity(&self) -> tonic::transport::Identity {
        tonic::transport::Identity::from_pem(&self.cert_pem, &self.key_pem)
    }
}

/// The system's root certificates plus those in `ca` (the reference appends its CA file
/// to the system pool). `setting` names the CA setting in the error when nothing is
/// trusted at all.
pub(crate) fn roots(ca: Option<&Path>, setting: &'static str) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    // Unreadable system roots are not fatal: a CA file may be all that is needed.
    let system = rustls_native_certs::load_native_certs();
    store.add_parsable_certificates(system.certs);
    if let Some(path) = ca {
        add_cas(&mut store, path)?;
    }
    if store.is_empty() {
        return Err(TlsError::NoRoots { setting });
    }
    Ok(store)
}

/// The PEM of the CA file at `ca`, checked to hold usable certificates.
pub(crate) fn ca_pem(ca: &Path) -> Result<Vec<u8>, TlsError> {
    ca_only(ca)?;
    read(ca)
}

/// The certificates in `ca` only.
pub(crate) fn ca_only(ca: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    add_cas(&mut store, ca)?;
    Ok(store)
}

fn add_cas(store: &mut RootCertStore, path: &Path) -> Result<(), TlsError> {
    for cert in certificates(path, &read(path)?)? {
        store.add(cert).map_err(|e| TlsError::Unusable {
            path: path.to_owned(),
            message: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(())
}

fn read(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every certificate in a PEM file; at least one.
fn certificates(path: &Path, pem: &[u8]) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Pem {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Missing {
            path: path.to_owned(),
            what: "certificate",
        });
    }
    Ok(certs)
}

/// The process's crypto provider (main installs ring), or ring.
fn provider() -> Arc<CryptoProvider> {
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let missing = dir.path().join("missing.crt");
        let text = dir.path().join("text.crt");
        std::fs::write(&text, "not pem at all\n").expect("write");
        let broken = dir.path().join("broken.crt");
        std::fs::write(
            &broken,
            "-----BEGIN CERTIFICATE-----\nnot base64!\n-----END CERTIFICATE-----\n",
        )
        .expect("write");

        let e = KeyPair::load(&missing, &text).err().expect("missing file");
        assert!(
            e.to_string()
                .starts_with(&format!("{}: cannot read", missing.display())),
            "{e}"
        );
        let e = roots(Some(&text), "CA_SETTING").expect_err("no certificate");
        assert_eq!(
            e.to_string(),
            format!("{}: holds no PEM certificate", text.display())
        );
        let e = roots(Some(&broken), "CA_SETTING").expect_err("bad base64");
        assert!(
            e.to_string()
                .starts_with(&format!("{}: not valid PEM", broken.display())),
            "{e}"
        );
    }
}
