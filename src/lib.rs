//! Tollgate, the server, as a library: what the `tollgate` command runs, and what tests
//! start in-process.

#![warn(unreachable_pub)]

mod api;
mod app;
mod cli;
mod config;
#[cfg(test)]
mod fuzz;
mod net;
mod ops;
mod rlqs;
mod server;

pub use crate::cli::run as run_command;
pub use crate::config::settings::Cli;
pub use crate::server::{Config, Listeners, run, terminated};
