//! Client certificates that must not only chain to the CA but also name an allowed
//! client: a DNS name or a URI such as a SPIFFE ID in the subject alternative names.
//! (The reference checks DNS names only.)

use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

/// The names a client certificate may carry, at least one.
#[derive(Debug)]
pub(crate) struct AllowedNames(Vec<String>);

impl AllowedNames {
    /// `names`, unless there are none.
    pub(crate) fn new(names: &[String]) -> Option<Self> {
        let names: Vec<String> = names
            .iter()
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect();
        (!names.is_empty()).then_some(Self(names))
    }

    /// Whether the certificate's SANs name an allowed client. DNS names compare without
    /// case, as DNS does; URIs exactly.
    fn admit(&self, cert: &CertificateDer<'_>) -> bool {
        let Ok(cert) = webpki::EndEntityCert::try_from(cert) else {
            return false;
        };
        let dns = cert
            .valid_dns_names()
            .any(|name| self.0.iter().any(|a| a.eq_ignore_ascii_case(name)));
        dns || cert
            .valid_uri_names()
            .any(|uri| self.0.iter().any(|a| a == uri))
    }
}

/// Verifies the chain with `inner`, then the names.
#[derive(Debug)]
pub(crate) struct ClientNames {
    inner: Arc<dyn ClientCertVerifier>,
    allowed: AllowedNames,
}

impl ClientNames {
    pub(crate) fn new(inner: Arc<dyn ClientCertVerifier>, allowed: AllowedNames) -> Self {
        Self { inner, allowed }
    }
}

impl ClientCertVerifier for ClientNames {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        match self.allowed.admit(end_entity) {
            true => Ok(verified),
            false => Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName,
            )),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
