//! The `tollgate` command: serve the rate-limit API, check rules, or ask a running server.

#![warn(unreachable_pub)]

mod admin;
mod client;
mod compat;
#[cfg(test)]
mod fuzz;
mod grpc;
mod json;
mod listen;
mod metrics;
mod proto;
mod reload;
mod rlqs;
mod rls;
mod rules_status;
mod server;
mod settings;
mod tls;
mod watch;
mod xds;

use std::process::ExitCode;

use clap::Parser;
use tollgate_core::Rules;

use crate::settings::{Cli, Command, LogArgs, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { path, rules } => match load_now(&path, &rules) {
            Ok(_) => {
                println!("ok");
                ExitCode::SUCCESS
            }
            Err(errors) => {
                eprintln!("{errors}");
                ExitCode::FAILURE
            }
        },
        Command::Client(args) => match runtime().and_then(|rt| rt.block_on(client::run(args))) {
            Ok(false) => ExitCode::SUCCESS,
            Ok(true) => ExitCode::from(2),
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => match serve(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Loads the rules at `path` as `settings` want them, on this thread.
fn load_now(
    path: &std::path::Path,
    settings: &settings::RuleArgs,
) -> Result<Rules, tollgate_core::ConfigErrors> {
    let mut builder = settings.builder();
    builder.add_path(path);
    builder.finish()
}

fn serve(args: settings::ServeArgs) -> anyhow::Result<()> {
    // Server, Redis and xDS TLS use rustls; ring is its one crypto provider. Installing can only
    // fail if one is installed already, which is as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    init_logging(&args.log)?;
    runtime()?.block_on(server::run(args))
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Runtime::new().map_err(|e| anyhow::anyhow!("cannot start the runtime: {e}"))
}

fn init_logging(log: &LogArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&log.log_level)
        .map_err(|e| anyhow::anyhow!("invalid LOG_LEVEL '{}': {e}", log.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match log.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    Ok(())
}
