//! Connections: per-port limits and timeouts, gRPC limits, TLS.

use super::flag::Flag as _;
use super::parse::parse_timeout;
use crate::net::listen::ConnLimits;
use crate::net::tls::ServerTlsFiles;
use clap::Args;
use clap::builder::RangedU64ValueParser;
use std::path::PathBuf;
use std::time::Duration;

/// What a connection may hold and how long it may idle, on every port.
#[derive(Debug, Args)]
pub(crate) struct ConnArgs {
    /// Close a connection with no traffic either way for this long (Envoy reconnects).
    #[arg(long, env = "CONNECTION_IDLE_TIMEOUT", default_value = "3600s", value_parser = parse_timeout)]
    pub(crate) connection_idle_timeout: Duration,
    /// An HTTP/1 request's headers must arrive within this.
    #[arg(long, env = "HTTP_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_timeout)]
    pub(crate) http_header_read_timeout: Duration,
    /// Close a connection whose first request (after the TLS handshake and the HTTP/2
    /// preface) has not arrived this long after it was accepted, so that silent sockets
    /// cannot hold the connection slots.
    #[arg(long, env = "CONNECTION_FIRST_REQUEST_TIMEOUT", default_value = "5s", value_parser = parse_timeout)]
    pub(crate) connection_first_request_timeout: Duration,
    /// Connections open at once per port; more wait until one closes.
    #[arg(long, env = "MAX_CONNECTIONS", default_value_t = 4_096, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub(crate) max_connections: u64,
    /// Concurrent gRPC calls per connection, 1 to 10,000 (0 would leave every call
    /// waiting).
    #[arg(long, env = "GRPC_MAX_CONCURRENT_STREAMS", default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) grpc_max_concurrent_streams: u32,
    /// Largest gRPC request accepted, in bytes, 1 KiB to 64 MiB; with the stream limit it
    /// bounds what one connection can make Tollgate buffer.
    #[arg(long, env = "GRPC_MAX_MESSAGE_BYTES", default_value_t = 65_536, value_parser = RangedU64ValueParser::<usize>::new().range(1_024..=64 << 20))]
    pub(crate) grpc_max_message_bytes: usize,
    /// A gRPC connection older than this is asked to close (HTTP/2 GOAWAY) once its calls
    /// finish, so that clients reconnect and spread over new replicas.
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE", default_value = "24h", value_parser = parse_timeout)]
    pub(crate) grpc_max_connection_age: Duration,
    /// How long calls on an aged connection get to finish before it is closed.
    #[arg(long, env = "GRPC_MAX_CONNECTION_AGE_GRACE", default_value = "1h", value_parser = parse_timeout)]
    pub(crate) grpc_max_connection_age_grace: Duration,
    /// Ping a gRPC client after this long without traffic, to find dead connections.
    #[arg(long, env = "GRPC_KEEPALIVE_TIME", default_value = "2h", value_parser = parse_timeout)]
    pub(crate) grpc_keepalive_time: Duration,
    /// Close a connection whose ping is not answered within this.
    #[arg(long, env = "GRPC_KEEPALIVE_TIMEOUT", default_value = "20s", value_parser = parse_timeout)]
    pub(crate) grpc_keepalive_timeout: Duration,
}

impl ConnArgs {
    pub(crate) fn limits(&self) -> ConnLimits {
        ConnLimits {
            idle: self.connection_idle_timeout,
            header_read: self.http_header_read_timeout,
            first_request: self.connection_first_request_timeout,
            max_connections: usize::try_from(self.max_connections).unwrap_or(usize::MAX),
            lifetime: None,
        }
    }

    /// The gRPC port's limits: those of every port, and a lifetime of age plus grace.
    pub(crate) fn grpc_limits(&self) -> ConnLimits {
        ConnLimits {
            lifetime: Some(
                self.grpc_max_connection_age
                    .saturating_add(self.grpc_max_connection_age_grace),
            ),
            ..self.limits()
        }
    }
}

