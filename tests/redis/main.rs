//! Tollgate's Redis store against real redis-servers: one server, a 3-master Cluster, a
//! sentinel set, TLS, and the failures of each (down, killed under load, frozen, paused,
//! failed over, resharded), leases, reference mode's counting. The scenarios that prove
//! Valkey compatibility run on Valkey 8.1 too (`on_each_engine!`). Tests that measure
//! time take the testkit's timing lock.

#[macro_use]
mod engines;

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
