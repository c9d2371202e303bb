//! Load benchmark: Tollgate versus a do-nothing rate-limit service, and with `--reference`
//! versus the reference service (envoyproxy/ratelimit, as `scripts/install-test-deps.sh`
//! installs it) on the same Redis.
//!
//! The servers run as separate processes (the no-op one is this binary re-run
//! with `--noop-server`), one after the other so they never compete for CPU.
//! Each gets the same closed-loop gRPC load, sent by h2 directly (`H2Rls`;
//! `--tonic-client` sends it through tonic's `Channel` instead, at about twice the
//! client's CPU per request). We report throughput, latency percentiles, error /
//! over-limit counts and the server's CPU time per request, read from `/proc/PID/stat`,
//! beside the client's own (this process shares the cores, so its cost per request
//! bounds every server's throughput).
//!
//! A hot counter (`--keys 1`) over `--instances` Tollgates on one shared store, beside one
//! Tollgate on the memory store (`--beside-memory`), shows what leases save: the store's
//! calls and CPU per admission. With `--window-seconds` and a limit below the offered
//! load, the run also reports admissions per epoch-aligned window. `--beside-valkey`
//! measures Tollgate on a Valkey server in every round beside the one on Redis.
//!
//! Run: `cargo bench --bench load -- [OPTIONS]` (`--help` lists them).

use std::collections::BTreeMap;
use std::error::Error;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Parser, ValueEnum};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_server::{
    RateLimitService, RateLimitServiceServer,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;
use tollgate_testkit::accuracy::{OverloadRun, epoch_ns};
use tollgate_testkit::cpu::{
    ticks as cpu_ticks, ticks_per_second as clock_ticks_per_second, tree_ticks as tree_cpu_ticks,
};
use tollgate_testkit::grpc::Rls;
use tollgate_testkit::h2_rls::H2Rls;
use tollgate_testkit::load::{Answer, Call, closed_loop, open_loop, percentile};
use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::process::Process;
use tollgate_testkit::redis::{Engine, RedisServer};
use tollgate_testkit::reference::{self, Reference, RuntimeRoot};
use tollgate_testkit::tollgate;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};

type BoxError = Box<dyn Error + Send + Sync>;
type Result<T, E = BoxError> = std::result::Result<T, E>;

/// How long a server may take to print its "listening" line.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);
/// The start of the no-op server's readiness line.
const NOOP_READY: &str = "noop listening ";
/// Number of distinct over-limit values (`hot-0..hot-9`).
const HOT_VALUES: u64 = 10;

