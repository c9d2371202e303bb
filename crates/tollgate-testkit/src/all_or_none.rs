//! All or none across instances of a shared store: the checks the Redis and PostgreSQL
//! suites make on the `org`, `team` and `member` rules of [`all_or_none_rules`].

use std::time::Duration;

use envoy_types::pb::google::protobuf::UInt64Value;

use crate::grpc::{Code, RateLimitRequest, Rls, code, overall, request};
use crate::process::blocking;
use crate::shared_store::{await_metric_at_most_zero, await_settled};
use crate::tollgate::Server;
use crate::wait::until_async;

/// The limits of `org`, `team` and `member`, a year each (nothing expires while a test
/// runs, and none is large enough to lease).
pub const LEVEL_LIMITS: [u32; 3] = [100, 50, 10];

/// An organisation, its teams and their members (YAML list entries, two spaces in), a
/// string literal: 100, 50 and 10 a year.
#[macro_export]
macro_rules! all_or_none_rules {
    () => {
        "  - key: org
    rate_limit: {unit: year, requests_per_unit: 100}
    descriptors:
      - key: team
        rate_limit: {unit: year, requests_per_unit: 50}
        descriptors:
          - key: member
            rate_limit: {unit: year, requests_per_unit: 10}
"
    };
}

/// `[org]`, `[org, team]` and `[org, team, member]` of `domain`, each with `n` hits of its
/// own (0: a check), given back when `negative`.
pub fn levels(
    domain: &str,
    (org, team, member): (&str, &str, &str),
    n: u64,
    negative: bool,
) -> RateLimitRequest {
    let mut req = request(
        domain,
        &[
            &[("org", org)],
            &[("org", org), ("team", team)],
            &[("org", org), ("team", team), ("member", member)],
        ],
    );
    for d in &mut req.descriptors {
        d.hits_addend = Some(UInt64Value { value: n });
        d.is_negative_hits = negative;
    }
    req
}

/// What each level of `who` has left, checked through `rls`.
pub async fn left(rls: &mut Rls, domain: &str, who: (&str, &str, &str)) -> [u32; 3] {
    let resp = rls.ok(levels(domain, who, 0, false)).await;
    let mut left = [0; 3];
    for (slot, status) in left.iter_mut().zip(&resp.statuses) {
        *slot = status.limit_remaining;
    }
    left
}

/// One request for `who`'s three levels through `rls`: the overall code and each level's.
pub async fn hit(rls: &mut Rls, domain: &str, who: (&str, &str, &str)) -> (Code, [Code; 3]) {
    let resp = rls.ok(levels(domain, who, 1, false)).await;
    let mut codes = [Code::Ok; 3];
    for (slot, status) in codes.iter_mut().zip(&resp.statuses) {
        *slot = code(status);
    }
    (overall(&resp), codes)
}

