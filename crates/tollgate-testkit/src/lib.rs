//! Test support for Tollgate's test suites and benchmarks: real child processes
//! (Tollgate, redis-server, Envoy) on loopback, and the clients that talk to them.
//!
//! - [`xds`]: an xDS management server (ADS, State of the World) that pushes rules to
//!   Tollgate and records its ACKs and NACKs;
//! - [`pki`]: a test CA and certificates made with the `openssl` command.

pub mod pki;
pub mod xds;
