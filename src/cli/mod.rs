//! The command line's commands: `serve`, `check-config` and `migrate` here, and those that
//! ask a running server (`client`, `explain`, `reset`, `override`, `top`).

pub(crate) mod admin_client;
mod admin_tls;
pub(crate) mod client;
mod overrides;
mod serve;

use std::process::ExitCode;

use tollgate_core::Rules;

use crate::config::settings::{self, Cli, Command};

use self::serve::runtime;

/// Runs the command `cli` names; the process's exit code.
pub fn run(cli: Cli) -> ExitCode {
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
        Command::Client(args) => {
            match runtime(None).and_then(|rt| rt.block_on(client::run(args))) {
                Ok(false) => ExitCode::SUCCESS,
                Ok(true) => ExitCode::from(2),
                Err(e) => {
                    eprintln!("tollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Explain(args) => {
            match runtime(None).and_then(|rt| rt.block_on(admin_client::explain(args))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Reset {
            request,
            admin_token,
        } => match runtime(None)
            .and_then(|rt| rt.block_on(admin_client::reset(request, &admin_token)))
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Top(args) => {
            match runtime(None).and_then(|rt| rt.block_on(admin_client::top(args))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Override(args) => {
            match runtime(None).and_then(|rt| rt.block_on(overrides::run(args))) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("tollgate: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Migrate(args) => match runtime(None).and_then(|rt| rt.block_on(migrate(args))) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
        Command::Serve(args) => match serve::serve(*args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("tollgate: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// `tollgate migrate`: the PostgreSQL schema brought up to date.
async fn migrate(args: settings::PostgresArgs) -> anyhow::Result<()> {
    use tollgate_core::store::postgres::{self, PgTarget, SCHEMA_VERSION};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let url = args
        .postgres_url
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("migrate needs POSTGRES_URL (--postgres-url)"))?;
    let target = PgTarget::parse(url).map_err(anyhow::Error::msg)?;
    let found = postgres::migrate(&target, args.postgres_unlogged)
        .await
        .map_err(anyhow::Error::msg)?;
    match found == SCHEMA_VERSION {
        true => println!("schema version {SCHEMA_VERSION}: up to date"),
        false => println!("schema version {SCHEMA_VERSION}: migrated from {found}"),
    }
    Ok(())
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
