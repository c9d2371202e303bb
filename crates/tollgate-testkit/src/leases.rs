//! Leases against one real shared store, the run the Redis and PostgreSQL suites share:
//! two Tollgates with `LEASES=true` on one hot counter call the store far less often than
//! they admit, never admit past the limit when pushed into overload, and give what they
//! hold back when they drain.

use std::time::Duration;

use crate::grpc::{Code, Rls};
use crate::load::timed_check;
use crate::process::Signal;
use crate::tollgate::{Serve, Server};
use crate::wait::room_in_window;

/// The rules every leasing Tollgate serves.
pub const RULES: &str = r#"
domain: rl
descriptors:
  # Far above any load: 1 % of it (10,000) is the largest block.
  - key: hot
    rate_limit: {unit: hour, requests_per_unit: 1000000, algorithm: fixed_window}
  # Pushed into overload: blocks of at most 30.
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 3000, algorithm: fixed_window}
"#;
/// The hot counter's limit.
pub const HOT_LIMIT: u64 = 1_000_000;
const TIGHT_LIMIT: u64 = 3_000;
const TIGHT_BLOCK: u64 = 30;
const INSTANCES: usize = 2;
/// Concurrent callers per instance.
pub const CALLERS: usize = 4;

/// A shared store under test: how a Tollgate serving `rules` on it starts, and how many
/// calls of Tollgate's store operation the store itself has counted so far.
pub struct Store<'a> {
    pub serve: &'a dyn Fn(&str) -> Serve,
    pub calls: &'a dyn Fn() -> u64,
}

impl Store<'_> {
    /// Tollgate on this store with leases on.
    async fn leasing(&self) -> Server {
        (self.serve)(RULES)
            .args(["--store-timeout", "1s"])
            .env("LEASES", "true")
            .start_connected()
            .await
    }
}

/// The whole run on `store`; panics where leasing falls short.
pub async fn call_rarely_and_never_admit_past_the_limit(store: Store<'_>) {
    let mut servers = Vec::new();
    for _ in 0..INSTANCES {
        servers.push(store.leasing().await);
    }
    let mut clients = Vec::new();
    for server in &servers {
        clients.push(server.client().await);
    }

    // A hot counter far from its limit: most admissions come from blocks.
    room_in_window(Duration::from_secs(3_600), Duration::from_secs(120)).await;
    let before = (store.calls)();
    let hot = admissions(&clients, "hot", 500).await;
    let calls = (store.calls)() - before;
    assert_eq!(hot, (INSTANCES * CALLERS * 500) as u64);
    let local = total(&servers, "tollgate_store_lease_local_admissions_total").await;
    eprintln!(
        "hot: {hot} admissions, {calls} store calls, {local} admitted from leases, {} blocks",
        total(&servers, "tollgate_store_lease_taken_total").await
    );
    assert!(calls * 4 < hot, "{calls} store calls for {hot} admissions");
    assert!(
        local * 2.0 > hot as f64,
        "{local} of {hot} admitted from leases"
    );

    // Overload on a counter of 3,000 a minute: never past it, and at most one block per
    // instance left unused.
    room_in_window(Duration::from_secs(60), Duration::from_secs(40)).await;
    let tight = admissions(&clients, "tight", 1_000).await;
    eprintln!(
        "tight: {tight} admitted of {} requests",
        INSTANCES * CALLERS * 1_000
    );
    assert!(tight <= TIGHT_LIMIT, "{tight} admitted past {TIGHT_LIMIT}");
    assert!(
        tight >= TIGHT_LIMIT - INSTANCES as u64 * TIGHT_BLOCK,
        "only {tight} of {TIGHT_LIMIT} admitted"
    );

    // Idle blocks and, at the drain, every block still held go back: a fresh instance sees
    // exactly what was admitted.
    for mut server in servers {
        server.signal(Signal::Term);
        assert!(server.wait_exit(Duration::from_secs(10)).status.success());
    }
    let fresh = store.leasing().await;
    let status = fresh.client().await.check("rl", &[("hot", "one")]).await;
    assert_eq!(
        u64::from(status.limit_remaining),
        HOT_LIMIT - hot - 1,
        "units still counted after the drain"
    );
}

/// `per_caller` requests for `key=one` (domain `rl`) from each of [`CALLERS`] tasks per
/// client, one after another; the admissions.
pub async fn admissions(clients: &[Rls], key: &'static str, per_caller: usize) -> u64 {
    let mut tasks = tokio::task::JoinSet::new();
    for client in clients {
        for _ in 0..CALLERS {
            let mut rls = client.clone();
            tasks.spawn(async move {
                let mut admitted = 0;
                for _ in 0..per_caller {
                    let answer = timed_check(&mut rls, "rl", &[(key, "one")]).await;
                    match answer.result {
                        Ok(Code::Ok) => admitted += 1,
                        Ok(Code::OverLimit) => {}
                        other => panic!("{key}: {other:?}"),
                    }
                }
                admitted
            });
        }
    }
    tasks.join_all().await.into_iter().sum()
}

/// The metric `name` summed over `servers`.
async fn total(servers: &[Server], name: &str) -> f64 {
    let mut sum = 0.0;
    for server in servers {
        sum += server
            .metric(name)
            .await
            .unwrap_or_else(|| panic!("no {name} in /metrics"));
    }
    sum
}
