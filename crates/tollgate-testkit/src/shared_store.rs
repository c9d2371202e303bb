//! What the Redis and PostgreSQL suites have in common: the limits they serve, one per
//! purpose, the figures their tests count against, and the checks they make of them.

use std::time::Duration;

use crate::grpc::{Code, Rls, code};
use crate::load::{await_exact_limiting, exactly, round_robin, timed_check};
use crate::process::blocking;
use crate::tollgate::Server;
use crate::wait::until_async;

/// A rules file for `domain` with the limits every shared-store suite uses, then `extra`
/// descriptors (YAML list entries, two spaces in): a string literal, so that a suite's
/// rules stay a `const`.
#[macro_export]
macro_rules! shared_store_rules {
    ($domain:literal, $extra:literal) => {
        concat!(
            "domain: ",
            $domain,
            "
descriptors:
  # 5 per minute, the default sliding window (precision 10).
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 5}
  # 4 per hour: recovery probes, a fresh value per round.
  - key: probe
    rate_limit: {unit: hour, requests_per_unit: 4}
  # 5 per year: no sub-window closes while a test runs, so the store has no reason to
  # read anything in the background.
  - key: yearly
    rate_limit: {unit: year, requests_per_unit: 5}
  # 100 per hour: a limit a test reaches under load.
  - key: hundred
    rate_limit: {unit: hour, requests_per_unit: 100}
  # Never reached: every request for it needs the store.
  - key: busy
    rate_limit: {unit: hour, requests_per_unit: 1000000}
  # Accuracy runs: 200 per 2-second window (sub-windows of 200 ms).
  - key: acc
    rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 200}
",
            $crate::in_flight_rules!(),
            $crate::all_or_none_rules!(),
            $extra
        )
    };
}

/// `user`'s limit.
pub const USER_LIMIT: usize = 5;
/// `probe`'s limit.
pub const PROBE_LIMIT: usize = 4;
/// `yearly`'s limit.
pub const YEARLY_LIMIT: usize = 5;
/// `acc`'s limit, window and sub-window.
pub const ACC_LIMIT: u64 = 200;
/// See [`ACC_LIMIT`].
pub const ACC_WINDOW: Duration = Duration::from_secs(2);
/// See [`ACC_LIMIT`].
pub const ACC_SUB_WINDOW: Duration = Duration::from_millis(200);

/// How many of `n` requests for the descriptor `entry` of `domain`, one after the other,
/// are admitted.
pub async fn admitted(rls: &mut Rls, domain: &str, entry: (&str, &str), n: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..n {
        if code(&rls.check(domain, &[entry]).await) == Code::Ok {
            admitted += 1;
        }
    }
    admitted
}

/// Waits until `server` owes its store nothing: its debts charged by the settler, or
/// counted by the calls that timed out if the store ran them within their deadlines
/// after all (then they owe nothing).
pub async fn await_settled(server: &Server) {
    await_metric_at_most_zero(server, "tollgate_store_debt_units", "debts settled").await;
}

/// Waits until `server`'s gauge `metric` (units still to settle: `what`) is at most zero.
pub async fn await_metric_at_most_zero(server: &Server, metric: &str, what: &str) {
    until_async(what, Duration::from_secs(10), async || {
        match server.metric(metric).await {
            Some(n) if n <= 0.0 => Ok(()),
            other => Err(format!("{metric}: {other:?}")),
        }
    })
    .await;
}

/// 32 requests at once on fresh `yearly` counters of `domain` through `first` (a store
/// timeout its calls miss, `--on-store-error local`) while `hold(true)` holds the store
/// up, until `hold(false)`: their calls ride a few batches that miss the timeout. Every
/// request falls back (admitted from the local view), and once the store answers each
/// admission is charged once: `second`, which never saw the stall, admits the rest of
/// each counter's limit and no more. The batches are few: `calls` (the store's count of
/// counter calls, script calls or statements) grows by less than half the requests.
pub async fn a_stalled_batch_falls_back_for_every_request(
    (first, second): (&Server, &Server),
    domain: &str,
    hold: &mut dyn FnMut(bool),
    calls: &dyn Fn() -> u64,
) {
    const REQUESTS: usize = 32;
    let rls = first.client().await;
    let mut other = second.client().await;
    let before = blocking(calls);
    blocking(|| hold(true));
    let sent: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let (mut rls, domain) = (rls.clone(), domain.to_owned());
            tokio::spawn(async move {
                let value = format!("batched-{i}");
                timed_check(&mut rls, &domain, &[("yearly", &value)]).await
            })
        })
        .collect();
    let mut answers = Vec::with_capacity(REQUESTS);
    for answer in sent {
        answers.push(answer.await.expect("a request task"));
    }
    blocking(|| hold(false));
    for answer in &answers {
        assert_eq!(answer.result, Ok(Code::Ok), "admitted from the local view");
    }
    let fallbacks = first.metric("tollgate_store_fallbacks_total").await;
    assert_eq!(fallbacks, Some(REQUESTS as f64), "every request fell back");

    first.await_store_health(200, Duration::from_secs(10)).await;
    await_settled(first).await;
    let calls = blocking(calls) - before;
    assert!(
        calls < REQUESTS as u64 / 2,
        "{calls} counter calls for {REQUESTS} requests and their debts"
    );
    for i in 0..REQUESTS {
        let value = format!("batched-{i}");
        assert_eq!(
            admitted(&mut other, domain, ("yearly", &value), YEARLY_LIMIT).await,
            YEARLY_LIMIT - 1,
            "{value}: the fallback's admission is charged once"
        );
    }
}

