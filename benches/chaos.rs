//! Chaos run: several Tollgates on one Redis — a master, its replica and a sentinel — under
//! steady load while the master is paused, killed and restarted, failed over, or made
//! slow (stalls a few times the store timeout long, over seconds: calls time out, yet
//! Redis runs them late), at random. From the exact log of answers it reports, and fails
//! unless all are zero:
//!
//! - answers slower than the store timeout plus `--slack-ms` (scheduling on a busy
//!   machine), as Tollgate measured them (its response-time histogram, at the first bucket
//!   bound past that); as the client saw them, they are reported too;
//! - answers that break the `--on-store-error` mode (an error other than UNAVAILABLE in
//!   `error` mode, any error in the others; OVER_LIMIT for a limit that cannot be reached,
//!   unless the mode is `deny`);
//! - over-admission: one-second windows of a fixed-window limit with more OK answers than
//!   the limit (answers whose window is certain; in `error` and `deny` modes, where every
//!   admission is Redis's, and in `local` mode with one instance, which never admits more
//!   than the limit however slow Redis is);
//! - panics: a Tollgate that logged one or exited.
//!
//! Redis replicates asynchronously: a failover can lose writes the old master had
//! acknowledged, and with them admissions. Windows that saw a failover are reported apart;
//! their excess is Redis's, not Tollgate's. Data nodes persist every write (AOF, fsync
//! always), so a master killed and restarted without a failover loses nothing.
//!
//! Run: `cargo bench --bench chaos -- [--seconds 120] [--mode error] [--seed N]` (`--help`
//! lists the options). Not part of `./scripts/test`: it runs for minutes.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use clap::Parser;
use tollgate_testkit::accuracy::epoch_ns;
use tollgate_testkit::grpc::Code;
use tollgate_testkit::load::{Answer, Load, latencies, percentile, tally};
use tollgate_testkit::redis::sentinel::{MASTER_NAME, SentinelSet};
use tollgate_testkit::rng::Rng;
use tollgate_testkit::tollgate::{Serve, Server};

const RULES: &str = r#"
domain: chaos
descriptors:
  # The exact log checks this one: fixed one-second windows, overloaded.
  - key: acc
    rate_limit: {unit: second, requests_per_unit: 50, algorithm: fixed_window}
  # Never reached: every request for it needs Redis.
  - key: busy
    rate_limit: {unit: hour, requests_per_unit: 100000000}
"#;
const ACC_LIMIT: u64 = 50;
const WINDOW_NS: u128 = 1_000_000_000;
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Parser, Debug)]
#[command(about = "Chaos run: Tollgates on a sentinel-managed Redis under faults")]
struct Args {
    /// Seconds of faults under load.
    #[arg(long, default_value_t = 120)]
    seconds: u64,
    /// Tollgate instances.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=8))]
    instances: u64,
    /// `--on-store-error` of every instance: local, allow, deny or error.
    #[arg(long, default_value = "error")]
    mode: String,
    /// `--store-timeout` of every instance, in milliseconds.
    #[arg(long, default_value_t = 10)]
    store_timeout_ms: u64,
    /// Requests per second on each of the two rules.
    #[arg(long, default_value_t = 200)]
    rate: u64,
    /// Latency allowed past the store timeout, in milliseconds.
    #[arg(long, default_value_t = 50)]
    slack_ms: u64,
    /// Seed of the fault schedule [default: the clock].
    #[arg(long)]
    seed: Option<u64>,
    /// Passed by `cargo bench`; ignored.
    #[arg(long, hide = true)]
    bench: bool,
}

/// A fault and when it ran.
#[derive(Debug)]
struct Fault {
    what: String,
    from: SystemTime,
    /// When the sentinel set had settled again.
    to: SystemTime,
    failover: bool,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = Args::parse();
    let seed = args
        .seed
        .unwrap_or_else(|| epoch_ns(SystemTime::now()) as u64);
    eprintln!("chaos: {args:?}, seed {seed}");
    let mut rng = Rng::new(seed);
    let mut set = SentinelSet::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..args.instances {
        let server = Serve::rules(RULES)
            .redis("sentinel", &set.url())
            .args([
                "--on-store-error",
                &args.mode,
                "--store-timeout",
                &format!("{}ms", args.store_timeout_ms),
            ])
            .start_connected()
            .await;
        clients.push(server.client().await);
        servers.push(server);
    }
    let period = Duration::from_secs(1) / u32::try_from(args.rate.max(1)).unwrap_or(u32::MAX);
    let acc = Load::start(&clients, "chaos", "acc", vec!["one".into()], period).await;
    let busy_values = (0..20).map(|i| format!("v{i}")).collect();
    let busy = Load::start(&clients, "chaos", "busy", busy_values, period).await;

