//! TLS to PostgreSQL as libpq users know it: `sslmode` decides whether the connection is
//! encrypted and what of the server's certificate is checked, `sslrootcert` names the CA,
//! `sslcert`/`sslkey` the client certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{VerifierBuilderError, WebPkiServerVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::{Error as PemError, PemObject as _};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use super::target_error::TargetError;

/// libpq's `sslmode`, in increasing order of what is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    /// Plaintext.
    Disable,
    /// TLS if the server offers it (`allow` and `prefer`, libpq's default); no check.
    Prefer,
    /// TLS or no connection; the certificate is not checked (unless a root is given).
    Require,
    /// TLS, and the certificate chains to the root.
    VerifyCa,
    /// TLS, the chain, and the host name in the certificate.
    VerifyFull,
}

impl SslMode {
    pub(super) fn parse(text: &str) -> Result<Self, TargetError> {
        Ok(match text {
            "disable" => Self::Disable,
            "allow" | "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => return Err(TargetError::SslMode(other.to_owned())),
        })
    }
}

/// The TLS part of a PostgreSQL URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTls {
    /// What is asked of the connection.
    pub mode: SslMode,
    /// `sslrootcert`: a PEM file of CAs, or `system` for the system's roots.
    pub root: Option<PathBuf>,
    /// `sslcert` and `sslkey`: a client certificate chain and its key (PEM files).
    pub client: Option<(PathBuf, PathBuf)>,
}

/// Why the TLS files of a PostgreSQL URL cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The process installed no rustls crypto provider.
    #[error("no rustls crypto provider is installed for TLS to PostgreSQL")]
    NoProvider,
    /// `sslrootcert` could not be read as PEM.
    #[error("sslrootcert {}: {source}", .path.display())]
    RootFile {
        /// The file.
        path: PathBuf,
        /// What reading it found.
        source: PemError,
    },
    /// A CA of `sslrootcert` was refused.
    #[error("sslrootcert {}: {source}", .path.display())]
    RootCert {
        /// The file.
        path: PathBuf,
        /// Why rustls refused it.
        source: rustls::Error,
    },
    /// No CA certificate at all.
    #[error("sslrootcert: no CA certificate found")]
    NoRoots,
    /// The CAs make no verifier.
    #[error("sslrootcert: {0}")]
    Verifier(#[source] VerifierBuilderError),
    /// The provider offers no protocol version rustls takes as safe.
    #[error(transparent)]
    Protocols(rustls::Error),
    /// `sslcert` could not be read as PEM.
    #[error("sslcert {}: {source}", .path.display())]
    Cert {
        /// The file.
        path: PathBuf,
        /// What reading it found.
        source: PemError,
    },
    /// `sslkey` could not be read as PEM.
    #[error("sslkey {}: {source}", .path.display())]
    Key {
        /// The file.
        path: PathBuf,
        /// What reading it found.
        source: PemError,
    },
    /// The certificate and the key do not make a client identity.
    #[error("sslcert/sslkey: {0}")]
    ClientAuth(#[source] rustls::Error),
}

/// The rustls configuration `tls` asks for; none for plaintext.
pub(super) fn client_config(tls: &PgTls) -> Result<Option<ClientConfig>, TlsError> {
    if tls.mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = CryptoProvider::get_default()
        .cloned()
        .ok_or(TlsError::NoProvider)?;
    // As libpq: with a root given, `require` checks the chain as `verify-ca` does.
    let mode = match (tls.mode, &tls.root) {
        (SslMode::Require, Some(_)) => SslMode::VerifyCa,
        (mode, _) => mode,
    };
    let verifier: Arc<dyn ServerCertVerifier> = match mode {
        SslMode::Disable | SslMode::Prefer | SslMode::Require => {
            Arc::new(Unchecked(provider.clone()))
        }
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(roots(tls.root.as_deref())?);
            let webpki = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(TlsError::Verifier)?;
            match mode {
                SslMode::VerifyFull => webpki,
                _ => Arc::new(ChainOnly(webpki)),
            }
        }
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Protocols)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &tls.client {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|source| TlsError::Cert {
                    path: cert.clone(),
                    source,
                })?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|source| TlsError::Key {
                path: key.clone(),
                source,
            })?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(TlsError::ClientAuth)?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Some(config))
}

/// The CAs of `sslrootcert` (or the system's, for `system` or none given).
fn roots(path: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    match path {
        Some(path) if path != Path::new("system") => {
            let unreadable = |source| TlsError::RootFile {
                path: path.to_owned(),
                source,
            };
            for cert in CertificateDer::pem_file_iter(path).map_err(unreadable)? {
                roots
                    .add(cert.map_err(unreadable)?)
                    .map_err(|source| TlsError::RootCert {
                        path: path.to_owned(),
                        source,
                    })?;
            }
        }
        _ => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    if roots.is_empty() {
        return Err(TlsError::NoRoots);
    }
    Ok(roots)
}

/// `prefer` and `require`: encrypted, the server's certificate taken as it comes (libpq
/// does the same); the handshake's signatures are still checked.
#[derive(Debug)]
struct Unchecked(Arc<CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain is checked, the name in the certificate is not.
#[derive(Debug)]
struct ChainOnly(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for ChainOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}