/// TLS on the ports, with the reference's names. Certificate, key and client CA are
/// reloaded when their files change.
#[derive(Debug, Args)]
pub(crate) struct TlsArgs {
    /// Serve gRPC over TLS with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY.
    #[arg(long, env = "GRPC_SERVER_USE_TLS", default_value_t = false, flag())]
    pub(crate) grpc_server_use_tls: bool,
    /// The server's certificate chain (PEM).
    #[arg(long, env = "GRPC_SERVER_TLS_CERT")]
    pub(crate) grpc_server_tls_cert: Option<PathBuf>,
    /// The server's private key (PEM).
    #[arg(long, env = "GRPC_SERVER_TLS_KEY")]
    pub(crate) grpc_server_tls_key: Option<PathBuf>,
    /// Require gRPC clients to present a certificate this CA signed (mTLS).
    #[arg(long, env = "GRPC_CLIENT_TLS_CACERT")]
    pub(crate) grpc_client_tls_cacert: Option<PathBuf>,
    /// Envoy Gateway's name for GRPC_CLIENT_TLS_CACERT (the reference ignores it; here it
    /// enforces the mTLS Envoy Gateway intends).
    #[arg(long, env = "GRPC_SERVER_TLS_CA_CERT")]
    pub(crate) grpc_server_tls_ca_cert: Option<PathBuf>,
    /// Client certificates must name one of these, as a DNS or URI (SPIFFE ID) subject
    /// alternative name; comma-separated. Needs a client CA.
    #[arg(long, env = "GRPC_CLIENT_TLS_SAN", value_delimiter = ',')]
    pub(crate) grpc_client_tls_san: Vec<String>,
    /// Serve the HTTP port (health, /json, /metrics) over TLS too, with the same
    /// certificate; it asks clients for no certificate, so probes keep working.
    #[arg(long, env = "HTTP_SERVER_USE_TLS", default_value_t = false, flag())]
    pub(crate) http_server_use_tls: bool,
}

impl TlsArgs {
    /// The files server TLS is made of, when a port uses TLS. Settings that would leave a
    /// port less secure than asked (a client CA or SAN that would not be enforced) are
    /// errors, not silent no-ops.
    pub(crate) fn files(&self) -> anyhow::Result<Option<ServerTlsFiles>> {
        let client_ca = match (&self.grpc_client_tls_cacert, &self.grpc_server_tls_ca_cert) {
            (Some(a), Some(b)) if a != b => anyhow::bail!(
                "GRPC_CLIENT_TLS_CACERT ({}) and GRPC_SERVER_TLS_CA_CERT ({}) name different \
                 client CAs; they are one setting, give one",
                a.display(),
                b.display()
            ),
            (a, b) => a.as_ref().or(b.as_ref()).cloned(),
        };
        let sans: Vec<String> = self
            .grpc_client_tls_san
            .iter()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty())
            .collect();
        anyhow::ensure!(
            sans.is_empty() || client_ca.is_some(),
            "GRPC_CLIENT_TLS_SAN needs GRPC_CLIENT_TLS_CACERT: without a client CA no client \
             certificate is asked for, so the name could not be checked"
        );
        if !self.grpc_server_use_tls {
            anyhow::ensure!(
                client_ca.is_none(),
                "a client CA (GRPC_CLIENT_TLS_CACERT / GRPC_SERVER_TLS_CA_CERT) needs \
                 GRPC_SERVER_USE_TLS=true: clients cannot be verified over plaintext"
            );
            anyhow::ensure!(
                !self.http_server_use_tls,
                "HTTP_SERVER_USE_TLS uses the gRPC port's certificate: set \
                 GRPC_SERVER_USE_TLS=true with GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
            );
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&self.grpc_server_tls_cert, &self.grpc_server_tls_key)
        else {
            anyhow::bail!(
                "GRPC_SERVER_USE_TLS=true needs both GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY"
            );
        };
        Ok(Some(ServerTlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca,
            client_names: sans,
        }))
    }
}
