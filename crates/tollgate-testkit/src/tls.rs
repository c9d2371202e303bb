//! TLS clients for the suites: a gRPC channel that trusts the test CA and may present a
//! client certificate, a bare handshake that reports the certificate the server
//! presented, and HTTPS requests.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::http::{self, Method};
use crate::pki::Issued;

/// The name the test servers' certificates carry (`Pki::issue(…, "DNS:localhost,…")`).
pub const SERVER_NAME: &str = "localhost";

/// A gRPC channel over TLS to `addr`, trusting only `ca`, presenting `client` if given.
/// A refused handshake shows as an error here or on the first call, depending on when
/// the server's alert arrives (TLS 1.3 sends it after the client finished).
pub async fn grpc_channel(
    addr: SocketAddr,
    ca: &Path,
    client: Option<&Issued>,
) -> Result<Channel, String> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(ca)))
        .domain_name(SERVER_NAME);
    if let Some(issued) = client {
        tls = tls.identity(Identity::from_pem(read(&issued.cert), read(&issued.key)));
    }
    Endpoint::from_shared(format!("https://{addr}"))
        .map_err(|e| e.to_string())?
        .tls_config(tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(crate::grpc::TIMEOUT)
        .timeout(crate::grpc::TIMEOUT)
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))
}

/// A TLS connection to `addr` trusting only `ca`, offering `alpn`, with no client
/// certificate.
pub async fn connect(
    addr: SocketAddr,
    ca: &Path,
    alpn: &[&[u8]],
) -> Result<TlsStream<TcpStream>, String> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&read(ca)) {
        let cert = cert.map_err(|e| format!("{}: {e}", ca.display()))?;
        roots.add(cert).map_err(|e| e.to_string())?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    let tcp = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from(SERVER_NAME).map_err(|e| e.to_string())?;
    let handshake = TlsConnector::from(Arc::new(config)).connect(name, tcp);
    tokio::time::timeout(http::TIMEOUT, handshake)
        .await
        .map_err(|_| "no handshake within the timeout".to_owned())?
        .map_err(|e| format!("handshake: {e}"))
}

/// The certificate (DER) the server at `addr` presents now, verified against `ca`.
pub async fn server_certificate(addr: SocketAddr, ca: &Path) -> Result<Vec<u8>, String> {
    let stream = connect(addr, ca, &[b"h2"]).await?;
    let (_, session) = stream.get_ref();
    session
        .peer_certificates()
        .and_then(|chain| chain.first())
        .map(|cert| cert.to_vec())
        .ok_or_else(|| "the server presented no certificate".to_owned())
}

/// The DER of the first certificate in the PEM file at `path`.
pub fn certificate_der(path: &Path) -> Vec<u8> {
    CertificateDer::from_pem_slice(&read(path))
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .to_vec()
}

/// `GET path` over HTTPS/1.1, trusting only `ca`.
pub async fn https_get(addr: SocketAddr, ca: &Path, path: &str) -> Result<http::Response, String> {
    let exchange = async {
        let stream = connect(addr, ca, &[b"http/1.1"]).await?;
        http::send_on(stream, &addr.to_string(), Method::GET, path, &[], "").await
    };
    tokio::time::timeout(http::TIMEOUT, exchange)
        .await
        .map_err(|_| "no complete response within the timeout".to_owned())?
}

fn read(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}