/// Sends `user=ann` to `domain` until past [`USER_LIMIT`]: each admission says what is
/// left, then `denials` more requests are over the limit with nothing left.
pub async fn count_down_then_deny(rls: &mut Rls, domain: &str, denials: usize) {
    for remaining in (0..USER_LIMIT as u32).rev() {
        let status = rls.check(domain, &[("user", "ann")]).await;
        assert_eq!(code(&status), Code::Ok, "{status:?}");
        assert_eq!(status.limit_remaining, remaining, "{status:?}");
    }
    for _ in 0..denials {
        let status = rls.check(domain, &[("user", "ann")]).await;
        assert_eq!(code(&status), Code::OverLimit, "{status:?}");
        assert_eq!(status.limit_remaining, 0, "{status:?}");
    }
}

/// Waits at most `timeout` until `probe`'s limit is exact across `clients`, each round on
/// a fresh value `{tag}-{round}`; how long it took and how many rounds.
pub async fn await_exact_probe(
    clients: &mut [Rls],
    domain: &str,
    tag: &str,
    timeout: Duration,
) -> (Duration, usize) {
    await_exact_limiting(clients, domain, "probe", PROBE_LIMIT, timeout, |r| {
        format!("{tag}-{r}")
    })
    .await
}

/// Sends `user=shared` round-robin over `clients` until 4 past [`USER_LIMIT`]: the
/// instances share the counter, so exactly the limit is admitted.
pub async fn assert_instances_share_exactly(clients: &mut [Rls], domain: &str) {
    let got = round_robin(clients, domain, &[("user", "shared")], USER_LIMIT + 4).await;
    assert_eq!(
        got,
        exactly(USER_LIMIT, 4),
        "alternating over two instances"
    );
}

/// `hundred`'s limit.
pub const HUNDRED_LIMIT: u64 = 100;

/// A budget (`hundred=VALUE`) used up through the first client, seen so by the second
/// (whose instance's local view then denies it), then refunded through the first: the
/// second admits again once it heard (the first decrease of a counter travels as an
/// announcement). From then on, the very next request through the second after each
/// refund is decided on the refunded count.
pub async fn assert_refunds_seen_at_once(clients: &mut [Rls], domain: &str, value: &str) {
    let entries = [("hundred", value)];
    let used = clients[0]
        .check_own_hits(domain, &entries, HUNDRED_LIMIT, false)
        .await;
    assert_eq!(code(&used), Code::Ok, "{used:?}");
    let denied = clients[1].check_own_hits(domain, &entries, 40, false).await;
    assert_eq!(code(&denied), Code::OverLimit, "used up: {denied:?}");
    let refunded = clients[0].check_own_hits(domain, &entries, 40, true).await;
    assert_eq!(code(&refunded), Code::Ok, "{refunded:?}");
    let second = &mut clients[1];
    until_async(
        "the first refund heard",
        Duration::from_secs(2),
        async || {
            let status = second.check_own_hits(domain, &entries, 40, false).await;
            match code(&status) {
                Code::Ok => Ok(()),
                _ => Err(format!("{status:?}")),
            }
        },
    )
    .await;
    for round in 0..20 {
        let refunded = clients[0].check_own_hits(domain, &entries, 40, true).await;
        assert_eq!(code(&refunded), Code::Ok, "round {round}: {refunded:?}");
        let charged = clients[1].check_own_hits(domain, &entries, 40, false).await;
        assert_eq!(
            code(&charged),
            Code::Ok,
            "round {round}, 40 refunded: {charged:?}"
        );
        assert_eq!(charged.limit_remaining, 0, "round {round}: {charged:?}");
    }
}
