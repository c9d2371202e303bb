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

/// mimalloc rather than the system allocator: a request's buffers are often freed on
/// another worker thread than the one that made them (a reply handed from the store's
/// connection to its request), where glibc's arenas contend on a lock. Measured: 11 % less
/// CPU per request on Redis, 6 % on the memory store (docs/BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
