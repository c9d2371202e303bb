//! The Redis store when Redis fails: down at start, killed during load (each
//! `--on-store-error` mode), frozen, read-only, full, or closing an idle connection;
//! then back.
//!
//! Tollgate runs with the default `--store-timeout 10ms` (the test of a stall within a
//! longer timeout sets its own). No call may hang, and 95 % of
//! them are answered within [`P95`] (20× the store timeout: room for a loaded 2-core
//! machine, far below anything that would stall Envoy). After Redis is back, limiting
//! must be exact again within [`RECOVERY`]: a fresh counter, hit round-robin through two
//! or more instances, admits exactly its limit — which only a shared, working store gives.
//! Every test here measures latencies, so each takes the timing lock.

use std::time::{Duration, SystemTime};

use tollgate_testkit::grpc::{Code, Rls, code};
use tollgate_testkit::load::{
    Answer, Load, assert_all, assert_latency, await_exact_limiting, exactly, in_sequence,
    sent_between, tally, timed_check,
};
use tollgate_testkit::redis::{Engine, RedisServer};
use tollgate_testkit::serial;
use tollgate_testkit::tollgate::{Server, start_all_without_store};
use tollgate_testkit::wait;

use crate::support::{
    DOMAIN, USER_LIMIT, YEARLY_LIMIT, await_exact_probe, await_new_connections, blocking,
    cut_connections, key, serve, two_connected,
};

const P95: Duration = Duration::from_millis(200);
const RECOVERY: Duration = Duration::from_secs(2);
const HEALTH_RECOVERY: Duration = Duration::from_secs(5);
/// Answers to wait for while Redis is down: at least ~1.2 s of outage at the load's pace,
/// long enough for reconnection attempts to back off.
const OUTAGE_ANSWERS: usize = 600;
const LOAD_PERIOD: Duration = Duration::from_millis(2);
const MODES: [&str; 4] = ["local", "allow", "deny", "error"];

fn args(mode: &str) -> [&str; 4] {
    ["--store-timeout", "10ms", "--on-store-error", mode]
}

