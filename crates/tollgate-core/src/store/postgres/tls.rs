//! TLS to PostgreSQL as libpq users know it: `sslmode` decides whether the connection is
//! encrypted and what of the server's certificate is checked, `sslrootcert` names the CA,
//! `sslcert`/`sslkey` the client certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

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
    pub(super) fn parse(text: &str) -> Result<Self, String> {
        Ok(match text {
            "disable" => Self::Disable,
            "allow" | "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            other => {
                return Err(format!(
                    "sslmode={other} is not one of disable, allow, prefer, require, verify-ca, verify-full"
                ));
            }
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

/// The rustls configuration `tls` asks for; none for plaintext.
pub(super) fn client_config(tls: &PgTls) -> Result<Option<ClientConfig>, String> {
    if tls.mode == SslMode::Disable {
        return Ok(None);
    }
    let provider = CryptoProvider::get_default()
        .cloned()
        .ok_or("no rustls crypto provider is installed for TLS to PostgreSQL")?;
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
                .map_err(|e| format!("sslrootcert: {e}"))?;
            match mode {
                SslMode::VerifyFull => webpki,
                _ => Arc::new(ChainOnly(webpki)),
            }
        }
    };
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let config = match &tls.client {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                .map_err(|e| format!("sslcert {}: {e}", cert.display()))?;
            let key = PrivateKeyDer::from_pem_file(key)
                .map_err(|e| format!("sslkey {}: {e}", key.display()))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| format!("sslcert/sslkey: {e}"))?
        }
        None => builder.with_no_client_auth(),
    };
    Ok(Some(config))
}

/// The CAs of `sslrootcert` (or the system's, for `system` or none given).
fn roots(path: Option<&Path>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    match path {
        Some(path) if path != Path::new("system") => {
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?
            {
                let cert = cert.map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("sslrootcert {}: {e}", path.display()))?;
            }
        }
        _ => {
            roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
        }
    }
    if roots.is_empty() {
        return Err("sslrootcert: no CA certificate found".into());
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
