//! The Redis store through Redis Sentinel: limiting against the master the sentinel names,
//! and a failover (master killed, replica promoted) under load.

mod common;
mod redis_harness;

use std::time::{Duration, Instant, SystemTime};

use common::*;
use redis_harness::*;

fn through_sentinel(set: &SentinelSet, extra: &[&str]) -> Server {
    start_connected(RULES, "sentinel", &set.url(), extra)
}

#[tokio::test]
async fn limits_through_sentinel_on_the_master() {
    let set = SentinelSet::start();
    assert_eq!(set.master_port_by_sentinel(), Some(set.master.port()));
    let a = through_sentinel(&set, &["--store-timeout", "1s"]);
    let b = through_sentinel(&set, &["--store-timeout", "1s"]);
    let mut clients = [a.client().await, b.client().await];

    let got = round_robin(
        &mut clients,
        DOMAIN,
        &[("user", "sentinel")],
        USER_LIMIT + 3,
    )
    .await;
    assert_eq!(
        got,
        exactly(USER_LIMIT, 3),
        "two instances through the sentinel"
    );

    let key = redis_key("", DOMAIN, &[("user", "sentinel")], USER_SHAPE);
    assert_eq!(
        set.master.keys("*"),
        std::slice::from_ref(&key),
        "the counter is on the master"
    );
    // And it reaches the replica (asynchronous replication).
    wait_for(
        "the counter replicated",
        Duration::from_secs(10),
        || (set.replica.keys("*") == [key.clone()]).then_some(()),
        || format!("replica keys {:?}", set.replica.keys("*")),
    );
}

/// The master is killed under load; the sentinel promotes the replica. Meanwhile every
/// request is answered from the local view (`--on-store-error local`, 10 ms store timeout),
/// none hangs; afterwards limiting is exact against the new master, counters written before
/// the failover still hold, and instances started after it find the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_keeps_answering_and_resumes_exact_limiting() {
    const CALL_LIMIT: Duration = Duration::from_secs(1);
    const RECOVERY: Duration = Duration::from_secs(10);
    let mut set = SentinelSet::start();
    let args = ["--store-timeout", "10ms", "--on-store-error", "local"];
    let a = through_sentinel(&set, &args);
    let b = through_sentinel(&set, &args);
    let mut clients = vec![a.client().await, b.client().await];

    // A full counter, replicated before the failover.
    let (_, round) = await_exact_limiting(
        &mut clients,
        DOMAIN,
        "yearly",
        "before",
        YEARLY_LIMIT,
        Duration::from_secs(5),
    )
    .await;
    let full = format!("before-{round}");
    let full_key = redis_key("", DOMAIN, &[("yearly", &full)], YEARLY_SHAPE);
    wait_for(
        "the full counter replicated",
        Duration::from_secs(10),
        || {
            let exists: u64 = set.replica.query(&["EXISTS", &full_key]);
            (exists == 1).then_some(())
        },
        || format!("replica keys {:?}", set.replica.keys("*")),
    );

    let busy: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
    let load = Load::start(&clients, DOMAIN, "busy", busy, Duration::from_millis(2));
    load.await_answers_since(SystemTime::UNIX_EPOCH, 50, Duration::from_secs(30))
        .await;

    let killed = SystemTime::now();
    let failover = tokio::task::block_in_place(|| set.kill_master_and_await_failover());
    let promoted = Instant::now();
    eprintln!("sentinel promoted the replica {failover:?} after the kill");

    let (took, rounds) = await_exact_limiting(
        &mut clients,
        DOMAIN,
        "probe",
        "after",
        PROBE_LIMIT,
        RECOVERY,
    )
    .await;
    eprintln!("exact against the new master {took:?} after the promotion, {rounds} rounds");
    let answers = load.finish().await;

    // The counter that was exact (N admitted through two instances) is on the new master.
    let probe = redis_key(
        "",
        DOMAIN,
        &[("probe", &format!("after-{rounds}"))],
        PROBE_SHAPE,
    );
    let exists: u64 = set.replica.query(&["EXISTS", &probe]);
    assert_eq!(exists, 1, "{probe} is on the promoted replica");

    // An instance started after the failover finds the new master and its counters.
    let late = through_sentinel(&set, &["--store-timeout", "1s"]);
    let mut late_rls = late.client().await;
    let answer = timed_check(&mut late_rls, DOMAIN, &[("yearly", &full)]).await;
    assert_eq!(
        answer.result,
        Ok(Code::OverLimit),
        "a counter filled before the failover: {answer:?}"
    );

    let during = sent_between(&answers, killed, SystemTime::now());
    assert!(!during.is_empty(), "load ran during the failover");
    assert_all_within(&answers, CALL_LIMIT, "sentinel failover");
    assert_all_ok(&answers);
    eprintln!(
        "{} answers ({} after the kill), slowest {:?}; recovered {:?} after promotion",
        answers.len(),
        during.len(),
        answers.iter().map(|a| a.took).max().unwrap_or_default(),
        promoted.elapsed()
    );
}
