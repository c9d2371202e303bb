//! Every unit settles exactly once: calls that miss their deadline on a real store (Redis
//! paused, PostgreSQL's table locked), then heal. What the instances admitted, charged and
//! gave back must be what the store counts once every late call is heard from, and an
//! in-flight counter never holds a slot for a request answered without one.

use std::sync::Arc;
use std::time::Duration;

use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::process::Process;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::wait::{room_in_window, until_async};

use super::{Shared, behaviour, budget, instances};
use crate::algo::Hits;
use crate::limit::{Algorithm, Limit};
use crate::store::DecidedBy;
use crate::store::shared::SharedStore;

/// The store timeout of the stall tests: met by a healthy store on a busy host, so that
/// only the stall makes calls miss it.
const STALL_TIMEOUT: Duration = Duration::from_millis(200);

/// The store's calls made to run late: Redis's writes paused (on every node of a
/// Cluster), or PostgreSQL's counters locked, until [`Stalled::heal`].
pub(super) enum Stalled<'a> {
    Redis(Vec<&'a RedisServer>),
    Postgres(Process),
}

impl<'a> Stalled<'a> {
    pub(super) fn begin(shared: &Shared<'a>) -> Self {
        let paused = |nodes: Vec<&'a RedisServer>| {
            for node in &nodes {
                node.query::<String>(&["CLIENT", "PAUSE", "30000", "WRITE"]);
            }
            Self::Redis(nodes)
        };
        match shared {
            Shared::Redis(redis) => paused(vec![*redis]),
            Shared::Cluster(cluster) => paused(cluster.nodes.iter().collect()),
            Shared::Postgres(pg) => {
                Self::Postgres(pg.hold("BEGIN; LOCK TABLE tollgate_counters IN EXCLUSIVE MODE;"))
            }
        }
    }

    /// The store runs the calls it held, each after its deadline.
    pub(super) fn heal(self) {
        match self {
            Self::Redis(nodes) => {
                for node in nodes {
                    node.query::<String>(&["CLIENT", "UNPAUSE"]);
                }
            }
            Self::Postgres(held) => drop(held),
        }
    }
}

/// Waits until every instance has heard from its late calls and owes nothing.
pub(super) async fn settled(fleet: &[Arc<SharedStore>]) {
    until_async(
        "every call heard from and settled",
        Duration::from_secs(20),
        async || {
            for store in fleet {
                assert!(
                    store.wait_up(Duration::from_secs(10)).await,
                    "the store answers"
                );
            }
            match fleet.iter().all(|store| store.ledger.is_settled()) {
                true => Ok(()),
                false => Err(format!(
                    "ledgers: {:?}",
                    fleet.iter().map(|s| s.ledger.stats()).collect::<Vec<_>>()
                )),
            }
        },
    )
    .await;
}

/// What the store counts on `key`, read with a check by an instance of its own that
/// never saw a stall and waits for the store as long as it takes.
pub(super) async fn stored(shared: &Shared<'_>, key: &str, limits: &[Limit]) -> u64 {
    let reader = instances(shared, 1, behaviour(false, Duration::from_secs(5))).await;
    let peek = reader[0].peek(key, limits, 0).await;
    let shared = peek
        .shared
        .expect("a shared store")
        .expect("the store answers");
    u64::from(limits[0].requests_per_unit).saturating_sub(shared.limits[0].remaining)
}

