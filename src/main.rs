//! The `tollgate` command.

use std::process::ExitCode;

use clap::Parser;
use tollgate::settings::{Cli, Command, LogArgs, LogFormat};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { path, rules } => {
            match tollgate::config::load(&path, rules.defaults(), &Default::default()) {
                Ok(_) => {
                    println!("ok");
                    ExitCode::SUCCESS
                }
                Err(errors) => {
                    eprintln!("{errors}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Client(args) => match runtime().map(|rt| rt.block_on(tollgate::client::run(args)))
        {
            Ok(Ok(false)) => ExitCode::SUCCESS,
            Ok(Ok(true)) => ExitCode::from(2),
            Ok(Err(e)) | Err(e) => {
                eprintln!("tollgate: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => {
            // Redis TLS uses rustls; ring is its one crypto provider here. Installing can only
            // fail if one is installed already, which is as good.
            let _ = rustls::crypto::ring::default_provider().install_default();
            if let Err(e) = init_logging(&args.log) {
                eprintln!("tollgate: {e}");
                return ExitCode::FAILURE;
            }
            let runtime = match runtime() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("tollgate: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(tollgate::server::run(*args)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tollgate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Runtime::new().map_err(|e| format!("cannot start the runtime: {e}"))
}

fn init_logging(log: &LogArgs) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_new(&log.log_level)
        .map_err(|e| format!("invalid LOG_LEVEL '{}': {e}", log.log_level))?;
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
