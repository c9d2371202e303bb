//! Accuracy benchmark: how closely a limit holds under a steady overload spread over
//! several Tollgates sharing one store, measured from the answers the client saw.
//!
//! Each round sends `factor × limit` requests per window at a steady pace for `windows`
//! windows, round-robin over the instances, on a counter of its own, starting at an
//! epoch-aligned window boundary (the first window is the overload's onset). Reported:
//! the most admissions in any window's length at any alignment (the onset included),
//! admissions per aligned window, the long-run average per window and the utilisation of
//! the limit. See `tollgate_testkit::accuracy` for how admissions are attributed.
//!
//! Run: `cargo bench --bench accuracy -- [OPTIONS]` (`--help` lists them).

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use tollgate_testkit::accuracy::steady_overload;
use tollgate_testkit::grpc::Rls;
use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const DOMAIN: &str = "accuracy";

#[derive(Parser, Debug)]
#[command(about = "Accuracy benchmark: a limit under steady overload over shared instances")]
struct Args {
    /// Where the instances count.
    #[arg(long, value_enum, default_value_t = Backing::Redis)]
    store: Backing,
    /// Tollgate instances sharing the store (1 for the memory store).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=16))]
    instances: u32,
    /// Requests admitted per window.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    limit: u64,
    /// The window, in seconds.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=3_600))]
    window_seconds: u32,
    /// Windows per round.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=1_000))]
    windows: u32,
    /// Requests sent per window, as a multiple of the limit.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    factor: u64,
    /// Rounds, each on a fresh counter.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Extra argument for `tollgate serve` (repeatable), e.g. `--tollgate-arg=--precision=20`.
    #[arg(long = "tollgate-arg", allow_hyphen_values = true)]
    tollgate_args: Vec<String>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Backing {
    Memory,
    Redis,
    Postgres,
}

/// The store's server, alive as long as the run.
enum Store {
    Memory,
    Redis(RedisServer),
    Postgres(PostgresServer),
}

impl Store {
    fn start(backing: Backing) -> Self {
        match backing {
            Backing::Memory => Self::Memory,
            Backing::Redis => Self::Redis(RedisServer::start()),
            Backing::Postgres => Self::Postgres(PostgresServer::start()),
        }
    }

    fn args(&self) -> Vec<String> {
        let args: &[&str] = match self {
            Self::Memory => return Vec::new(),
            Self::Redis(redis) => &["--redis-url", &redis.url()],
            Self::Postgres(postgres) => &["--postgres-url", &postgres.url()],
        };
        args.iter().map(|s| (*s).to_owned()).collect()
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("accuracy bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<()> {
    if args.store == Backing::Memory && args.instances > 1 {
        return Err("memory-store instances share nothing: use --instances 1".into());
    }
    let store = Store::start(args.store);
    let rules = format!(
        "domain: {DOMAIN}\ndescriptors:\n  - key: acc\n    rate_limit: {{unit: second, \
         unit_multiplier: {}, requests_per_unit: {}}}\n",
        args.window_seconds, args.limit
    );
    let dir = tollgate::ConfigDir::with_file("rules.yaml", &rules);
    let binary = tollgate::binary()?;
    let mut servers = Vec::new();
    for _ in 0..args.instances {
        let serve = tollgate::Serve::with_binary(&binary, &dir.file("rules.yaml"))
            .args(store.args())
            .args(["--store-timeout", "1s", "--on-store-error", "error"])
            .args(&args.tollgate_args);
        servers.push(serve.start());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let window = Duration::from_secs(u64::from(args.window_seconds));
    println!(
        "{} instance(s) on {:?}, limit {} per {window:?}, {}× overload, {} windows per round",
        args.instances, args.store, args.limit, args.factor, args.windows
    );
    let mut rows = Vec::new();
    for round in 1..=args.rounds {
        let run = runtime.block_on(async {
            let mut clients: Vec<Rls> = Vec::new();
            for server in &servers {
                clients.push(server.client().await);
            }
            let value = format!("round-{round}");
            let entries = [("acc", value.as_str())];
            steady_overload(
                &clients,
                DOMAIN,
                &entries,
                args.limit,
                window,
                args.windows,
                args.factor,
            )
            .await
        });
        let failures = run.failures().len();
        if failures > 0 {
            return Err(
                format!("round {round}: {failures} answers neither OK nor OVER_LIMIT").into(),
            );
        }
        let per_window: Vec<u64> = run.per_window().iter().map(|w| w.certain).collect();
        let row = (
            run.worst_window(),
            run.long_run_average(),
            run.utilisation(),
        );
        println!(
            "round {round} worst_any_alignment={} ({:+.2} %) average={:.1} ({:+.2} %) \
             utilisation={:.3} per_aligned_window={per_window:?}",
            row.0,
            over(row.0 as f64, args.limit),
            row.1,
            over(row.1, args.limit),
            row.2,
        );
        rows.push(row);
    }
    let worst = rows.iter().map(|r| r.0).max().unwrap_or(0);
    let averages: Vec<f64> = rows.iter().map(|r| r.1).collect();
    let mean = averages.iter().sum::<f64>() / averages.len().max(1) as f64;
    println!(
        "\nover {} rounds: worst window at any alignment {worst} ({:+.2} %), long-run \
         average {mean:.1} per window ({:+.2} %), utilisation {:.3}",
        rows.len(),
        over(worst as f64, args.limit),
        over(mean, args.limit),
        mean / args.limit as f64
    );
    Ok(())
}

/// How far `count` is above `limit`, in percent.
fn over(count: f64, limit: u64) -> f64 {
    (count / limit as f64 - 1.0) * 100.0
}
