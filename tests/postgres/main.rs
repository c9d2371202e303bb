//! Tollgate's PostgreSQL store against a real PostgreSQL server that each test starts on
//! a free port: limiting, sharing between instances, local denials, accuracy under
//! overload, the schema, settings and `tollgate migrate` (`store`); restart under load,
//! bad credentials, an unreachable server and the statement timeout (`faults`); leases
//! on a hot counter (`leases`); concurrent calls batched into one statement (`batches`).

mod admin;
mod all_or_none;
mod batches;
mod debts;
mod faults;
mod forged;
mod in_flight;
mod leases;
mod override_faults;
mod overrides;
mod store;
mod support;
