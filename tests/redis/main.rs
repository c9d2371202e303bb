//! Tollgate's Redis store against real redis-servers: one server, a 3-master Cluster, a
//! sentinel set, TLS, and the failures of each (down, killed under load, frozen, failed
//! over), leases, reference mode's counting, and a smoke test on Valkey. Tests that measure time take the
//! testkit's timing lock.

mod admin;
mod all_or_none;
mod cluster;
mod debts;
mod faults;
mod forged;
mod in_flight;
mod leases;
mod override_faults;
mod overrides;
mod reference_mode;
mod sentinel;
mod single;
mod support;
mod tls;
mod top;
mod valkey;