#[derive(Parser, Debug)]
#[command(about = "Load benchmark: Tollgate vs a no-op rate-limit service")]
struct Args {
    /// Path to the tollgate binary [default: the one built with this benchmark].
    #[arg(long)]
    tollgate: Option<PathBuf>,
    /// Extra argument for `tollgate serve` (repeatable).
    #[arg(long = "tollgate-arg", allow_hyphen_values = true)]
    tollgate_args: Vec<String>,
    /// requests_per_unit (per second, or per `--window-seconds`) of the `user` rule.
    #[arg(long, default_value_t = 1_000_000_000)]
    limit: u32,
    /// The `user` rule's window in seconds (`unit_multiplier`); given, the run reports
    /// admissions per epoch-aligned window and fails if one holds more than the limit.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=3_600))]
    window_seconds: Option<u32>,
    /// Tollgate processes on the shared store, the connections spread over them in turn.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=16))]
    instances: u64,
    /// Measure one Tollgate on the memory store in every round too, as `memory`, under
    /// the same load: the mark for Tollgates on a shared store.
    #[arg(long)]
    beside_memory: bool,
    /// Make the `user` rule a `detailed_metric` one (a series per request value, up to
    /// DETAILED_METRIC_LIMIT), to measure what recording costs.
    #[arg(long)]
    detailed_metric: bool,
    /// Fraction (0..=1) of requests sent to the over-limit `hot` keys.
    #[arg(long, default_value_t = 0.0, value_parser = parse_fraction)]
    over_limit_fraction: f64,
    /// Number of distinct `user` values to cycle over.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..))]
    keys: u64,
    /// Number of HTTP/2 connections.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..))]
    connections: u64,
    /// Drive the load through tonic's client (a `Channel` per connection), as the
    /// benchmark did before wave 11, instead of its own leaner one. Tonic's costs about
    /// twice the CPU per request, taken from the cores the servers share with it.
    #[arg(long)]
    tonic_client: bool,
    /// Open loop: send this many requests per second in all, whatever the answers take,
    /// and count latency from when each was due (e.g. half of the memory store's
    /// closed-loop maximum, for the p99 at half load); without it, closed loop.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    rate: Option<u32>,
    /// Number of concurrent request loops, spread over the connections.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    concurrency: u64,
    /// Measured seconds (at most a day, so deadlines cannot overflow).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    duration: u64,
    /// Unmeasured warm-up seconds before the measured interval.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    warmup: u64,
    /// Which servers to benchmark.
    #[arg(long, value_enum, default_value_t = Only::Both)]
    only: Only,
    /// Rounds; each measures every server once, in turn, so that a disturbance of the
    /// machine shows as spread rather than as a difference between servers.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    rounds: u64,
    /// Count in a redis-server that the benchmark starts (on a free loopback port), and
    /// report its CPU per request beside Tollgate's.
    #[arg(long, conflicts_with = "postgres")]
    redis: bool,
    /// Measure Tollgate counting in a Valkey server too (the pinned release the test
    /// suites run), in every round, as `valkey`: the same load and settings as on the
    /// redis-server, each on its own server.
    #[arg(long, requires = "redis")]
    beside_valkey: bool,
    /// Count in a PostgreSQL server that the benchmark starts (on a free loopback port),
    /// and report its CPU per request (the postmaster and its backends) beside Tollgate's.
    #[arg(long)]
    postgres: bool,
    /// Another tollgate binary (an earlier build, say) measured in every round too, as
    /// `baseline`.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Measure the reference service in every round too, as `reference`, on the same
    /// rules and Redis (needs `--redis`): the binary `scripts/install-test-deps.sh`
    /// installed, or `$REFERENCE_BIN`. It runs with its defaults, statsd off.
    #[arg(long, requires = "redis")]
    reference: bool,
    /// Extra environment variable for the reference (repeatable), e.g.
    /// `LOCAL_CACHE_SIZE_IN_BYTES=1048576`.
    #[arg(long = "reference-env", value_parser = parse_env, requires = "reference")]
    reference_env: Vec<(String, String)>,
    /// Internal: run the no-op server instead of the benchmark.
    #[arg(long, hide = true)]
    noop_server: bool,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// Which servers to benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Only {
    Tollgate,
    Noop,
    Both,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .ok_or_else(|| format!("{s:?} is not NAME=VALUE"))
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    let f: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.0..=1.0).contains(&f) {
        Ok(f)
    } else {
        Err(format!("{f} is not within 0.0..=1.0"))
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let outcome = if args.noop_server {
        run_noop_server()
    } else {
        run_bench(&args)
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("load bench: {e}");
            ExitCode::FAILURE
        }
    }
}

// ---------------------------------------------------------------------------
// No-op server (child process)
// ---------------------------------------------------------------------------

/// Answers every request OK without looking at it, each descriptor's status shaped as
/// Tollgate's (a limit, what remains, when it resets): the floor of what any tonic-based
/// rate-limit service can cost.
struct NoopService;

#[tonic::async_trait]
impl RateLimitService for NoopService {
    async fn should_rate_limit(
        &self,
        request: tonic::Request<RateLimitRequest>,
    ) -> Result<tonic::Response<RateLimitResponse>, tonic::Status> {
        let ok = DescriptorStatus {
            code: Code::Ok as i32,
            current_limit: Some(RateLimit {
                name: String::new(),
                requests_per_unit: 1_000_000_000,
                unit: Unit::Second as i32,
            }),
            limit_remaining: 999_999_999,
            duration_until_reset: Some(ProtoDuration {
                seconds: 1,
                nanos: 0,
            }),
            ..Default::default()
        };
        let statuses = vec![ok; request.get_ref().descriptors.len()];
        Ok(tonic::Response::new(RateLimitResponse {
            overall_code: Code::Ok as i32,
            statuses,
            ..Default::default()
        }))
    }
}

