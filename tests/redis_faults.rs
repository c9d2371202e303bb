//! The Redis store when Redis fails: down at start, killed during load (each
//! `--on-store-error` mode), frozen; then back.
//!
//! Tollgate runs with the default `--store-timeout 10ms`. No call may take longer than
//! [`CALL_LIMIT`] (20× the store timeout: room for a loaded 2-core machine, far below
//! anything that would stall Envoy) and none may hang. After Redis is back, limiting must be
//! exact again within [`RECOVERY`]: a fresh counter, hit round-robin through two or more
//! instances, admits exactly its limit — which only a shared, working store gives.
//!
//! The tests here run one at a time (they measure latencies).

mod common;
mod redis_harness;

use std::time::{Duration, SystemTime};

use common::*;
use redis_harness::*;

const CALL_LIMIT: Duration = Duration::from_millis(200);
const RECOVERY: Duration = Duration::from_secs(2);
const HEALTH_RECOVERY: Duration = Duration::from_secs(5);
/// Answers to wait for while Redis is down: at least ~1.2 s of outage at the load's pace,
/// long enough for reconnection attempts to back off.
const OUTAGE_ANSWERS: usize = 600;
const LOAD_PERIOD: Duration = Duration::from_millis(2);

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn args(mode: &str) -> [&str; 4] {
    ["--store-timeout", "10ms", "--on-store-error", mode]
}

fn busy_values() -> Vec<String> {
    (0..20).map(|i| format!("v{i}")).collect()
}

/// What a request that needs the store gets while the store is down.
fn outage_answer(mode: &str) -> Result<Code, tonic::Code> {
    match mode {
        "local" | "allow" => Ok(Code::Ok),
        "deny" => Ok(Code::OverLimit),
        "error" => Err(tonic::Code::Unavailable),
        other => panic!("unknown mode {other}"),
    }
}

/// Runs a blocking harness call without stalling the runtime's other tasks (the load).
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_then_up() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::unstarted();
    let modes = ["local", "allow", "deny", "error"];
    let servers: Vec<Server> = modes
        .iter()
        .map(|mode| start_tollgate(RULES, "single", &redis.url(), &args(mode)))
        .collect();
    let mut clients = Vec::new();
    for (mode, server) in modes.iter().zip(&servers) {
        // README: /healthcheck is 500 while the store is down only when its failures are
        // errors (so that traffic goes to instances that can answer).
        let health = http_get(server.http_addr(), "/healthcheck");
        let want = if *mode == "error" { 500 } else { 200 };
        assert_eq!(
            health.status, want,
            "{mode}: /healthcheck while Redis is down"
        );
        assert_eq!(store_health(server.http_addr()).await, 503, "{mode}");
        clients.push(server.client().await);
    }

    for (mode, rls) in modes.iter().zip(&mut clients) {
        let mut answers = Vec::new();
        for i in 0..20 {
            answers.push(timed_check(rls, DOMAIN, &[("busy", &format!("down-{i}"))]).await);
        }
        let want = outage_answer(mode);
        assert!(
            answers.iter().all(|a| a.result == want),
            "{mode}: want {want:?} while Redis is down, got {:?}",
            tally(&answers)
        );
        assert_all_within(&answers, CALL_LIMIT, mode);
    }
    // `local` decides as the memory store would.
    let got = round_robin(
        &mut clients[..1],
        DOMAIN,
        &[("user", "down")],
        USER_LIMIT + 2,
    )
    .await;
    assert_eq!(got, exactly(USER_LIMIT, 2), "local decisions while down");

    blocking(|| redis.launch());
    let mut slowest = Duration::ZERO;
    for (mode, server) in modes.iter().zip(&servers) {
        let took = await_store_health(server.http_addr(), 200, HEALTH_RECOVERY).await;
        eprintln!("{mode}: store healthy {took:?} after Redis came up");
        slowest = slowest.max(took);
        let health = http_get(server.http_addr(), "/healthcheck");
        assert_eq!(health.status, 200, "{mode}: /healthcheck once Redis is up");
    }
    let (took, rounds) =
        await_exact_limiting(&mut clients, DOMAIN, "probe", "up", PROBE_LIMIT, RECOVERY).await;
    eprintln!(
        "exact across all four instances {took:?} after the last became healthy \
         ({slowest:?} after Redis came up), {rounds} rounds"
    );
    assert!(redis.dbsize() > 0, "the probes' counters must be in Redis");
}

