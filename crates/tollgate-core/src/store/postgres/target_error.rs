//! Why a PostgreSQL URL cannot be used: its own file, as both the URL's parser and its
//! TLS settings say it.

/// Why a PostgreSQL URL cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    /// Not a PostgreSQL URL at all.
    #[error("POSTGRES_URL must be a postgres:// or postgresql:// URL")]
    Scheme,
    /// An `sslmode` libpq does not have.
    #[error("sslmode={0} is not one of disable, allow, prefer, require, verify-ca, verify-full")]
    SslMode(String),
    /// A client certificate without its key, or a key without its certificate.
    #[error("POSTGRES_URL: sslcert and sslkey go together; give both")]
    HalfClientCert,
    /// The driver does not take the rest of the URL.
    #[error("POSTGRES_URL: {0}")]
    Driver(#[source] tokio_postgres::Error),
}
