//! Request-path latency through a real Envoy: the `ratelimit` filter (a `ShouldRateLimit`
//! call to Tollgate on every request) against the `rate_limit_quota` filter (RLQS: Envoy
//! decides locally from Tollgate's assignment; reports go out every few seconds, off the
//! request path). Both on the repository's example configurations, in front of one
//! upstream, with limits no request reaches, so that every answer is the upstream's.
//!
//! Run: `cargo bench --bench envoy_latency -- [--seconds 10] [--rounds 3]`.

use std::error::Error;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use tollgate_testkit::envoy::Envoy;
use tollgate_testkit::envoy::config::{Params, render, render_rlqs};
use tollgate_testkit::envoy::upstream::Upstream;
use tollgate_testkit::http;
use tollgate_testkit::load::percentile;
use tollgate_testkit::tollgate::Serve;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const RLS_ENVOY_YAML: &str = include_str!("../examples/envoy/envoy.yaml");
const RLQS_ENVOY_YAML: &str = include_str!("../examples/envoy/rlqs/envoy.yaml");

/// The examples' descriptors, each with a limit no run reaches.
const RULES: &str = "domain: edge
descriptors:
  - {key: remote_address, rate_limit: {unit: second, requests_per_unit: 1000000000}}
  - {key: path, rate_limit: {unit: second, requests_per_unit: 1000000000}}
  - {key: generic_key, value: edge, rate_limit: {unit: second, requests_per_unit: 1000000000}}
  - {key: tenant, rate_limit: {unit: second, requests_per_unit: 1000000000}}
";

#[derive(Parser, Debug)]
#[command(about = "Latency through Envoy: ShouldRateLimit per request against RLQS")]
struct Args {
    /// Measured seconds per filter per round.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3_600))]
    seconds: u64,
    /// Rounds, alternating the two Envoys.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    rounds: u32,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("envoy latency bench: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("envoy latency bench: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> Result<()> {
    let upstream = Upstream::start().await;
    let tollgate = Serve::rules(RULES).start();
    let params = Params {
        upstream: upstream.addr,
        ratelimit: tollgate.grpc_addr(),
        failure_mode_deny: true,
    };
    let rls = Envoy::start(&render(RLS_ENVOY_YAML, &params)).await;
    let rlqs = Envoy::start(&render_rlqs(
        RLQS_ENVOY_YAML,
        upstream.addr,
        tollgate.grpc_addr(),
    ))
    .await;
    // RLQS: the first request of a bucket subscribes; measure once it is assigned.
    drive(rlqs.listener, Duration::from_secs(2)).await?;
    let mut rows = Vec::new();
    for round in 1..=args.rounds {
        for (name, envoy) in [("ShouldRateLimit", &rls), ("RLQS", &rlqs)] {
            let mut took = drive(envoy.listener, Duration::from_secs(args.seconds)).await?;
            took.sort_unstable();
            let (p50, p99) = (percentile(&took, 0.5), percentile(&took, 0.99));
            println!(
                "round {round} {name:<15} requests={} p50_us={} p99_us={}",
                took.len(),
                p50.as_micros(),
                p99.as_micros()
            );
            rows.push((name, p50, p99));
        }
    }
    println!("\nmedian (min–max) over the rounds");
    for name in ["ShouldRateLimit", "RLQS"] {
        let of = |pick: fn(&(&str, Duration, Duration)) -> Duration| {
            let mut values: Vec<Duration> = rows.iter().filter(|r| r.0 == name).map(pick).collect();
            values.sort_unstable();
            let median = values[values.len() / 2];
            format!(
                "{} ({}–{})",
                median.as_micros(),
                values.first().map_or(0, Duration::as_micros),
                values.last().map_or(0, Duration::as_micros)
            )
        };
        println!("{name:<15} p50_us {}  p99_us {}", of(|r| r.1), of(|r| r.2));
    }
    Ok(())
}

/// Sends requests one after the other for `length`; each one's latency. Fails on any
/// answer but the upstream's 200.
async fn drive(listener: SocketAddr, length: Duration) -> Result<Vec<Duration>> {
    let end = Instant::now() + length;
    let mut took = Vec::new();
    while Instant::now() < end {
        let started = Instant::now();
        let response = http::get_with(listener, "/", &[("x-tenant", "acme")]).await;
        took.push(started.elapsed());
        if response.status != 200 {
            return Err(format!(
                "an answer {} instead of 200: {}",
                response.status, response.body
            )
            .into());
        }
    }
    Ok(took)
}