/// The hierarchy of organisation `org` across `clients` (each request through
/// the next): a member refused at 10 leaves team and organisation as they were; a team
/// exhausted by its other members refuses a member who had room, counting nothing; a
/// refund gives back every level; every instance reads the same counts.
pub async fn assert_hierarchy_exact(clients: &mut [Rls], domain: &str, org: &str) {
    let n = clients.len();
    let mut next = 0;
    let mut client = || {
        next += 1;
        next % n
    };
    let m = (org, "t", "m");
    for _ in 0..10 {
        assert_eq!(hit(&mut clients[client()], domain, m).await.0, Code::Ok);
    }
    for _ in 0..5 {
        let (answer, codes) = hit(&mut clients[client()], domain, m).await;
        assert_eq!(answer, Code::OverLimit);
        assert_eq!(
            codes,
            [Code::Ok, Code::Ok, Code::OverLimit],
            "the member is over"
        );
    }
    for (i, rls) in clients.iter_mut().enumerate() {
        assert_eq!(
            left(rls, domain, m).await,
            [90, 40, 0],
            "instance {i}: the refused member moved neither team nor organisation"
        );
    }
    for member in ["a", "b", "c", "d"] {
        for _ in 0..10 {
            let got = hit(&mut clients[client()], domain, (org, "t", member)).await;
            assert_eq!(got.0, Code::Ok, "member {member}");
        }
    }
    let e = (org, "t", "e");
    let (answer, codes) = hit(&mut clients[client()], domain, e).await;
    assert_eq!(answer, Code::OverLimit, "the team has spent its 50");
    assert_eq!(codes, [Code::Ok, Code::OverLimit, Code::Ok]);
    for (i, rls) in clients.iter_mut().enumerate() {
        assert_eq!(left(rls, domain, e).await, [50, 0, 10], "instance {i}");
    }
    // Another team of the organisation still has its own 50.
    let other = (org, "u", "e");
    assert_eq!(hit(&mut clients[client()], domain, other).await.0, Code::Ok);
    // A refund names every level and frees each.
    let refund = clients[client()].ok(levels(domain, m, 4, true)).await;
    assert_eq!(overall(&refund), Code::Ok);
    for (i, rls) in clients.iter_mut().enumerate() {
        assert_eq!(left(rls, domain, m).await, [53, 4, 4], "instance {i}");
        assert_eq!(left(rls, domain, other).await, [53, 49, 9], "instance {i}");
    }
}

/// Requests of a member at its limit, refused through `first` (a store timeout its calls
/// miss) while `hold(true)` holds the store up, until `hold(false)`: each is refused, or
/// failed with `--on-store-error error`, never admitted; once the store answers and
/// `first` owes it nothing, both instances read team and organisation as they were. What
/// the refused requests counted while the store was away was given back (to the view at
/// once, to the store once it answered), on every counter.
pub async fn assert_refused_while_stalled_move_nothing(
    (first, second): (&Server, &Server),
    domain: &str,
    org: &str,
    hold: &mut dyn FnMut(bool),
) {
    let mut rls = first.client().await;
    let mut other = second.client().await;
    let m = (org, "t", "m");
    // Through `first`, so that its view knows the member is at its limit. Its timeout may
    // be missed on a loaded machine: a request that failed counted nothing once settled.
    let mut admitted = 0;
    for _ in 0..100 {
        match rls.call(levels(domain, m, 1, false)).await {
            Ok(resp) if overall(&resp) == Code::Ok => admitted += 1,
            Ok(resp) => panic!("the member had room: {resp:?}"),
            Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable),
        }
        if admitted == 10 {
            break;
        }
    }
    await_given_back(first).await;
    assert_eq!(left(&mut other, domain, m).await, [90, 40, 0]);
    blocking(|| hold(true));
    for i in 0..5 {
        match rls.call(levels(domain, m, 1, false)).await {
            Ok(resp) => assert_eq!(overall(&resp), Code::OverLimit, "request {i}: {resp:?}"),
            Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "request {i}"),
        }
    }
    blocking(|| hold(false));
    first.await_store_health(200, Duration::from_secs(10)).await;
    await_given_back(first).await;
    assert_eq!(
        left(&mut other, domain, m).await,
        [90, 40, 0],
        "the instance that never stalled"
    );
    let read = async || match rls.call(levels(domain, m, 0, false)).await {
        Ok(resp) => Ok(resp
            .statuses
            .iter()
            .map(|s| s.limit_remaining)
            .collect::<Vec<_>>()),
        Err(status) => Err(format!("{status:?}")),
    };
    let (stalled, _) = until_async(
        "a read through the instance that stalled",
        Duration::from_secs(10),
        read,
    )
    .await;
    assert_eq!(stalled, [90, 40, 0], "the instance that stalled");
}

/// Waits until `server` owes its store nothing ([`await_settled`]) and has credited it
/// every unit it gave back without it.
pub async fn await_given_back(server: &Server) {
    await_settled(server).await;
    await_metric_at_most_zero(server, "tollgate_store_credit_units", "credits given back").await;
}
