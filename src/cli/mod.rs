//! The command line's commands: `serve`, `check-config` and `migrate` here, and those that
//! ask a running server (`client`, `explain`, `reset`, `override`, `top`).

pub(crate) mod admin_client;
mod admin_tls;
pub(crate) mod client;
mod overrides;
mod serve;
mod visible;

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
        Command::Client(args) => match on_runtime(client::run(args)) {
            Ok(false) => ExitCode::SUCCESS,
            Ok(true) => ExitCode::from(2),
            Err(e) => failed(&e),
        },
        Command::Explain {
            request,
            admin_token,
        } => done(on_runtime(admin_client::explain(
            request,
            admin_token.as_deref(),
        ))),
        Command::Reset {
            request,
            admin_token,
        } => done(on_runtime(admin_client::reset(request, &admin_token))),
        Command::Top(args) => done(on_runtime(admin_client::top(args))),
        Command::Override(args) => done(on_runtime(overrides::run(args))),
        Command::Migrate(args) => done(on_runtime(migrate(args))),
        Command::Serve(args) => done(serve::serve(*args)),
    }
}

/// `command` run to its end on a runtime of its own (a command that asks a server).
fn on_runtime<T>(command: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    runtime(None)?.block_on(command)
}

/// The exit code of a command that ended as `result`, its error printed.
fn done(result: anyhow::Result<()>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => failed(&e),
    }
}

/// Prints `e`; the exit code of a command that failed.
fn failed(e: &anyhow::Error) -> ExitCode {
    eprintln!("tollgate: {e:#}");
    ExitCode::FAILURE
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