/// Kills Redis under steady load through two instances, checks the answers during the
/// outage and the latency of every call, restarts Redis (empty) on the same port, and
/// waits for exact limiting.
async fn kill_during_load(mode: &str) {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let a = start_connected(RULES, "single", &redis.url(), &args(mode));
    let b = start_connected(RULES, "single", &redis.url(), &args(mode));
    let mut clients = vec![a.client().await, b.client().await];

    // Before: limiting is exact across the two instances.
    await_exact_limiting(
        &mut clients,
        DOMAIN,
        "probe",
        "before",
        PROBE_LIMIT,
        RECOVERY,
    )
    .await;
    // A counter A's local view knows to be full.
    let (_, round) = await_exact_limiting(
        &mut clients[..1],
        DOMAIN,
        "yearly",
        "full",
        YEARLY_LIMIT,
        RECOVERY,
    )
    .await;
    let full = format!("full-{round}");

    let load = Load::start(&clients, DOMAIN, "busy", busy_values(), LOAD_PERIOD);
    load.await_answers_since(SystemTime::UNIX_EPOCH, 50, Duration::from_secs(30))
        .await;

    blocking(|| redis.stop());
    let killed = SystemTime::now();
    load.await_answers_since(killed, OUTAGE_ANSWERS, Duration::from_secs(30))
        .await;

    if mode == "local" {
        let took = await_store_health(a.http_addr(), 503, HEALTH_RECOVERY).await;
        eprintln!("store health 503 {took:?} after the kill");
        // Decisions from the local view, as the memory store would make them.
        let got = round_robin(
            &mut clients[..1],
            DOMAIN,
            &[("user", "outage")],
            USER_LIMIT + 2,
        )
        .await;
        assert_eq!(got, exactly(USER_LIMIT, 2), "local decisions while down");
    }
    // A counter known to be over the limit stays denied, from the local view.
    let known = timed_check(&mut clients[0], DOMAIN, &[("yearly", &full)]).await;
    eprintln!("{mode}: a counter the local view knows to be full, while Redis is down: {known:?}");
    if mode == "local" {
        assert_eq!(known.result, Ok(Code::OverLimit), "{known:?}");
    }

    let restarted = SystemTime::now();
    blocking(|| redis.launch());
    let (took, rounds) = await_exact_limiting(
        &mut clients,
        DOMAIN,
        "probe",
        "after",
        PROBE_LIMIT,
        RECOVERY,
    )
    .await;
    eprintln!("{mode}: exact again {took:?} after Redis answered PING, {rounds} rounds");
    let answers = load.finish().await;

    let outage = sent_between(&answers, killed, restarted);
    assert!(
        outage.len() >= OUTAGE_ANSWERS,
        "{} answers during the outage",
        outage.len()
    );
    let want = outage_answer(mode);
    let wrong: Vec<_> = outage.iter().filter(|a| a.result != want).collect();
    assert!(
        wrong.is_empty(),
        "{mode}: want {want:?} for every request sent while Redis was down; got {:?}, e.g. {:?}",
        tally(outage.iter().copied()),
        &wrong[..wrong.len().min(5)]
    );
    assert_all_within(&answers, CALL_LIMIT, &format!("{mode}, whole run"));
    eprintln!(
        "{mode}: {} answers, {} during the outage, slowest {:?}; all: {:?}",
        answers.len(),
        outage.len(),
        answers.iter().map(|a| a.took).max().unwrap_or_default(),
        tally(&answers)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_load_local() {
    kill_during_load("local").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_load_allow() {
    kill_during_load("allow").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_load_deny() {
    kill_during_load("deny").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_during_load_error() {
    kill_during_load("error").await;
}

/// A Redis that stops answering (SIGSTOP) but keeps its connections open: only the store
/// timeout stands between a request and a hang.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_redis_costs_at_most_the_timeout() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let a = start_connected(RULES, "single", &redis.url(), &args("local"));
    let b = start_connected(RULES, "single", &redis.url(), &args("local"));
    let mut clients = vec![a.client().await, b.client().await];

    let load = Load::start(&clients, DOMAIN, "busy", busy_values(), LOAD_PERIOD);
    load.await_answers_since(SystemTime::UNIX_EPOCH, 50, Duration::from_secs(30))
        .await;

    blocking(|| redis.freeze());
    let frozen = SystemTime::now();
    load.await_answers_since(frozen, OUTAGE_ANSWERS, Duration::from_secs(30))
        .await;
    let got = round_robin(
        &mut clients[..1],
        DOMAIN,
        &[("user", "frozen")],
        USER_LIMIT + 2,
    )
    .await;
    assert_eq!(got, exactly(USER_LIMIT, 2), "local decisions while frozen");

    let thawed = SystemTime::now();
    blocking(|| redis.thaw());
    let (took, rounds) = await_exact_limiting(
        &mut clients,
        DOMAIN,
        "probe",
        "thawed",
        PROBE_LIMIT,
        RECOVERY,
    )
    .await;
    eprintln!("exact again {took:?} after SIGCONT, {rounds} rounds");
    let answers = load.finish().await;

    let outage = sent_between(&answers, frozen, thawed);
    assert!(outage.len() >= OUTAGE_ANSWERS);
    let wrong: Vec<_> = outage.iter().filter(|a| a.result != Ok(Code::Ok)).collect();
    assert!(
        wrong.is_empty(),
        "want OK from the local view while Redis is frozen; got {:?}, e.g. {:?}",
        tally(outage.iter().copied()),
        &wrong[..wrong.len().min(5)]
    );
    assert_all_within(&answers, CALL_LIMIT, "frozen Redis, whole run");
}