async fn connected(redis: &RedisServer, mode: &str) -> Server {
    serve("single", &redis.url())
        .args(args(mode))
        .start_connected()
        .await
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

/// A fresh `user` counter through `rls` admits exactly its limit: decided from the local
/// view, as the memory store would.
async fn assert_local_decisions(rls: &mut Rls, value: &str) {
    let got = in_sequence(rls, DOMAIN, &[("user", value)], USER_LIMIT + 2).await;
    assert_eq!(
        got,
        exactly(USER_LIMIT, 2),
        "local decisions while Redis is away"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_at_start_then_up() {
    let _timing = serial::timing().await;
    let mut redis = RedisServer::unstarted();
    let servers =
        start_all_without_store(MODES.map(|mode| serve("single", &redis.url()).args(args(mode))));
    let mut clients = Vec::new();
    for (mode, server) in MODES.iter().zip(&servers) {
        // docs/OPERATING.md: /healthcheck is 500 while the store is down only when its failures are
        // errors (so that traffic goes to instances that can answer).
        let want = if *mode == "error" { 500 } else { 200 };
        let health = server.get("/healthcheck").await;
        assert_eq!(
            health.status, want,
            "{mode}: /healthcheck while Redis is down"
        );
        assert_eq!(server.store_health().await, 503, "{mode}");
        clients.push(server.client().await);
    }

    for (mode, rls) in MODES.iter().zip(&mut clients) {
        let mut answers = Vec::new();
        for i in 0..20 {
            answers.push(timed_check(rls, DOMAIN, &[("busy", &format!("down-{i}"))]).await);
        }
        assert_all(
            &answers,
            outage_answer(mode),
            &format!("{mode}, Redis down"),
        );
        assert_latency(&answers, 0.95, P95, mode);
    }
    assert_local_decisions(&mut clients[0], "down").await;

    blocking(|| redis.launch());
    let mut slowest = Duration::ZERO;
    for (mode, server) in MODES.iter().zip(&servers) {
        let took = server.await_store_health(200, HEALTH_RECOVERY).await;
        eprintln!("{mode}: store healthy {took:?} after Redis came up");
        slowest = slowest.max(took);
        let health = server.get("/healthcheck").await;
        assert_eq!(health.status, 200, "{mode}: /healthcheck once Redis is up");
    }
    let (took, rounds) = await_exact_probe(&mut clients, DOMAIN, "up", RECOVERY).await;
    eprintln!(
        "exact across all four instances {took:?} after the last became healthy \
         ({slowest:?} after Redis came up), {rounds} rounds"
    );
    let last = key("", "probe", &format!("up-{rounds}"));
    assert!(
        redis.exists(&last),
        "the last probe's counter {last} is in Redis"
    );
}

/// Kills Redis under steady load through two instances, checks the answers during the
/// outage and the latencies, restarts Redis (empty) on the same port, and waits for exact
/// limiting.
async fn kill_during_load(mode: &str) {
    let _timing = serial::timing().await;
    let mut redis = RedisServer::start();
    let ([a, _b], mut clients) = two_connected("single", &redis.url(), &args(mode)).await;

    // Before: limiting is exact across the two instances.
    await_exact_probe(&mut clients, DOMAIN, "before", RECOVERY).await;
    // A counter A's local view knows to be full.
    let (_, round) = await_exact_limiting(
        &mut clients[..1],
        DOMAIN,
        "yearly",
        YEARLY_LIMIT,
        RECOVERY,
        |r| format!("full-{r}"),
    )
    .await;
    let full = format!("full-{round}");

    let load = Load::start(&clients, DOMAIN, "busy", busy_values(), LOAD_PERIOD).await;

    blocking(|| redis.stop());
    let killed = SystemTime::now();
    load.await_answers_since(killed, OUTAGE_ANSWERS, Duration::from_secs(30))
        .await;

    if mode == "local" {
        let took = a.await_store_health(503, HEALTH_RECOVERY).await;
        eprintln!("store health 503 {took:?} after the kill");
        assert_local_decisions(&mut clients[0], "outage").await;
    }
    // docs/SETTINGS.md: a request the local view already knows to be over its limit is denied in
    // every mode, Redis or not.
    let known = timed_check(&mut clients[0], DOMAIN, &[("yearly", &full)]).await;
    assert_eq!(
        known.result,
        Ok(Code::OverLimit),
        "{mode}: a counter the local view knows to be full, while Redis is down: {known:?}"
    );

    let restarted = SystemTime::now();
    blocking(|| redis.launch());
    let (took, rounds) = await_exact_probe(&mut clients, DOMAIN, "after", RECOVERY).await;
    eprintln!("{mode}: exact again {took:?} after Redis answered again, {rounds} rounds");
    let answers = load.finish().await;

    let outage = sent_between(&answers, killed, restarted);
    assert!(
        outage.len() >= OUTAGE_ANSWERS,
        "{} answers during the outage",
        outage.len()
    );
    assert_all(
        outage.iter().copied(),
        outage_answer(mode),
        &format!("{mode}, Redis killed"),
    );
    assert_latency(&answers, 0.95, P95, &format!("{mode}, whole run"));
    report(mode, &answers, outage.len());
}

fn report(what: &str, answers: &[Answer], during: usize) {
    eprintln!(
        "{what}: {} answers, {during} during the outage, slowest {:?}; all: {:?}",
        answers.len(),
        answers.iter().map(|a| a.took).max().unwrap_or_default(),
        tally(answers)
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
    let _timing = serial::timing().await;
    let mut redis = RedisServer::start();
    let (_servers, mut clients) = two_connected("single", &redis.url(), &args("local")).await;

    let load = Load::start(&clients, DOMAIN, "busy", busy_values(), LOAD_PERIOD).await;

    blocking(|| redis.freeze());
    let frozen = SystemTime::now();
    load.await_answers_since(frozen, OUTAGE_ANSWERS, Duration::from_secs(30))
        .await;
    assert_local_decisions(&mut clients[0], "frozen").await;

    let thawed = SystemTime::now();
    blocking(|| redis.thaw());
    let (took, rounds) = await_exact_probe(&mut clients, DOMAIN, "thawed", RECOVERY).await;
    eprintln!("exact again {took:?} after SIGCONT, {rounds} rounds");
    let answers = load.finish().await;

    let outage = sent_between(&answers, frozen, thawed);
    assert!(outage.len() >= OUTAGE_ANSWERS);
    assert_all(outage.iter().copied(), Ok(Code::Ok), "local, Redis frozen");
    assert_latency(&answers, 0.95, P95, "frozen Redis, whole run");
    report("frozen", &answers, outage.len());
}

/// A stall shorter than `--store-timeout` is waited out, however long: the store timeout
/// is the one limit on a call. Before the fix, redis-rs cut every call at its own default
/// of 500 ms and reported the connection lost, so a timeout of 2 s acted as 500 ms.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_within_the_store_timeout_is_waited_out() {
    let _timing = serial::timing().await;
    let mut redis = RedisServer::start();
    let server = serve("single", &redis.url())
        .args(["--store-timeout", "2s", "--on-store-error", "error"])
        .start_connected()
        .await;
    let mut rls = server.client().await;
    let entries = [("user", "stalled-800ms")];
    blocking(|| redis.freeze());
    let mut caller = rls.clone();
    let call = tokio::spawn(async move { timed_check(&mut caller, DOMAIN, &entries).await });
    // The stall under test: longer than redis-rs's 500 ms, well within the 2 s timeout.
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!call.is_finished(), "answered while Redis was frozen");
    blocking(|| redis.thaw());
    let answer = call.await.expect("the call's task");
    assert_eq!(
        answer.result,
        Ok(Code::Ok),
        "a stall within the store timeout"
    );
    let status = rls.check(DOMAIN, &entries).await;
    assert_eq!(
        status.limit_remaining as usize,
        USER_LIMIT - 2,
        "the stalled request was counted in Redis, and this one after it"
    );
}

/// Requests refused while Redis was frozen (`deny`, `error`) are not charged when Redis
/// thaws and runs the scripts queued for them: a script past its request's deadline counts
/// nothing. Before the fix, a client that was only ever refused was charged for it.
async fn requests_answered_during_a_stall_are_not_counted_after_it(engine: Engine) {
    let _timing = serial::timing().await;
    let mut redis = RedisServer::start_engine(engine);
    for mode in ["deny", "error"] {
        let server = connected(&redis, mode).await;
        let mut rls = server.client().await;
        let value = format!("stalled-{mode}");
        let entries = [("user", value.as_str())];
        blocking(|| redis.freeze());
        for _ in 0..3 {
            let answer = timed_check(&mut rls, DOMAIN, &entries).await;
            assert_eq!(answer.result, outage_answer(mode), "{mode}, Redis frozen");
        }
        blocking(|| redis.thaw());
        // The first answer from Redis comes after the queued scripts, on the same
        // connection; answers that again missed the timeout are not counted either.
        let status = wait::until_async("an answer from Redis", RECOVERY, async || {
            let status = rls.check(DOMAIN, &entries).await;
            match code(&status) {
                Code::Ok => Ok(status),
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .0;
        assert_eq!(
            status.limit_remaining as usize,
            USER_LIMIT - 1,
            "{mode}: only the request after the stall counts"
        );
    }
}
on_each_engine!(
    requests_answered_during_a_stall_are_not_counted_after_it,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// Redis turned into a replica (`REPLICAOF`): it answers the health probe but refuses
/// every counter call (READONLY). Under load it is reported down (503, one line naming
/// the cause) and stays down without reconnecting again and again, until it is a master
/// again.
async fn a_read_only_replica_is_down_until_it_is_a_master_again(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let master = RedisServer::start_engine(engine);
    let server = connected(&redis, "local").await;
    let clients = vec![server.client().await];
    let load = Load::start(&clients, DOMAIN, "busy", busy_values(), LOAD_PERIOD).await;

    let port = master.port().to_string();
    blocking(|| redis.query::<()>(&["REPLICAOF", "127.0.0.1", &port]));
    server.await_store_health(503, HEALTH_RECOVERY).await;
    let reconnects = server.metric("tollgate_store_reconnects_total").await;
    load.await_answers_since(SystemTime::now(), OUTAGE_ANSWERS, Duration::from_secs(30))
        .await;
    assert_eq!(server.store_health().await, 503, "still down under load");
    assert_eq!(
        server.metric("tollgate_store_reconnects_total").await,
        reconnects,
        "no reconnect while Redis refuses counter calls"
    );

    blocking(|| redis.query::<()>(&["REPLICAOF", "NO", "ONE"]));
    server.await_store_health(200, HEALTH_RECOVERY).await;
    let answers = load.finish().await;
    assert_all(answers.iter(), Ok(Code::Ok), "decided locally meanwhile");
    let stderr = server.stderr().text();
    let causes = stderr.matches("read only replica").count();
    assert!((1..=2).contains(&causes), "{causes} lines:\n{stderr}");
}
on_each_engine!(
    a_read_only_replica_is_down_until_it_is_a_master_again,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// A counter's key holding a list (something else wrote it): read as an empty counter
/// and overwritten, logged, and counted in Redis from then on, never a permanent local
/// fallback.
async fn a_counter_key_of_another_type_is_overwritten_and_logged(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = connected(&redis, "local").await;
    let counter = key("", "yearly", "listed");
    redis.query::<()>(&["RPUSH", &counter, "not a counter"]);
    let mut rls = server.client().await;
    let mut admitted = 0;
    for _ in 0..YEARLY_LIMIT + 2 {
        let status = rls.check(DOMAIN, &[("yearly", "listed")]).await;
        admitted += usize::from(code(&status) == Code::Ok);
    }
    assert_eq!(admitted, YEARLY_LIMIT, "counted from an empty counter");
    assert_eq!(redis.key_type(&counter), "string", "overwritten");
    assert_eq!(
        server.metric("tollgate_store_fallbacks_total").await,
        Some(0.0),
        "decided by Redis"
    );
    let line = server
        .stderr()
        .wait_for(|l| l.contains("held a list"), HEALTH_RECOVERY)
        .expect("logged");
    assert!(line.contains(&counter), "{line}");
}
on_each_engine!(
    a_counter_key_of_another_type_is_overwritten_and_logged,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// Redis closes Tollgate's connection while no request is under way (`CLIENT KILL`, a
/// proxy's idle cut, a `timeout` in redis.conf): the connection is replaced as soon as
/// it closes, so the requests that follow are counted in Redis, none of them failed and
/// the store never reported down.
async fn a_connection_redis_closes_while_idle_is_replaced_before_the_next_request(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = connected(&redis, "error").await;
    let mut rls = server.client().await;
    let warm = in_sequence(&mut rls, DOMAIN, &[("user", "warm")], 1).await;
    assert_eq!(warm, exactly(1, 0), "counted before the cut");
    let ups = server.store_ups().await;

    blocking(|| {
        let cut = cut_connections(&[&redis]);
        await_new_connections(&[&redis], &cut, RECOVERY);
    });

    let got = in_sequence(&mut rls, DOMAIN, &[("user", "after-cut")], USER_LIMIT + 1).await;
    assert_eq!(
        got,
        exactly(USER_LIMIT, 1),
        "counted in Redis after the cut"
    );
    server.assert_never_down_since(ups).await;
}
on_each_engine!(
    a_connection_redis_closes_while_idle_is_replaced_before_the_next_request,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// Redis full (`maxmemory` reached under `noeviction`): it refuses every counter call
/// (OOM). Tollgate reports it down once, naming the cause, decides locally meanwhile, and
/// counts in Redis again, exactly, once memory is freed.
async fn a_full_redis_is_down_naming_the_cause_until_memory_is_freed(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = connected(&redis, "local").await;
    let mut clients = vec![server.client().await];
    await_exact_probe(&mut clients, DOMAIN, "before", RECOVERY).await;

    blocking(|| {
        let () = redis.query(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
        let () = redis.query(&["CONFIG", "SET", "maxmemory", "1"]);
    });
    let mut rls = server.client().await;
    let first = in_sequence(&mut rls, DOMAIN, &[("user", "full")], 1).await;
    server.await_store_health(503, HEALTH_RECOVERY).await;
    let oom = |l: &str| l.contains("OOM");
    blocking(|| server.stderr().wait_for(oom, HEALTH_RECOVERY)).expect("the cause logged");
    assert_local_decisions(&mut rls, "while-full").await;
    assert_eq!(first, exactly(1, 0), "answered though Redis refuses");
    let stderr = server.stderr().text();
    let causes: Vec<&str> = stderr.lines().filter(|l| oom(l)).collect();
    assert_eq!(causes.len(), 1, "reported once:\n{stderr}");
    assert!(
        causes[0].contains("WARN") && causes[0].contains("down"),
        "{}",
        causes[0]
    );

    blocking(|| {
        let () = redis.query(&["CONFIG", "SET", "maxmemory", "0"]);
    });
    server.await_store_health(200, HEALTH_RECOVERY).await;
    await_exact_probe(&mut clients, DOMAIN, "freed", RECOVERY).await;
}
on_each_engine!(
    a_full_redis_is_down_naming_the_cause_until_memory_is_freed,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);