fn run_noop_server() -> Result<()> {
    // Scheduled as Tollgate is (`runtime` in src/cli/serve.rs: no LIFO slot), so that the ceiling
    // gains what Tollgate gains from it.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    #[cfg(tokio_unstable)]
    builder.disable_lifo_slot();
    let runtime = builder.build()?;
    runtime.block_on(async {
        let incoming =
            TcpIncoming::bind(SocketAddr::from(([127, 0, 0, 1], 0)))?.with_nodelay(Some(true));
        let addr = incoming.local_addr()?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{NOOP_READY}grpc={addr}")?;
        stdout.flush()?;
        drop(stdout);
        Server::builder()
            .add_service(RateLimitServiceServer::new(NoopService))
            .serve_with_incoming(incoming)
            .await?;
        Ok(())
    })
}

// ---------------------------------------------------------------------------
// Server processes (parent side)
// ---------------------------------------------------------------------------

/// A server under load: the no-op one, Tollgate (one or more processes) or the
/// reference, all killed when dropped (and when this process dies: the testkit spawns
/// them so).
enum ServerProcess {
    Noop {
        process: Process,
        grpc_addr: SocketAddr,
    },
    Tollgate(Vec<tollgate::Server>),
    Reference {
        server: Reference,
        _rules: RuntimeRoot,
    },
}

impl ServerProcess {
    fn pids(&self) -> Vec<u32> {
        match self {
            ServerProcess::Noop { process, .. } => vec![process.pid()],
            ServerProcess::Tollgate(servers) => servers.iter().map(|s| s.pid()).collect(),
            ServerProcess::Reference { server, .. } => vec![server.pid()],
        }
    }

    fn grpc_addrs(&self) -> Vec<SocketAddr> {
        match self {
            ServerProcess::Noop { grpc_addr, .. } => vec![*grpc_addr],
            ServerProcess::Tollgate(servers) => servers.iter().map(|s| s.grpc_addr()).collect(),
            ServerProcess::Reference { server, .. } => vec![server.grpc],
        }
    }
}

fn start_noop() -> Result<ServerProcess> {
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg("--noop-server");
    let process = Process::start("noop server", cmd)?;
    let line = process
        .stdout()
        .wait_for(|l| l.starts_with(NOOP_READY), STARTUP_TIMEOUT)
        .map_err(|why| {
            format!(
                "noop server not ready ({why:?}); stderr:\n{}",
                process.stderr().text()
            )
        })?;
    let grpc_addr = parse_grpc_addr(&line)?;
    Ok(ServerProcess::Noop { process, grpc_addr })
}

/// The shared store a run counts in, if any.
enum SharedStore {
    None,
    Redis(RedisServer),
    Postgres(PostgresServer),
}

impl SharedStore {
    fn start(args: &Args) -> Self {
        if args.redis {
            Self::Redis(RedisServer::start_engine(Engine::Redis))
        } else if args.postgres {
            Self::Postgres(PostgresServer::start())
        } else {
            Self::None
        }
    }

    /// Tollgate's arguments for it.
    fn tollgate_args(&self) -> Vec<String> {
        match self {
            Self::None => Vec::new(),
            Self::Redis(redis) => vec!["--redis-url".into(), redis.url()],
            Self::Postgres(postgres) => vec!["--postgres-url".into(), postgres.url()],
        }
    }

    /// The process whose CPU (with its children's) is the store's.
    fn pid(&self) -> Option<u32> {
        match self {
            Self::None => None,
            Self::Redis(redis) => redis.pid(),
            Self::Postgres(postgres) => postgres.pid(),
        }
    }

    /// Scripts Redis has run so far (EVALSHA and EVAL, from INFO commandstats): Tollgate's
    /// calls, each one round trip; None for other stores.
    fn calls(&self) -> Option<u64> {
        match self {
            Self::Redis(redis) => Some(redis.commandstats().scripts()),
            Self::None | Self::Postgres(_) => None,
        }
    }
}

