//! Tollgate beside the real reference service (envoyproxy/ratelimit, built from the Go
//! module proxy at a pinned version by `scripts/install-test-deps.sh`, used as a black
//! box):
//!
//! - [`integration`]: the reference's own integration scripts, Envoy configurations and
//!   rule files, hosts and ports rewritten only, against the reference (a control) and
//!   against Tollgate with the reference's environment, behind real Envoys;
//! - [`differential`]: random rule sets and request sequences ([`generate`]) sent in
//!   lockstep to the reference and to Tollgate, answers compared field by field;
//! - [`mixed_fleet`]: a reference and a Tollgate in reference mode on one Redis, under
//!   load on the same keys, admitting no more than the limit together;
//! - [`stats`]: statsd output mapped by the reference's own statsd_exporter mapping, the
//!   same series from both; the debug port's `/stats` and `/rlconfig`.
//!
//! Without Go there is no reference: every test here then passes after printing a
//! `SKIPPED` line that says why.

mod compare;
mod differential;
mod generate;
mod integration;
mod mixed_fleet;
mod stats;
mod support;
