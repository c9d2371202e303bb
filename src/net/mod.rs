//! Connections: bounded listeners and TLS.

pub(crate) mod listen;
pub(crate) mod tls;