/// `instances` Tollgates counting in `store`, started at once.
fn start_tollgate(
    binary: &Path,
    args: &Args,
    store: &SharedStore,
    instances: u64,
) -> Result<ServerProcess> {
    if !binary.is_file() {
        return Err(format!(
            "tollgate binary not found at {} (run `cargo build --release` or pass --tollgate)",
            binary.display()
        )
        .into());
    }
    let mut extra = args.tollgate_args.clone();
    extra.extend(store.tollgate_args());
    let starting = (0..instances)
        .map(|_| {
            let rules = tollgate::ConfigDir::with_file("rules.yaml", &rules_yaml(args));
            tollgate::Serve::with_binary(binary, &rules.file("rules.yaml"))
                .keep(rules)
                .args(&extra)
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let servers = starting
        .into_iter()
        .map(|s| {
            s.ready().map_err(|exit| {
                format!(
                    "tollgate exited ({}) before listening; stderr:\n{}",
                    exit.status, exit.stderr
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(ServerProcess::Tollgate(servers))
}

/// The reference on the same rules, counting in `redis`: its defaults, but no statsd
/// (there is no collector) and warnings only in its log (its default), plus
/// `--reference-env`.
async fn start_reference(args: &Args, redis: &RedisServer) -> Result<ServerProcess> {
    let installed = reference::installed()?;
    let rules = RuntimeRoot::new();
    rules.write("rules.yaml", &rules_yaml(args));
    let mut env = reference::plain_env(&redis.host_port(), &rules);
    env.extend(args.reference_env.iter().cloned());
    let server = Reference::try_start(installed, &env).await?;
    Ok(ServerProcess::Reference {
        server,
        _rules: rules,
    })
}

/// `user` gets the configured limit and window (and a series per value with
/// `--detailed-metric`); `hot` allows 1/s so hot traffic is almost always over limit.
fn rules_yaml(args: &Args) -> String {
    [
        "domain: bench".to_owned(),
        "descriptors:".to_owned(),
        "  - key: user".to_owned(),
        format!("    detailed_metric: {}", args.detailed_metric),
        match args.window_seconds {
            Some(seconds) => format!(
                "    rate_limit: {{unit: second, unit_multiplier: {seconds}, requests_per_unit: {}}}",
                args.limit
            ),
            None => format!(
                "    rate_limit: {{unit: second, requests_per_unit: {}}}",
                args.limit
            ),
        },
        "  - key: hot".to_owned(),
        "    rate_limit: {unit: second, requests_per_unit: 1}".to_owned(),
        String::new(),
    ]
    .join("\n")
}

/// Extracts the gRPC address from `noop listening grpc=127.0.0.1:1234`.
fn parse_grpc_addr(line: &str) -> Result<SocketAddr> {
    let addr = line
        .strip_prefix(NOOP_READY)
        .and_then(|rest| rest.strip_prefix("grpc="))
        .ok_or_else(|| format!("unexpected readiness line: {line:?}"))?;
    addr.parse()
        .map_err(|e| format!("bad grpc address {addr:?}: {e}").into())
}

// ---------------------------------------------------------------------------
// Load generation
// ---------------------------------------------------------------------------

/// What the request loops saw during the measured interval.
#[derive(Default)]
struct Stats {
    /// Latency of each OK / OVER_LIMIT answer, in microseconds, sorted.
    latencies_us: Vec<u32>,
    ok: u64,
    over_limit: u64,
    /// Errors by kind: gRPC error statuses (by code), and answers with an unexpected
    /// overall code or not [`Answer::well_formed`] (every descriptor here matches a
    /// rule), by the code they carry.
    errors: Errors,
}

/// Failed requests, counted by kind.
type Errors = BTreeMap<String, u64>;

/// How many requests failed, of any kind.
fn failed(errors: &Errors) -> u64 {
    errors.values().sum()
}

impl Stats {
    fn of(answers: &[Answer]) -> Self {
        let mut stats = Stats::default();
        for answer in answers {
            match answer.result {
                Ok(Code::Ok) if answer.well_formed => stats.ok += 1,
                Ok(Code::OverLimit) if answer.well_formed => stats.over_limit += 1,
                result => {
                    let kind = match result {
                        Err(code) => format!("{code:?}"),
                        Ok(code) => format!("malformed {code:?}"),
                    };
                    *stats.errors.entry(kind).or_default() += 1;
                    continue;
                }
            }
            let micros = u32::try_from(answer.took.as_micros()).unwrap_or(u32::MAX);
            stats.latencies_us.push(micros);
        }
        stats.latencies_us.sort_unstable();
        stats
    }
}

/// Load shape shared by every request loop.
#[derive(Clone, Copy)]
struct Workload {
    keys: u64,
    over_limit_fraction: f64,
    concurrency: u64,
}

/// What one server did during the measured interval.
struct Measurement {
    stats: Stats,
    cpu_us: f64,
    /// CPU time of the shared store behind it, if any.
    store_cpu_us: Option<f64>,
    /// CPU time of this process, the load's client: on a small machine it shares the
    /// cores with the server, so its cost bounds the throughput of both.
    client_cpu_us: f64,
    /// Calls the store ran (Redis only).
    store_calls: Option<u64>,
    /// The answers by epoch-aligned window, with `--window-seconds`.
    windows: Option<OverloadRun>,
    seconds: f64,
}

/// CPU ticks of all of `pids`.
fn total_cpu_ticks(pids: &[u32]) -> Result<u64> {
    pids.iter().map(|&pid| Ok(cpu_ticks(pid)?)).sum()
}

async fn measure(
    server: &ServerProcess,
    store: Option<&SharedStore>,
    args: &Args,
    ticks_per_s: u64,
) -> Result<Measurement> {
    let clients = Clients::connect(&server.grpc_addrs(), args).await?;
    let now = tokio::time::Instant::now();
    let wall_now = SystemTime::now();
    let measure_start = now + Duration::from_secs(args.warmup);
    let end = measure_start + Duration::from_secs(args.duration);
    let load = clients.drive(args, measure_start, end);

    let pids = server.pids();
    let store_pid = store.and_then(SharedStore::pid);
    let calls = || store.and_then(SharedStore::calls);
    tokio::time::sleep_until(measure_start).await;
    let cpu_before = total_cpu_ticks(&pids)?;
    let client_before = cpu_ticks(std::process::id())?;
    let store_before = store_pid.map(tree_cpu_ticks).transpose()?;
    let calls_before = calls();
    tokio::time::sleep_until(end).await;
    let cpu_after = total_cpu_ticks(&pids)?;
    let client_after = cpu_ticks(std::process::id())?;
    let store_after = store_pid.map(tree_cpu_ticks).transpose()?;
    let calls_after = calls();

    let answers = load.await?;
    let micros =
        |before: u64, after: u64| after.saturating_sub(before) as f64 * 1e6 / ticks_per_s as f64;
    let stats = Stats::of(&answers);
    let windows = args.window_seconds.map(|seconds| {
        let from = wall_now + Duration::from_secs(args.warmup);
        by_window(
            answers,
            from,
            Duration::from_secs(args.duration),
            seconds,
            args.limit,
        )
    });
    Ok(Measurement {
        stats,
        cpu_us: micros(cpu_before, cpu_after),
        store_cpu_us: store_before.zip(store_after).map(|(b, a)| micros(b, a)),
        client_cpu_us: micros(client_before, client_after),
        store_calls: calls_before
            .zip(calls_after)
            .map(|(b, a)| a.saturating_sub(b)),
        windows,
        seconds: args.duration as f64,
    })
}

/// The connections the load goes over, one client each, by the client `args` chose.
enum Clients {
    Tonic(Vec<Rls>),
    H2(Vec<H2Rls>),
}

impl Clients {
    /// `--connections` of them, over `addrs` in turn: each an HTTP/2 connection that
    /// the request loops given it multiplex over.
    async fn connect(addrs: &[SocketAddr], args: &Args) -> Result<Self> {
        if args.tonic_client {
            let channels = connect(addrs, args.connections).await?;
            return Ok(Self::Tonic(channels.into_iter().map(Rls::new).collect()));
        }
        let mut clients = Vec::new();
        for addr in addrs
            .iter()
            .cycle()
            .take(usize::try_from(args.connections)?)
        {
            clients.push(H2Rls::connect(*addr).await?);
        }
        Ok(Self::H2(clients))
    }

    /// The load of `args` from now until `end`: closed loop, or open loop at `--rate`;
    /// the answers of requests from `measure_start` on.
    fn drive(
        self,
        args: &Args,
        measure_start: tokio::time::Instant,
        end: tokio::time::Instant,
    ) -> tokio::task::JoinHandle<Vec<Answer>> {
        match self {
            Self::Tonic(clients) => drive(clients, args, measure_start, end),
            Self::H2(clients) => drive(clients, args, measure_start, end),
        }
    }
}

/// [`Clients::drive`] for one kind of client, `clients` one per connection.
fn drive<C: Call + Clone>(
    clients: Vec<C>,
    args: &Args,
    measure_start: tokio::time::Instant,
    end: tokio::time::Instant,
) -> tokio::task::JoinHandle<Vec<Answer>> {
    let work = Workload {
        keys: args.keys,
        over_limit_fraction: args.over_limit_fraction,
        concurrency: args.concurrency,
    };
    match args.rate {
        Some(rate) => {
            let mut keys = KeyPicker::new(
                0,
                Workload {
                    concurrency: 1,
                    ..work
                },
            );
            let next = move || keys.next_request();
            tokio::spawn(open_loop(clients, next, rate, measure_start, end))
        }
        None => {
            let callers = (0..args.concurrency)
                .map(|i| {
                    let client = clients[(i % args.connections) as usize].clone();
                    let mut keys = KeyPicker::new(i, work);
                    (client, move || keys.next_request())
                })
                .collect();
            tokio::spawn(closed_loop(callers, measure_start, end))
        }
    }
}

/// The answers of a measured interval from `from`, lasting `length`, by the whole
/// epoch-aligned windows of `seconds` inside it. A window must end a second before the
/// interval does, so that no answer of it is still in flight when the load stops.
fn by_window(
    mut answers: Vec<Answer>,
    from: SystemTime,
    length: Duration,
    seconds: u32,
    limit: u32,
) -> OverloadRun {
    let window = Duration::from_secs(u64::from(seconds));
    let window_ns = window.as_nanos();
    let start_ns = epoch_ns(from).div_ceil(window_ns) * window_ns;
    let last_end_ns = epoch_ns(from + length - Duration::from_secs(1));
    let windows = last_end_ns.saturating_sub(start_ns) / window_ns;
    let start_offset = u64::try_from(start_ns).unwrap_or(u64::MAX);
    answers.sort_by_key(|a| a.sent);
    OverloadRun {
        start: UNIX_EPOCH + Duration::from_nanos(start_offset),
        window,
        windows: u32::try_from(windows).unwrap_or(u32::MAX),
        limit: u64::from(limit),
        answers,
    }
}

/// `connections` Channels, over `addrs` in turn: each connects eagerly to a single HTTP/2
/// connection that the request loops on it multiplex over.
async fn connect(addrs: &[SocketAddr], connections: u64) -> Result<Vec<Channel>> {
    let mut channels = Vec::new();
    for addr in addrs.iter().cycle().take(usize::try_from(connections)?) {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))?.tcp_nodelay(true);
        channels.push(endpoint.connect().await?);
    }
    Ok(channels)
}

/// Chooses each request's descriptor. Loops stride by the concurrency so
/// together they cycle over all `user` keys; a tiny PRNG picks hot requests
/// so the same fraction hits both servers without a rand dependency.
struct KeyPicker {
    next_user: u64,
    stride: u64,
    keys: u64,
    over_limit_fraction: f64,
    rng: u64,
}

impl KeyPicker {
    fn new(index: u64, work: Workload) -> Self {
        Self {
            next_user: index % work.keys,
            stride: work.concurrency,
            keys: work.keys,
            over_limit_fraction: work.over_limit_fraction,
            rng: index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        }
    }

    fn next_request(&mut self) -> RateLimitRequest {
        let roll = self.next_random();
        let (key, value) = if unit_interval(roll) < self.over_limit_fraction {
            ("hot", format!("hot-{}", roll % HOT_VALUES))
        } else {
            let user = self.next_user;
            self.next_user = (user + self.stride) % self.keys;
            ("user", format!("u-{user}"))
        };
        RateLimitRequest {
            domain: "bench".to_owned(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.to_owned(),
                    value,
                }],
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    /// splitmix64: good enough to spread hot requests evenly.
    fn next_random(&mut self) -> u64 {
        self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Maps a random u64 to [0, 1) using its top 53 bits.
fn unit_interval(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

// ---------------------------------------------------------------------------
// Driver and report
// ---------------------------------------------------------------------------

/// One server in one round.
struct Row {
    name: &'static str,
    rps: f64,
    p50_us: u32,
    p99_us: u32,
    errors: Errors,
    over_limit: u64,
    cpu_us_per_req: f64,
    store_cpu_us_per_req: Option<f64>,
    client_cpu_us_per_req: f64,
    store_calls_per_req: Option<f64>,
    /// Admissions per whole aligned window and the share of the limit used over them.
    windows: Option<(Vec<u64>, f64)>,
}

fn run_bench(args: &Args) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let ticks_per_s = clock_ticks_per_second();
    let store = SharedStore::start(args);
    let memory = SharedStore::None;
    let valkey = match args.beside_valkey {
        true => SharedStore::Redis(RedisServer::start_engine(Engine::Valkey)),
        false => SharedStore::None,
    };
    let tollgate = match &args.tollgate {
        Some(path) => path.clone(),
        None => tollgate::binary()?,
    };
    let mut servers: Vec<&'static str> = Vec::new();
    if args.only != Only::Tollgate {
        servers.push("noop");
    }
    if args.only != Only::Noop {
        if args.beside_memory {
            servers.push("memory");
        }
        servers.push("tollgate");
        if args.beside_valkey {
            servers.push("valkey");
        }
        if args.baseline.is_some() {
            servers.push("baseline");
        }
        if args.reference {
            servers.push("reference");
        }
    }
    let mut rows = Vec::new();
    // One server at a time, so that none competes with another for CPU; in turn, round
    // after round, so that a busy moment of the machine hits one round, not one server.
    for round in 1..=args.rounds {
        // Every other round in reverse, so that no server always runs first, and each is
        // measured both before and after its neighbours.
        let order: Vec<&'static str> = match round % 2 {
            0 => servers.iter().rev().copied().collect(),
            _ => servers.clone(),
        };
        for &name in &order {
            let (server, behind) = match name {
                "noop" => (start_noop()?, None),
                "memory" => (start_tollgate(&tollgate, args, &memory, 1)?, None),
                "tollgate" => (
                    start_tollgate(&tollgate, args, &store, args.instances)?,
                    Some(&store),
                ),
                "valkey" => (
                    start_tollgate(&tollgate, args, &valkey, args.instances)?,
                    Some(&valkey),
                ),
                "reference" => {
                    let SharedStore::Redis(redis) = &store else {
                        return Err("--reference needs --redis".into());
                    };
                    (
                        runtime.block_on(start_reference(args, redis))?,
                        Some(&store),
                    )
                }
                _ => {
                    let binary = args.baseline.as_deref().ok_or("no baseline binary")?;
                    (
                        start_tollgate(binary, args, &store, args.instances)?,
                        Some(&store),
                    )
                }
            };
            let mut m = runtime.block_on(measure(&server, behind, args, ticks_per_s))?;
            if name == "reference" {
                // Its calls are not scripts: a count of scripts would read 0.
                m.store_calls = None;
            }
            let row = summarize(name, m);
            print_row(round, &row);
            check(&row, args)?;
            rows.push(row);
        }
    }
    print_summary(&servers, &rows);
    Ok(())
}

/// Fails the run on any error, on an aligned window admitting past the limit, and
/// otherwise on a denied share far from the one asked for: a fast wrong answer is not a
/// result.
fn check(row: &Row, args: &Args) -> Result<()> {
    if !row.errors.is_empty() {
        return Err(format!(
            "{}: {} requests failed {:?}",
            row.name,
            failed(&row.errors),
            row.errors
        )
        .into());
    }
    if let Some((per_window, _)) = &row.windows {
        let limit = u64::from(args.limit);
        return match per_window.iter().find(|&&admitted| admitted > limit) {
            Some(admitted) => {
                Err(format!("{}: {admitted} admitted in a window of {limit}", row.name).into())
            }
            None => Ok(()),
        };
    }
    let answered = (row.rps * args.duration as f64).max(1.0);
    let denied = row.over_limit as f64 / answered;
    if row.name != "noop" && (denied - args.over_limit_fraction).abs() > 0.05 {
        return Err(format!(
            "{}: {:.1} % denied, expected about {:.1} %",
            row.name,
            denied * 100.0,
            args.over_limit_fraction * 100.0
        )
        .into());
    }
    Ok(())
}

fn summarize(name: &'static str, m: Measurement) -> Row {
    let stats = m.stats;
    let answered = stats.ok + stats.over_limit;
    // The server spent CPU on failed requests too, so they count here.
    let completed = (answered + failed(&stats.errors)).max(1) as f64;
    Row {
        name,
        rps: answered as f64 / m.seconds,
        p50_us: percentile(&stats.latencies_us, 0.50),
        p99_us: percentile(&stats.latencies_us, 0.99),
        errors: stats.errors,
        over_limit: stats.over_limit,
        cpu_us_per_req: m.cpu_us / completed,
        store_cpu_us_per_req: m.store_cpu_us.map(|us| us / completed),
        client_cpu_us_per_req: m.client_cpu_us / completed,
        store_calls_per_req: m.store_calls.map(|n| n as f64 / completed),
        windows: m.windows.map(|run| {
            let per_window = run.per_window().iter().map(|w| w.certain).collect();
            (per_window, run.utilisation())
        }),
    }
}

fn print_row(round: u64, r: &Row) {
    let store = r
        .store_cpu_us_per_req
        .map_or(String::new(), |us| format!(" store_cpu_us_per_req={us:.1}"));
    let calls = r
        .store_calls_per_req
        .map_or(String::new(), |n| format!(" store_calls_per_req={n:.4}"));
    let windows = r.windows.as_ref().map_or(String::new(), |(per, used)| {
        format!(" per_aligned_window={per:?} utilisation={used:.3}")
    });
    println!(
        "round {round} {:<9} rps={:.0} p50_us={} p99_us={} errors={} over_limit={} cpu_us_per_req={:.1}{store} client_cpu_us_per_req={:.1}{calls}{windows}",
        r.name,
        r.rps,
        r.p50_us,
        r.p99_us,
        failed(&r.errors),
        r.over_limit,
        r.cpu_us_per_req,
        r.client_cpu_us_per_req
    );
}

/// Median and range over the rounds, per server, and of each server's ratio to the
/// do-nothing server of the same round.
fn print_summary(servers: &[&'static str], rows: &[Row]) {
    println!("\nmedian (min–max) over the rounds");
    let of = |name: &'static str| rows.iter().filter(move |r| r.name == name);
    for &name in servers {
        let store: Vec<f64> = of(name).filter_map(|r| r.store_cpu_us_per_req).collect();
        let calls: Vec<f64> = of(name).filter_map(|r| r.store_calls_per_req).collect();
        let used: Vec<f64> = of(name)
            .filter_map(|r| Some(r.windows.as_ref()?.1))
            .collect();
        let optional = |label: &str, values: Vec<f64>, digits: usize| match values.is_empty() {
            true => String::new(),
            false => format!("  {label} {}", spread(values, digits)),
        };
        println!(
            "{name:<9} rps {}  p99_us {}  cpu_us_per_req {}{}  client_cpu_us_per_req {}{}{}",
            spread(of(name).map(|r| r.rps).collect(), 0),
            spread(of(name).map(|r| f64::from(r.p99_us)).collect(), 0),
            spread(of(name).map(|r| r.cpu_us_per_req).collect(), 1),
            optional("store_cpu_us_per_req", store, 1),
            spread(of(name).map(|r| r.client_cpu_us_per_req).collect(), 1),
            optional("store_calls_per_req", calls, 4),
            optional("utilisation", used, 3),
        );
    }
    let mut comparisons: Vec<(&'static str, &'static str)> = servers
        .iter()
        .filter(|&&n| n != "noop")
        .map(|&n| (n, "noop"))
        .collect();
    if servers.contains(&"reference") {
        comparisons.push(("tollgate", "reference"));
    }
    if servers.contains(&"memory") {
        comparisons.push(("tollgate", "memory"));
    }
    if servers.contains(&"valkey") {
        comparisons.push(("valkey", "tollgate"));
    }
    for (name, base) in comparisons {
        let pairs: Vec<(&Row, &Row)> = of(base).zip(of(name)).collect();
        if pairs.is_empty() {
            continue;
        }
        println!(
            "{name}/{base} throughput {}  cpu per request {}  p99 {}",
            spread(
                pairs
                    .iter()
                    .map(|(n, t)| t.rps / n.rps.max(f64::MIN_POSITIVE))
                    .collect(),
                2
            ),
            spread(
                pairs
                    .iter()
                    .map(|(n, t)| t.cpu_us_per_req / n.cpu_us_per_req.max(f64::MIN_POSITIVE))
                    .collect(),
                2
            ),
            spread(
                pairs
                    .iter()
                    .map(|(n, t)| f64::from(t.p99_us) / f64::from(n.p99_us.max(1)))
                    .collect(),
                2
            ),
        );
    }
}

/// `median (min–max)` of `values`, with `digits` decimals.
fn spread(mut values: Vec<f64>, digits: usize) -> String {
    values.sort_by(f64::total_cmp);
    match (values.first(), values.last()) {
        (Some(min), Some(max)) => {
            let median = values[values.len() / 2];
            format!("{median:.digits$} ({min:.digits$}–{max:.digits$})")
        }
        _ => "-".to_owned(),
    }
}
