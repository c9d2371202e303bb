//! Tollgate, the server, as a library: what the `tollgate` command runs, and what tests
//! start in-process.
//!
//! [`run`] serves until its shutdown future completes, then drains. [`Config`] is
//! `serve`'s settings, checked once; [`Listeners`] are the settings' addresses or
//! listeners bound already (port 0 in tests). A process passes [`terminated`] (SIGTERM
//! or Ctrl-C) as the shutdown; [`run_command`] runs any subcommand of [`Cli`].

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
