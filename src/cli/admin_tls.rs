//! The admin commands' TLS: a rustls client from the options `tollgate client` takes, for
//! an HTTP port served over TLS (`HTTP_SERVER_USE_TLS`).

use std::sync::Arc;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use crate::config::settings::ClientTlsArgs;
use crate::net::tls;

/// `tcp`, connected to `addr`, wrapped in TLS as `args` ask: trusting `--tls-ca` alone or
/// the system's roots, presenting `--tls-cert`, checking `--tls-server-name` or the host.
pub(super) async fn connect(
    tcp: TcpStream,
    addr: &str,
    args: &ClientTlsArgs,
) -> anyhow::Result<TlsStream<TcpStream>> {
    let roots = match &args.tls_ca {
        Some(ca) => tls::ca_only(ca)?,
        None => tls::roots(None, "--tls-ca")?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let config = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let (chain, key) = tls::KeyPair::load(cert, key)?.into_pem();
            let chain = CertificateDer::pem_slice_iter(&chain)
                .collect::<Result<Vec<_>, _>>()
                .context("--tls-cert holds no readable certificate")?;
            let key = PrivateKeyDer::from_pem_slice(&key).context("--tls-key holds no key")?;
            builder.with_client_auth_cert(chain, key)?
        }
        _ => builder.with_no_client_auth(),
    };
    let host = match &args.tls_server_name {
        Some(name) => name.clone(),
        None => host_of(addr).to_owned(),
    };
    let name = ServerName::try_from(host.clone())
        .with_context(|| format!("'{host}' is no server name (--tls-server-name)"))?;
    TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .with_context(|| format!("no TLS with {addr}"))
}

/// The host of `host:port` (`[::1]:80` gives `::1`).
fn host_of(addr: &str) -> &str {
    let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_is_the_address_without_its_port() {
        assert_eq!(host_of("127.0.0.1:8080"), "127.0.0.1");
        assert_eq!(host_of("[::1]:8080"), "::1");
        assert_eq!(host_of("tollgate.internal:443"), "tollgate.internal");
        assert_eq!(host_of("localhost"), "localhost");
    }
}
