//! Test support for Tollgate's test suites and benchmarks: real child processes
//! (Tollgate, redis-server, PostgreSQL, Envoy) on loopback, and the clients that talk to
//! them.
//!
//! Read in this order:
//! - [`wait`]: every wait is a condition polled under a deadline, never a bare sleep;
//! - [`process`]: children that die with the test process, their output, signals;
//! - [`tollgate`]: the binary under test, its rule directories, `serve` and `check-config`;
//! - [`grpc`], [`http`] and [`http2`] (prior knowledge, every header chosen): the clients,
//!   [`raw_grpc`]: gRPC by hand for what clients never send, [`h2_frames`]: HTTP/2 byte by
//!   byte for what no library sends, [`h2_rls`]: the load benchmark's lean client, and
//!   [`keys`]: where counters live in Redis;
//! - [`redis`], [`postgres`] and [`envoy`]: the real components Tollgate talks to or sits
//!   behind, [`shared_store`]: the limits and checks the Redis and PostgreSQL suites
//!   share, and [`leases`]: the leasing run both suites make;
//! - [`toxiproxy`]: a TCP proxy between Tollgate and its store for faults (latency,
//!   held data, resets, bandwidth, cuts and heals);
//! - [`load`] and [`accuracy`]: concurrent traffic with timed answers, and what the
//!   answers say about a limit;
//! - [`serial`]: the lock that keeps timing-sensitive tests apart, [`rng`]: seeded
//!   randomness for fuzzing and chaos runs, and [`fuzz`]: the engine the binary's fuzz
//!   targets run on;
//! - [`xds`]: an xDS management server (ADS, State of the World) that pushes rules to
//!   Tollgate and records its ACKs and NACKs, [`envoy_gateway`]: the settings Envoy
//!   Gateway deploys Tollgate with, [`pki`]: a test CA and certificates
//!   made with the `openssl` command, and [`tls`]: the clients that use them;
//! - [`otlp`]: an OpenTelemetry collector (OTLP over gRPC and HTTP) that keeps the spans
//!   it receives;
//! - [`admin`]: `/explain` and `DELETE /counters`, and the reset every shared store
//!   must carry to every instance, and [`forged`]: announcements forged on a shared
//!   store's channel, and how little of them is believed;
//! - [`chromium`]: a headless browser that loads a page and dumps its document;
//! - [`helm`]: `helm lint` and `helm template` of the repository's chart, and the rendered
//!   manifests;
//! - [`reference`]: the reference service (envoyproxy/ratelimit, built from the Go module
//!   proxy) as a black box beside Tollgate, and [`statsd_exporter`]: where its metrics go;
//! - [`zoneinfo`]: calendar windows computed by Python's `zoneinfo`, independently of
//!   Tollgate.

pub mod accuracy;
pub mod admin;
pub mod all_or_none;
pub mod chromium;
pub mod cpu;
pub mod envoy;
pub mod envoy_gateway;
pub mod forged;
pub mod fuzz;
pub mod grpc;
pub mod h2_frames;
pub mod h2_rls;
pub mod helm;
pub mod http;
pub mod http2;
pub mod in_flight;
pub mod keys;
pub mod leases;
pub mod load;
pub mod otlp;
pub mod overrides;
pub mod pki;
mod ports;
pub mod postgres;
pub mod process;
pub mod raw_grpc;
pub mod redis;
pub mod reference;
pub mod rng;
pub mod serial;
pub mod shared_store;
pub mod statsd_exporter;
pub mod tls;
pub mod tollgate;
pub mod toxiproxy;
pub mod wait;
pub mod xds;
pub mod zoneinfo;

pub use ports::{free_port, free_ports};

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// A failure to start or drive a child process, as a message for a person (it quotes the
/// process's output when there is any).
#[derive(Debug)]
pub struct Error(String);

impl Error {
    pub fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Self(e.to_string())
    }
}

/// The workspace's root directory, where `scripts/install-test-deps.sh` installs under
/// `target/test-deps/`.
pub fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `127.0.0.1:port`.
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}
