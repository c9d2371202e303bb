//! Overrides at scale: `--overrides` of them (default 100,000, the default
//! `OVERRIDES_MAX`) in Redis with two Tollgate instances on it, then in a memory store
//! with and without `OVERRIDES_FILE`.
//!
//! Reported: the CPU Redis and each instance spend idle with them all in force, over
//! `--idle-seconds` (default 330, so that the window holds each instance's whole read of
//! the set, every 5 minutes), beside the same with none (at most 60 s); the latency of `PUT /overrides` replacing one of them
//! (`--puts` in a row, p50, p99 and the most), from an HTTP client on loopback, a new
//! connection each; `tollgate override list` of them all; and on the memory store the
//! same PUT latency with and without the file (filled by PUTs without it; with it, read
//! from a log of the same overrides written before the start).
//!
//! Run: `cargo bench --bench overrides -- [--overrides N] [--idle-seconds S] [--puts P]`.

use std::error::Error;
use std::path::Path;
use std::time::{Duration, Instant};

use clap::Parser;
use tollgate_testkit::admin::{TOKEN, override_body};
use tollgate_testkit::cpu;
use tollgate_testkit::http::{self, Method};
use tollgate_testkit::load::percentile;
use tollgate_testkit::process;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{self, Listening, Serve, Server};
use tollgate_testkit::wait;

type Result<T, E = Box<dyn Error + Send + Sync>> = std::result::Result<T, E>;

const RULES: &str = "domain: api\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 2}\n";

/// The longest idle window measured before the overrides are set, for comparison.
const BASELINE_SECONDS: u64 = 60;

#[derive(Parser, Debug)]
#[command(about = "Overrides at scale: idle CPU, PUT latency, listing")]
struct Args {
    /// Overrides stored (and OVERRIDES_MAX).
    #[arg(long, default_value_t = 100_000)]
    overrides: usize,
    /// Seconds of the idle window.
    #[arg(long, default_value_t = 330)]
    idle_seconds: u64,
    /// PUTs timed, one after another.
    #[arg(long, default_value_t = 1_000)]
    puts: usize,
    /// PUTs in flight while filling.
    #[arg(long, default_value_t = 8)]
    fill_concurrency: usize,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(run(&args))
}

async fn run(args: &Args) -> Result<()> {
    let max = args.overrides.to_string();
    let redis = RedisServer::start();
    let instance = async || {
        Serve::rules(RULES)
            .redis("single", &redis.url())
            .env("ADMIN_TOKEN", TOKEN)
            .env("OVERRIDES_MAX", &max)
            .start_connected()
            .await
    };
    let (a, b) = (instance().await, instance().await);
    let redis_pid = redis.pid().ok_or("redis-server is not running")?;
    let baseline = args.idle_seconds.min(BASELINE_SECONDS);
    let idle = idle_cpu(&[redis_pid, a.pid(), b.pid()], baseline).await?;
    println!(
        "redis: idle with no overrides, over {baseline} s: redis-server {:.2} %, instance a {:.2} %, instance b {:.2} % of a core",
        idle[0], idle[1], idle[2]
    );
    let filled = Instant::now();
    fill(&a, args.overrides, args.fill_concurrency).await?;
    let fill_took = filled.elapsed();
    for server in [&a, &b] {
        await_count(server, args.overrides).await;
    }
    println!(
        "redis: {} overrides set through one instance in {:.1} s ({:.0} a second, {} at once)",
        args.overrides,
        fill_took.as_secs_f64(),
        args.overrides as f64 / fill_took.as_secs_f64(),
        args.fill_concurrency
    );
    let idle = idle_cpu(&[redis_pid, a.pid(), b.pid()], args.idle_seconds).await?;
    println!(
        "redis: idle with them, over {} s: redis-server {:.2} %, instance a {:.2} %, instance b {:.2} % of a core",
        args.idle_seconds, idle[0], idle[1], idle[2]
    );
    let (p50, p99, most) = put_latency(&a, args.overrides, args.puts).await?;
    println!(
        "redis: PUT replacing one of {}: p50 {p50:.2} ms, p99 {p99:.2} ms, most {most:.2} ms ({} PUTs)",
        args.overrides, args.puts
    );
    let (lines, took) = cli_list(&b)?;
    println!(
        "redis: `tollgate override list` of {} overrides: {lines} lines in {:.2} s",
        args.overrides,
        took.as_secs_f64()
    );
    drop((a, b));

    let memory = Serve::rules(RULES)
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_MAX", &max)
        .start();
    let filled = Instant::now();
    fill(&memory, args.overrides, args.fill_concurrency).await?;
    let fill_took = filled.elapsed();
    let (p50, p99, most) = put_latency(&memory, args.overrides, args.puts).await?;
    println!(
        "memory, no file: filled in {:.1} s; PUT replacing one of {}: p50 {p50:.2} ms, p99 {p99:.2} ms, most {most:.2} ms",
        fill_took.as_secs_f64(),
        args.overrides
    );
    drop(memory);

    let dir = tempfile::tempdir()?;
    let file = dir.path().join("overrides.log");
    write_log(&file, args.overrides)?;
    let started = Instant::now();
    let kept = Serve::rules(RULES)
        .env("ADMIN_TOKEN", TOKEN)
        .env("OVERRIDES_MAX", &max)
        .env("OVERRIDES_FILE", &file)
        .start();
    await_count(&kept, args.overrides).await;
    let read_took = started.elapsed();
    let (p50, p99, most) = put_latency(&kept, args.overrides, args.puts).await?;
    println!(
        "memory, OVERRIDES_FILE: {} read at start in {:.1} s; PUT replacing one: p50 {p50:.2} ms, p99 {p99:.2} ms, most {most:.2} ms; file {} KiB",
        args.overrides,
        read_took.as_secs_f64(),
        std::fs::metadata(&file)?.len() / 1024
    );
    Ok(())
}

