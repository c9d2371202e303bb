//! The `tollgate` command: serve the rate-limit API, check rules, or ask a running server.

use std::process::ExitCode;

use clap::Parser;
use tollgate::Cli;

fn main() -> ExitCode {
    // With no arguments at all, serve: the reference's image contract (`/bin/ratelimit`,
    // configured by the environment alone), which Envoy Gateway and most manifests use.
    let mut args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.len() == 1 {
        args.push("serve".into());
    }
    tollgate::run_command(Cli::parse_from(args))
}
