//! The Redis store through Redis Sentinel: limiting against the master the sentinel names,
//! and a failover (master killed, replica promoted) under load.

use std::time::{Duration, Instant, SystemTime};

use tollgate_testkit::grpc::Code;
use tollgate_testkit::load::{
    Load, assert_all, assert_latency, await_exact_limiting, exactly, round_robin, sent_between,
    timed_check,
};
use tollgate_testkit::redis::sentinel::SentinelSet;
use tollgate_testkit::serial;
use tollgate_testkit::wait;

use crate::support::{
    DOMAIN, USER_LIMIT, YEARLY_LIMIT, await_exact_probe, blocking, connected, key, two_connected,
};

/// Waits until the replica holds `key` (replication is asynchronous).
fn await_replicated(set: &SentinelSet, key: &str) {
    wait::until("the counter replicated", Duration::from_secs(10), || {
        if set.replica.exists(key) {
            Ok(())
        } else {
            Err(format!("replica keys {:?}", set.replica.keys("*")))
        }
    });
}

#[tokio::test]
async fn limits_through_sentinel_on_the_master() {
    let set = SentinelSet::start();
    assert_eq!(set.master_port_by_sentinel(), Some(set.master.port()));
    let (_servers, mut clients) =
        two_connected("sentinel", &set.url(), &["--store-timeout", "1s"]).await;

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

    let key = key("", "user", "sentinel");
    assert_eq!(
        set.master.keys("*"),
        std::slice::from_ref(&key),
        "the counter is on the master"
    );
    await_replicated(&set, &key);
}

/// The master is killed under load; the sentinel promotes the replica. Meanwhile every
/// request is answered from the local view (`--on-store-error local`, 10 ms store
/// timeout), none hangs and 95 % within [`P95`]; afterwards limiting is exact against the
/// new master, counters written before the failover still hold, and instances started
/// after it find the new master.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_keeps_answering_and_resumes_exact_limiting() {
    const P95: Duration = Duration::from_secs(1);
    const RECOVERY: Duration = Duration::from_secs(10);
    let _timing = serial::timing().await;
    let mut set = SentinelSet::start();
    let args = ["--store-timeout", "10ms", "--on-store-error", "local"];
    let (_servers, mut clients) = two_connected("sentinel", &set.url(), &args).await;

    // A full counter, replicated before the failover.
    let (_, round) = await_exact_limiting(
        &mut clients,
        DOMAIN,
        "yearly",
        YEARLY_LIMIT,
        Duration::from_secs(5),
        |r| format!("before-{r}"),
    )
    .await;
    let full = format!("before-{round}");
    await_replicated(&set, &key("", "yearly", &full));

    let busy: Vec<String> = (0..20).map(|i| format!("v{i}")).collect();
    let load = Load::start(&clients, DOMAIN, "busy", busy, Duration::from_millis(2)).await;

    let killed = SystemTime::now();
    let failover = blocking(|| set.kill_master_and_await_failover());
    let promoted = Instant::now();
    eprintln!("the sentinel promoted the replica {failover:?} after the kill");

    let (took, rounds) = await_exact_probe(&mut clients, DOMAIN, "after", RECOVERY).await;
    eprintln!("exact against the new master {took:?} after the promotion, {rounds} rounds");
    let answers = load.finish().await;

    // The counter that was exact (N admitted through two instances) is on the new master.
    let probe = key("", "probe", &format!("after-{rounds}"));
    assert!(
        set.replica.exists(&probe),
        "{probe} is on the promoted replica"
    );

    // An instance started after the failover finds the new master and its counters.
    let late = connected("sentinel", &set.url(), &["--store-timeout", "1s"]).await;
    let mut late_rls = late.client().await;
    let answer = timed_check(&mut late_rls, DOMAIN, &[("yearly", &full)]).await;
    assert_eq!(
        answer.result,
        Ok(Code::OverLimit),
        "a counter filled before the failover: {answer:?}"
    );

    let during = sent_between(&answers, killed, SystemTime::now());
    assert!(!during.is_empty(), "load ran during the failover");
    assert_latency(&answers, 0.95, P95, "sentinel failover");
    assert_all(
        &answers,
        Ok(Code::Ok),
        "--on-store-error local, counters far from their limit",
    );
    eprintln!(
        "{} answers ({} after the kill); recovered {:?} after the promotion",
        answers.len(),
        during.len(),
        promoted.elapsed()
    );
}