/// The body of the override of tenant `i`.
fn body(i: usize, requests_per_unit: usize) -> String {
    override_body(
        "api",
        ("tenant", &format!("t{i:06}")),
        &requests_per_unit.to_string(),
        "minute",
    )
}

async fn put(server: &Listening, body: &str) -> Result<()> {
    let headers = [
        ("content-type", "application/json"),
        ("authorization", &format!("Bearer {TOKEN}")),
    ];
    let answer = http::send(
        server.http_addr(),
        Method::PUT,
        "/overrides",
        &headers,
        body,
    )
    .await?;
    match answer.status {
        200 => Ok(()),
        status => Err(format!("PUT answered {status}: {}", answer.body).into()),
    }
}

/// Sets `count` overrides through `server`, `concurrency` at once.
async fn fill(server: &Listening, count: usize, concurrency: usize) -> Result<()> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let worker = async || -> Result<()> {
        loop {
            let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= count {
                return Ok(());
            }
            put(server, &body(i, 5)).await?;
        }
    };
    let workers: Vec<_> = (0..concurrency).map(|_| worker()).collect();
    for done in futures_util::future::join_all(workers).await {
        done?;
    }
    Ok(())
}

/// Waits until `server` has `count` overrides in force.
async fn await_count(server: &Server, count: usize) {
    let what = format!("{count} overrides in force");
    wait::until_async(&what, Duration::from_secs(600), async || {
        match server.metric("tollgate_overrides").await {
            Some(n) if n as usize == count => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
}

/// The share of a core each of `pids` spends over `seconds`, in per cent.
async fn idle_cpu(pids: &[u32], seconds: u64) -> Result<Vec<f64>> {
    let before: Vec<u64> = pids
        .iter()
        .map(|&p| cpu::ticks(p))
        .collect::<Result<_, _>>()?;
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let after: Vec<u64> = pids
        .iter()
        .map(|&p| cpu::ticks(p))
        .collect::<Result<_, _>>()?;
    let per_second = cpu::ticks_per_second() as f64;
    Ok(before
        .iter()
        .zip(&after)
        .map(|(b, a)| (a - b) as f64 / per_second / seconds as f64 * 100.0)
        .collect())
}

/// p50, p99 and the most, in ms, of `puts` PUTs in a row, each replacing one of `count`.
async fn put_latency(server: &Listening, count: usize, puts: usize) -> Result<(f64, f64, f64)> {
    let mut took = Vec::with_capacity(puts);
    for n in 0..puts {
        let body = body(n * 7919 % count, 6 + n % 5);
        let start = Instant::now();
        put(server, &body).await?;
        took.push(start.elapsed());
    }
    took.sort_unstable();
    let ms = |d: Duration| d.as_secs_f64() * 1_000.0;
    Ok((
        ms(percentile(&took, 0.5)),
        ms(percentile(&took, 0.99)),
        ms(took.last().copied().unwrap_or_default()),
    ))
}

/// `tollgate override list` against `server`: its lines and how long it took.
fn cli_list(server: &Listening) -> Result<(usize, Duration)> {
    let mut cmd = tollgate::command();
    cmd.args([
        "override",
        "--http-addr",
        &server.http_addr().to_string(),
        "list",
    ])
    .env("ADMIN_TOKEN", TOKEN);
    let start = Instant::now();
    let done = process::run("tollgate override list", cmd, Duration::from_secs(600))?;
    if !done.status.success() {
        return Err(format!("override list failed: {}", done.stderr).into());
    }
    Ok((done.stdout.lines().count(), start.elapsed()))
}

/// Writes `count` overrides as `OVERRIDES_FILE`'s log holds them.
fn write_log(path: &Path, count: usize) -> Result<()> {
    let mut text = String::new();
    for i in 0..count {
        text.push_str(&format!("{{\"set\":{}}}\n", body(i, 5)));
    }
    std::fs::write(path, text)?;
    Ok(())
}