/// A reservation of 100, then its refund and a charge of 40 while the store runs every
/// call late: the instance answers both, and once the store heals it counts 40, read by
/// an instance that never saw the stall.
async fn a_refund_and_a_charge_in_a_stall_land_once(shared: Shared<'_>) {
    room_in_window(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let fleet = instances(&shared, 1, behaviour(false, STALL_TIMEOUT)).await;
    let a = &fleet[0];
    let key = "exact|tenant=stall#fixed";
    let limits = budget(Algorithm::FixedWindow);
    let (reserved, _) = a
        .apply(key, &limits, Hits::Consume(100))
        .await
        .expect("decided");
    assert!(reserved.decision.admitted);
    let stall = Stalled::begin(&shared);
    for hits in [Hits::Refund(100), Hits::Charge(40)] {
        let (_, by) = a.apply(key, &limits, hits).await.expect("decided locally");
        assert_eq!(
            by,
            DecidedBy::Fallback,
            "{hits:?} while the store is stalled"
        );
    }
    stall.heal();
    settled(&fleet).await;
    assert_eq!(
        stored(&shared, key, &limits).await,
        40,
        "the refund and the charge landed once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_and_a_charge_in_a_stall_land_once_on_redis() {
    let redis = RedisServer::start();
    a_refund_and_a_charge_in_a_stall_land_once(Shared::Redis(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refund_and_a_charge_in_a_stall_land_once_on_postgres() {
    let pg = PostgresServer::start();
    a_refund_and_a_charge_in_a_stall_land_once(Shared::Postgres(&pg)).await;
}

/// Ten rounds of a reservation settled at stream end (reserve 100; refund 100 and charge
/// 40) with a store timeout of 1 ms, which most calls miss on any host: the store counts
/// 400 once every call is heard from.
async fn reservations_settled_with_a_1ms_timeout_converge(shared: Shared<'_>) {
    room_in_window(Duration::from_secs(3600), Duration::from_secs(60)).await;
    let fleet = instances(&shared, 2, behaviour(false, Duration::from_millis(1))).await;
    let key = "exact|tenant=hurried#fixed";
    let limits = budget(Algorithm::FixedWindow);
    let mut charged = 0;
    for round in 0..10 {
        let store = &fleet[round % 2];
        let (reserved, _) = store
            .apply(key, &limits, Hits::Consume(100))
            .await
            .expect("decided");
        if !reserved.decision.admitted {
            continue;
        }
        store
            .apply(key, &limits, Hits::Refund(100))
            .await
            .expect("decided");
        store
            .apply(key, &limits, Hits::Charge(40))
            .await
            .expect("decided");
        charged += 40;
    }
    assert!(charged > 0, "some reservations were admitted");
    settled(&fleet).await;
    assert_eq!(stored(&shared, key, &limits).await, charged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_settled_with_a_1ms_timeout_converge_on_redis() {
    let redis = RedisServer::start();
    reservations_settled_with_a_1ms_timeout_converge(Shared::Redis(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reservations_settled_with_a_1ms_timeout_converge_on_postgres() {
    let pg = PostgresServer::start();
    reservations_settled_with_a_1ms_timeout_converge(Shared::Postgres(&pg)).await;
}

/// Five slots of five held through the store, then ten acquisitions and two releases
/// while it runs every call late: no acquisition is admitted past the five this instance
/// knows are held, none confirms a slot, and a slot released meanwhile is free here. Once
/// the store heals it holds exactly what was decided: the five, less the two released,
/// plus the one admitted without it (which frees itself after `expire_after`, since no
/// release will name it); and it admits one more, to five.
async fn in_flight_holds_max_in_a_stall(shared: Shared<'_>) {
    let fleet = instances(&shared, 1, behaviour(false, STALL_TIMEOUT)).await;
    let a = &fleet[0];
    let key = "exact|user=busy#i";
    let limits = [Limit::in_flight(5, Duration::from_secs(3600)).expect("a valid limit")];
    let acquire = async || {
        a.apply(key, &limits, Hits::Consume(1))
            .await
            .expect("decided")
    };
    for _ in 0..5 {
        let (held, by) = acquire().await;
        assert!(held.decision.admitted && by == DecidedBy::Store && held.in_flight.is_some());
    }
    let stall = Stalled::begin(&shared);
    for _ in 0..10 {
        let (verdict, by) = acquire().await;
        assert_eq!(by, DecidedBy::Fallback);
        assert!(
            !verdict.decision.admitted,
            "five of five are held: {verdict:?}"
        );
        assert!(
            verdict.in_flight.is_none(),
            "no slot is confirmed without the store"
        );
    }
    for _ in 0..2 {
        let (_, by) = a
            .apply(key, &limits, Hits::Refund(1))
            .await
            .expect("decided");
        assert_eq!(by, DecidedBy::Fallback);
    }
    let (admitted, _) = acquire().await;
    assert!(
        admitted.decision.admitted,
        "a slot released here is free here"
    );
    assert!(admitted.in_flight.is_none(), "but not confirmed");
    stall.heal();
    settled(&fleet).await;
    assert_eq!(
        stored(&shared, key, &limits).await,
        4,
        "5 - 2 released + 1 admitted without it"
    );
    let (fifth, _) = acquire().await;
    assert!(
        fifth.decision.admitted && fifth.in_flight.is_some(),
        "{fifth:?}"
    );
    let (sixth, by) = acquire().await;
    assert!(
        !sixth.decision.admitted && by == DecidedBy::Store,
        "{sixth:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_holds_max_in_a_stall_on_redis() {
    let redis = RedisServer::start();
    in_flight_holds_max_in_a_stall(Shared::Redis(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_holds_max_in_a_stall_on_postgres() {
    let pg = PostgresServer::start();
    in_flight_holds_max_in_a_stall(Shared::Postgres(&pg)).await;
}
