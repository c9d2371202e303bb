//! The ports' server TLS: a rustls configuration built from the certificate, key and
//! client CA files, and built again when they change (Kubernetes rotates mounted
//! Secrets). A new configuration applies to the next handshake; open connections keep
//! theirs. A bad new set of files is logged and the old configuration keeps serving.

use std::path::PathBuf;
use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::SingleCertAndKey;
use tokio_rustls::TlsAcceptor;

use super::client_auth::{AllowedNames, ClientNames};
use super::{KeyPair, TlsError, ca_only, provider};
use crate::config::watch::{self, FileWatch, Watched};

/// Protocols the gRPC port speaks: HTTP/2 only.
const GRPC_ALPN: &[&[u8]] = &[b"h2"];
/// Protocols the HTTP port speaks.
const HTTP_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];

/// The files server TLS is made of.
#[derive(Debug, Clone)]
pub(crate) struct ServerTlsFiles {
    /// The certificate chain the server presents.
    pub(crate) cert: PathBuf,
    /// Its private key.
    pub(crate) key: PathBuf,
    /// When set, gRPC clients must present a certificate this CA signed.
    pub(crate) client_ca: Option<PathBuf>,
    /// When not empty, the client certificate must name one of these (DNS or URI SAN).
    pub(crate) client_names: Vec<String>,
}

/// Which port a handshake is for: the gRPC port verifies client certificates, the HTTP
/// port (health probes, scrapes) does not ask for any.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Port {
    Grpc,
    Http,
}

/// Both ports' configurations from one set of files.
struct Configs {
    grpc: Arc<ServerConfig>,
    http: Arc<ServerConfig>,
}

/// Server TLS, current with its files.
pub(crate) struct ServerTls {
    files: ServerTlsFiles,
    current: ArcSwap<Configs>,
}

impl ServerTls {
    /// Loads the files; any problem is an error naming the file.
    pub(crate) fn load(files: ServerTlsFiles) -> Result<Arc<Self>, TlsError> {
        let configs = build(&files)?;
        Ok(Arc::new(Self {
            files,
            current: ArcSwap::from_pointee(configs),
        }))
    }

    /// Takes the files as they are now, or keeps the old configuration if they are bad.
    pub(crate) fn reload(&self) {
        match build(&self.files) {
            Ok(configs) => {
                self.current.store(Arc::new(configs));
                tracing::info!(cert = %self.files.cert.display(), "TLS certificate reloaded");
            }
            Err(e) => tracing::error!("TLS files rejected, the previous ones keep serving: {e}"),
        }
    }

    /// Reloads after every change to the files.
    pub(crate) fn watch(self: &Arc<Self>) -> anyhow::Result<FileWatch> {
        let files = &self.files;
        let paths = [
            Some(&files.cert),
            Some(&files.key),
            files.client_ca.as_ref(),
        ];
        let watched = Watched::files(paths.into_iter().flatten().map(PathBuf::as_path));
        let tls = self.clone();
        watch::watch(watched, move || {
            tls.reload();
            std::future::ready(())
        })
    }

    /// An acceptor with the current configuration for `port`.
    pub(crate) fn acceptor(&self, port: Port) -> TlsAcceptor {
        let configs = self.current.load();
        TlsAcceptor::from(match port {
            Port::Grpc => configs.grpc.clone(),
            Port::Http => configs.http.clone(),
        })
    }
}

fn build(files: &ServerTlsFiles) -> Result<Configs, TlsError> {
    let pair = KeyPair::load(&files.cert, &files.key)?;
    let certified = Arc::new(pair.certified().clone());
    let client_verifier: Arc<dyn ClientCertVerifier> = match &files.client_ca {
        Some(ca) => {
            let roots = Arc::new(ca_only(ca)?);
            let webpki = WebPkiClientVerifier::builder_with_provider(roots, provider())
                .build()
                .map_err(|e| TlsError::Unusable {
                    path: ca.clone(),
                    message: format!("cannot verify clients with this CA: {e}"),
                })?;
            match AllowedNames::new(&files.client_names) {
                Some(names) => Arc::new(ClientNames::new(webpki, names)),
                None => webpki,
            }
        }
        None => WebPkiClientVerifier::no_client_auth(),
    };
    let config = |verifier: Arc<dyn ClientCertVerifier>, alpn: &[&[u8]]| {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Unusable {
                path: files.cert.clone(),
                message: e.to_string(),
            })?
            .with_client_cert_verifier(verifier)
            .with_cert_resolver(Arc::new(SingleCertAndKey::from(certified.clone())));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok::<_, TlsError>(Arc::new(config))
    };
    Ok(Configs {
        grpc: config(client_verifier, GRPC_ALPN)?,
        http: config(WebPkiClientVerifier::no_client_auth(), HTTP_ALPN)?,
    })
}
