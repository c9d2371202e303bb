//! In-flight rules across instances: the checks the memory, Redis and PostgreSQL suites
//! make of them, on the `slots` and `leaky` rules of [`in_flight_rules`].

use std::time::{Duration, Instant};

use crate::grpc::{Code, Rls, code, until_reset};
use crate::tollgate::Server;
use crate::wait::until_async;

/// Slots held at most at once by `slots` and `leaky`.
pub const MAX_IN_FLIGHT: u32 = 2;
/// How long a `leaky` slot not released is held.
pub const LEAK_EXPIRY: Duration = Duration::from_millis(1_500);

/// The `slots` and `leaky` rules (YAML list entries, two spaces in), a string literal:
/// 2 at once, a slot not released freeing itself after an hour, or after
/// [`LEAK_EXPIRY`].
#[macro_export]
macro_rules! in_flight_rules {
    () => {
        "  - key: slots
    in_flight: {max: 2, expire_after: 1h}
  - key: leaky
    in_flight: {max: 2, expire_after: 1500ms}
"
    };
}

/// Takes one slot of `entries` through `rls`: its status code and what remains.
async fn take(rls: &mut Rls, domain: &str, entries: &[(&str, &str)]) -> (Code, u32) {
    let status = rls.check_own_hits(domain, entries, 1, false).await;
    let limit = status.current_limit.as_ref().map(|l| l.requests_per_unit);
    assert_eq!(
        limit,
        Some(MAX_IN_FLIGHT),
        "the answer carries max: {status:?}"
    );
    (code(&status), status.limit_remaining)
}

/// Two slots of `slots=value` taken through the first client, the third refused through
/// the last; then, round after round, a release through one instance lets the very next
/// acquisition through the other in, and no more.
pub async fn assert_slots_shared(clients: &mut [Rls], domain: &str, value: &str) {
    let entries = [("slots", value)];
    let last = clients.len() - 1;
    assert_eq!(take(&mut clients[0], domain, &entries).await, (Code::Ok, 1));
    assert_eq!(take(&mut clients[0], domain, &entries).await, (Code::Ok, 0));
    let third = take(&mut clients[last], domain, &entries).await;
    assert_eq!(third, (Code::OverLimit, 0), "the third in flight");
    for round in 0..10 {
        let (releasing, taking) = match round % 2 {
            0 => (last, 0),
            _ => (0, last),
        };
        let released = clients[releasing]
            .check_own_hits(domain, &entries, 1, true)
            .await;
        assert_eq!(code(&released), Code::Ok, "round {round}: {released:?}");
        assert_eq!(released.limit_remaining, 1, "round {round}: {released:?}");
        let taken = take(&mut clients[taking], domain, &entries).await;
        assert_eq!(
            taken,
            (Code::Ok, 0),
            "round {round}: released, taken at once"
        );
        let over = take(&mut clients[releasing], domain, &entries).await;
        assert_eq!(
            over,
            (Code::OverLimit, 0),
            "round {round}: one released, one taken"
        );
    }
}

/// Two slots of `leaky=value` taken and never released: refused until [`LEAK_EXPIRY`]
/// after they were taken, when they free themselves.
pub async fn assert_leaked_slots_free_themselves(clients: &mut [Rls], domain: &str, value: &str) {
    let entries = [("leaky", value)];
    let last = clients.len() - 1;
    let taken = Instant::now();
    for _ in 0..MAX_IN_FLIGHT {
        assert_eq!(take(&mut clients[0], domain, &entries).await.0, Code::Ok);
    }
    let refused = clients[last]
        .check_own_hits(domain, &entries, 1, false)
        .await;
    assert_eq!(code(&refused), Code::OverLimit, "{refused:?}");
    // Answers give whole seconds, rounded up.
    let reset = until_reset(&refused);
    assert!(
        reset <= LEAK_EXPIRY + Duration::from_millis(500),
        "freed within expire_after: {refused:?}"
    );
    let rls = &mut clients[last];
    until_async(
        "the leaked slots freed",
        LEAK_EXPIRY * 10,
        async || match take(rls, domain, &entries).await {
            (Code::Ok, _) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    )
    .await;
    // The store's clock and this one agree to well within a tenth of the expiry.
    let freed_after = taken.elapsed();
    assert!(
        freed_after >= LEAK_EXPIRY.mul_f64(0.9),
        "freed after {freed_after:?}, before expire_after"
    );
}

/// Through two instances on one store, the `leaky=value` counter: the first takes both
/// slots, the second releases one, then asks for two until the leaked one expired. Each
/// instance's in-flight series of the `leaky` rule say what it saw, the second's held
/// as the store answered after the other instance's acquisitions.
pub async fn assert_in_flight_series(servers: &[Server], clients: &mut [Rls], domain: &str) {
    let entries = [("leaky", "carl")];
    for _ in 0..MAX_IN_FLIGHT {
        assert_eq!(take(&mut clients[0], domain, &entries).await.0, Code::Ok);
    }
    let released = clients[1].check_own_hits(domain, &entries, 1, true).await;
    assert_eq!(code(&released), Code::Ok, "{released:?}");
    let rls = &mut clients[1];
    until_async(
        "the leaked slot expired and two taken",
        LEAK_EXPIRY * 10,
        async || {
            let two = rls.check_own_hits(domain, &entries, 2, false).await;
            match code(&two) {
                Code::Ok => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
    let series = |name: &str| {
        format!("tollgate_in_flight_{name}{{domain=\"{domain}\",key1=\"leaky\",key2=\"\"}}")
    };
    let mut seen = Vec::new();
    for server in servers {
        let mut values = Vec::new();
        for name in ["acquired_total", "released_total", "expired_total", "held"] {
            values.push(server.metric(&series(name)).await);
        }
        seen.push(values);
    }
    let all = |a, r, e, h| vec![Some(a), Some(r), Some(e), Some(h)];
    assert_eq!(
        seen,
        [all(2.0, 0.0, 0.0, 2.0), all(2.0, 1.0, 1.0, 2.0)],
        "acquired, released, expired, held on each instance"
    );
}