    let end = SystemTime::now() + Duration::from_secs(args.seconds);
    let mut faults = Vec::new();
    while SystemTime::now() < end {
        let quiet = rng.duration(Duration::from_secs(1), Duration::from_secs(3));
        tokio::time::sleep(quiet).await;
        let stall = Duration::from_millis(args.store_timeout_ms);
        faults.push(tokio::task::block_in_place(|| {
            inject(&mut set, &mut rng, stall)
        }));
    }
    let acc = acc.finish().await;
    let busy = busy.finish().await;
    let bound = Duration::from_millis(args.store_timeout_ms + args.slack_ms);
    let mut slow_in_server = (0, bound);
    for server in &servers {
        let page = server.get("/metrics").await.body;
        let (slow, le) = slower_than(&page, bound);
        slow_in_server = (slow_in_server.0 + slow, le);
    }
    let mut report = Report::new(&args, &acc, &busy, &faults, &mut servers);
    report.slow_in_server = slow_in_server;
    for server in servers {
        let output = server.stop();
        if output.stderr.contains("panicked") {
            eprintln!("a tollgate panicked:\n{}", output.stderr);
        }
    }
    report.print(&args, &faults)
}

/// One fault on the current master, then waits for the set to settle. `timeout` is the
/// instances' store timeout, which a slow master's stalls exceed.
fn inject(set: &mut SentinelSet, rng: &mut Rng, timeout: Duration) -> Fault {
    let before = set.master_port_by_sentinel();
    let from = SystemTime::now();
    let what = match rng.below(4) {
        0 => {
            let pause = rng.duration(Duration::from_millis(100), Duration::from_millis(1500));
            if let Some((master, _)) = set.by_role() {
                master.freeze();
                std::thread::sleep(pause);
                master.thaw();
            }
            format!("pause {pause:?}")
        }
        1 => {
            let down = rng.duration(Duration::from_millis(200), Duration::from_millis(2000));
            if let Some((master, _)) = set.by_role() {
                master.stop();
                std::thread::sleep(down);
                master.launch();
            }
            format!("kill, restart after {down:?}")
        }
        2 => {
            // Slow, not down: stalls of 2 to 5 store timeouts, with a few milliseconds of
            // work between them, far below what the sentinel takes for a failure.
            let span = rng.duration(Duration::from_secs(1), Duration::from_secs(3));
            let stall = rng.duration(timeout * 2, timeout * 5);
            if let Some((master, _)) = set.by_role() {
                let until = std::time::Instant::now() + span;
                while std::time::Instant::now() < until {
                    master.freeze();
                    std::thread::sleep(stall);
                    master.thaw();
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            format!("slow {span:?} (stalls of {stall:?})")
        }
        _ => {
            // Refused while the sentinel sees no replica in sync: a fault of its own.
            let asked = ::redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(MASTER_NAME)
                .query::<String>(&mut set.sentinel.connection_as(None));
            match asked {
                Ok(_) => {
                    // The sentinel answers at once and promotes the replica after.
                    tollgate_testkit::wait::until("the failover", SETTLE_TIMEOUT, || {
                        match set.master_port_by_sentinel() {
                            port if port != before => Ok(()),
                            port => Err(format!("the sentinel still names {port:?}")),
                        }
                    });
                    "sentinel failover".to_owned()
                }
                Err(e) => format!("sentinel failover refused: {e}"),
            }
        }
    };
    set.await_settled(SETTLE_TIMEOUT);
    let fault = Fault {
        what,
        from,
        to: SystemTime::now(),
        failover: set.master_port_by_sentinel() != before,
    };
    eprintln!(
        "chaos: {}{}, settled after {:?}",
        fault.what,
        if fault.failover { " (failover)" } else { "" },
        fault.to.duration_since(fault.from).unwrap_or_default()
    );
    fault
}

/// What the answers say.
struct Report {
    answers: usize,
    /// Answers slower than the bound as Tollgate measured them, and the bucket bound used.
    slow_in_server: (u64, Duration),
    /// As the client saw them.
    slow: usize,
    p99: Duration,
    slowest: Duration,
    mode_violations: BTreeMap<String, usize>,
    /// Excess admissions in windows without a failover, and in windows with one.
    over_admitted: u64,
    over_admitted_in_failovers: u64,
    uncertain: usize,
    dead: usize,
    tallies: (BTreeMap<String, usize>, BTreeMap<String, usize>),
}

impl Report {
    fn new(
        args: &Args,
        acc: &[Answer],
        busy: &[Answer],
        faults: &[Fault],
        servers: &mut [Server],
    ) -> Self {
        let bound = Duration::from_millis(args.store_timeout_ms + args.slack_ms);
        let all: Vec<&Answer> = acc.iter().chain(busy).collect();
        let mut sorted = latencies(all.iter().copied());
        sorted.sort();
        let mut mode_violations = BTreeMap::new();
        for (answers, unreachable_limit) in [(acc, false), (busy, true)] {
            for a in answers {
                let ok = match (&a.result, args.mode.as_str()) {
                    (Ok(Code::Ok), _) => true,
                    (Ok(Code::OverLimit), "deny") => true,
                    (Ok(Code::OverLimit), _) => !unreachable_limit,
                    (Err(tonic::Code::Unavailable), "error") => true,
                    _ => false,
                };
                if !ok {
                    *mode_violations
                        .entry(format!("{:?}", a.result))
                        .or_default() += 1;
                }
            }
        }
        let (over_admitted, over_admitted_in_failovers, uncertain) = over_admission(acc, faults);
        Self {
            answers: all.len(),
            slow_in_server: (0, bound),
            slow: all.iter().filter(|a| a.took > bound).count(),
            p99: percentile(&sorted, 0.99),
            slowest: sorted.last().copied().unwrap_or_default(),
            mode_violations,
            over_admitted,
            over_admitted_in_failovers,
            uncertain,
            dead: servers
                .iter_mut()
                .map(|s| s.exit_status())
                .filter(Option::is_some)
                .count(),
            tallies: (tally(acc), tally(busy)),
        }
    }

    fn print(&self, args: &Args, faults: &[Fault]) -> ExitCode {
        let exact = matches!(args.mode.as_str(), "error" | "deny")
            || (args.mode == "local" && args.instances == 1);
        println!(
            "chaos: {} faults ({} failovers), {} answers; acc {:?}; busy {:?}",
            faults.len(),
            faults.iter().filter(|f| f.failover).count(),
            self.answers,
            self.tallies.0,
            self.tallies.1
        );
        println!(
            "  answers slower than {:?} in Tollgate: {}; slower than {} ms at the client: {} \
             (p99 {:?}, slowest {:?})",
            self.slow_in_server.1,
            self.slow_in_server.0,
            args.store_timeout_ms + args.slack_ms,
            self.slow,
            self.p99,
            self.slowest
        );
        println!(
            "  answers breaking --on-store-error {}: {:?}",
            args.mode, self.mode_violations
        );
        println!(
            "  over-admission: {} in windows without a failover{}; {} in windows with one; {} \
             admissions of uncertain window",
            self.over_admitted,
            if exact {
                ""
            } else {
                " (not checked: instances of this mode admit without Redis)"
            },
            self.over_admitted_in_failovers,
            self.uncertain
        );
        println!("  tollgates that died: {}", self.dead);
        let failed = self.slow_in_server.0 > 0
            || !self.mode_violations.is_empty()
            || (exact && self.over_admitted > 0)
            || self.dead > 0;
        if failed {
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        }
    }
}

/// Admissions past the limit per one-second window, counting only answers whose window is
/// certain (sent and received in the same window): (outside failovers, within them,
/// admissions of uncertain window).
fn over_admission(acc: &[Answer], faults: &[Fault]) -> (u64, u64, usize) {
    let mut per_window: BTreeMap<u128, u64> = BTreeMap::new();
    let mut uncertain = 0;
    for a in acc.iter().filter(|a| a.result == Ok(Code::Ok)) {
        let (sent, received) = (
            epoch_ns(a.sent) / WINDOW_NS,
            epoch_ns(a.received) / WINDOW_NS,
        );
        if sent == received {
            *per_window.entry(sent).or_default() += 1;
        } else {
            uncertain += 1;
        }
    }
    let in_failover = |window: u128| {
        faults.iter().filter(|f| f.failover).any(|f| {
            let (from, to) = (epoch_ns(f.from) / WINDOW_NS, epoch_ns(f.to) / WINDOW_NS);
            (from..=to + 1).contains(&window)
        })
    };
    let (mut outside, mut inside) = (0, 0);
    for (window, admitted) in per_window {
        let excess = admitted.saturating_sub(ACC_LIMIT);
        if in_failover(window) {
            inside += excess;
        } else {
            outside += excess;
        }
    }
    (outside, inside, uncertain)
}

/// From a `/metrics` page: the answers slower than the first bucket bound of
/// `ratelimit_service_response_time_seconds` at or past `bound`, and that bucket bound.
fn slower_than(page: &str, bound: Duration) -> (u64, Duration) {
    let series = "ratelimit_service_response_time_seconds";
    let number = |line: &str| line.rsplit(' ').next()?.parse::<f64>().ok();
    let count = page
        .lines()
        .find(|l| l.starts_with(&format!("{series}_count ")))
        .and_then(number)
        .unwrap_or(0.0);
    let bucket = page
        .lines()
        .filter_map(|l| {
            let le = l.strip_prefix(&format!("{series}_bucket{{le=\""))?;
            let (le, _) = le.split_once('"')?;
            Some((le.parse::<f64>().ok()?, number(l)?))
        })
        .filter(|(le, _)| *le >= bound.as_secs_f64())
        .min_by(|a, b| a.0.total_cmp(&b.0));
    match bucket {
        Some((le, within)) => ((count - within) as u64, Duration::from_secs_f64(le)),
        None => (0, bound),
    }
}
