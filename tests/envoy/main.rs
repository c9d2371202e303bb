//! End to end through a real Envoy: client → Envoy (HTTP rate-limit filter) → upstream,
//! Envoy asking Tollgate over gRPC before each request; with the memory store and with
//! Tollgates sharing a real redis-server.
//!
//! Envoy runs `examples/envoy/envoy.yaml` (loopback addresses substituted) and Tollgate
//! serves `examples/envoy/config/rules.yaml`, so the example in the repository is what is
//! tested. Needs Envoy and redis-server (`scripts/install-test-deps.sh` installs both);
//! without them these tests fail, they do not skip.

mod budgets;
mod in_flight;
mod limit_from_metadata;
mod memory;
mod quota_routing;
mod redis;
mod reservations;
mod rlqs;
mod support;
mod tls;
mod tracing;
