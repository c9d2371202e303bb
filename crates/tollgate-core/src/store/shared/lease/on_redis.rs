//! Leases through a whole `SharedStore` on a real redis-server: what a take or a
//! give-back does to the debts, the calls in flight, the metrics and the local view. The
//! local clock is a `ManualClock`, so the periods that make a counter hot are stepped.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::wait::{room_in_window, until_async};

use super::{LeasePolicy, PERIOD};
use crate::algo::Hits;
use crate::clock::{ManualClock, Timestamp, nanos_of};
use crate::limit::{Algorithm, Limit};
use crate::store::redis::{RedisConfig, RedisTarget, RedisTls};
use crate::store::shared::ran::counted;
use crate::store::shared::{SharedBehaviour, SharedStore};
use crate::store::{Capacity, DecidedBy, OnStoreError, StoreError};
use crate::unit::Unit;

const KEY: &str = "domain#hot";

/// A store on `redis` leasing up to `max_fraction` of a limit, waiting `timeout` for it,
/// and the local clock it reads.
async fn store(
    redis: &RedisServer,
    max_fraction: f64,
    timeout: Duration,
) -> (Arc<SharedStore>, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_nanos(1_000 * nanos_of(PERIOD)));
    let config = RedisConfig {
        target: RedisTarget::Single { url: redis.url() },
        tls: RedisTls::default(),
        key_prefix: String::new(),
        behaviour: SharedBehaviour {
            timeout,
            on_error: OnStoreError::Local,
            local_capacity: Capacity::default(),
            leases: LeasePolicy {
                enabled: true,
                max_fraction,
            },
        },
    };
    let store = SharedStore::redis(config, Arc::new(clock.clone()), Duration::from_secs(60));
    assert!(
        store.wait_up(Duration::from_secs(10)).await,
        "redis answers"
    );
    (store, clock)
}

fn fixed(requests: u32, unit: Unit) -> Vec<Limit> {
    let limit = Limit::new(requests, unit).with_algorithm(Algorithm::FixedWindow);
    vec![limit.expect("a fixed window")]
}

/// `count` requests of one unit at the clock's time; how many were admitted.
async fn requests(store: &Arc<SharedStore>, limits: &[Limit], count: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..count {
        let answer = store.apply(KEY, limits, Hits::Consume(1)).await;
        if answer.is_ok_and(|(verdict, _)| verdict.decision.admitted) {
            admitted += 1;
        }
    }
    admitted
}

/// Makes the counter hot: `count` requests in one period, and the clock on to the next,
/// where the first request takes a block of about `count`.
async fn heat(store: &Arc<SharedStore>, clock: &ManualClock, limits: &[Limit], count: u64) {
    assert_eq!(requests(store, limits, count).await, count);
    clock.advance(PERIOD);
}

/// Units counted as given back so far.
fn returned(store: &SharedStore) -> u64 {
    let returned = &store.leases.counts.units_returned;
    returned.load(super::Ordering::Relaxed)
}

/// A counter of `requests` an hour on a fresh redis-server, made hot with `count`
/// requests ([`heat`]), with a minute of the hour left for the test: the server, the
/// store leasing up to `max_fraction` and waiting `timeout`, its clock, the limits.
async fn hot_in_an_hour(
    requests: u32,
    (max_fraction, timeout): (f64, Duration),
    count: u64,
) -> (RedisServer, Arc<SharedStore>, ManualClock, Vec<Limit>) {
    room_in_window(Duration::from_secs(3_600), Duration::from_secs(60)).await;
    let redis = RedisServer::start();
    let (store, clock) = store(&redis, max_fraction, timeout).await;
    let limits = fixed(requests, Unit::Hour);
    heat(&store, &clock, &limits, count).await;
    (redis, store, clock, limits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_out_counts_every_unit_it_asks_for_in_flight() {
    let (mut redis, store, _clock, limits) =
        hot_in_an_hour(1_000, (0.5, Duration::from_secs(2)), 5).await;
    redis.freeze();
    let taking = tokio::spawn({
        let (store, limits) = (store.clone(), limits.clone());
        async move { store.apply(KEY, &limits, Hits::Consume(1)).await.is_ok() }
    });
    let (units, _) = until_async(
        "a take in flight",
        Duration::from_secs(2),
        async || match store.ledger.in_flight(KEY) {
            0 => Err("none".into()),
            units => Ok(units),
        },
    )
    .await;
    redis.thaw();
    assert!(taking.await.is_ok_and(|answered| answered));
    assert_eq!(units, 5, "the take asks for a block of 5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_that_times_out_is_counted_as_one() {
    let (mut redis, store, _clock, limits) =
        hot_in_an_hour(1_000, (0.5, Duration::from_millis(200)), 5).await;
    let before = store.stats().shared.expect("shared stats");
    redis.freeze();
    let leased = store.lease(KEY, &limits, 1).await;
    redis.thaw();
    assert!(
        leased.is_none(),
        "no answer: the request goes the usual way"
    );
    let after = store.stats().shared.expect("shared stats");
    assert_eq!(after.timeouts, before.timeouts + 1);
    assert_eq!(after.latency.count, before.latency.count + 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_take_carries_what_the_counter_owes() {
    let (_redis, store, _clock, limits) =
        hot_in_an_hour(100, (0.5, Duration::from_secs(1)), 3).await;
    // 95 units admitted while the store did not answer: in the view, and owed.
    let now = store.now();
    let owed = (Hits::Consume(95), 0);
    let fallback = store.fall_back(
        KEY,
        &limits,
        owed,
        now,
        (StoreError::Timeout, store.behaviour.on_error),
        |v| {
            let decided = counted(Hits::Consume(95), v.decision.admitted);
            store.ledger.owe(KEY, &limits, decided, now);
        },
    );
    assert!(fallback.is_ok_and(|v| v.decision.admitted));
    // 98 of 100 are used: whatever leases or the store decide, 2 more at most.
    let admitted = requests(&store, &limits, 10).await;
    assert!(admitted <= 2, "admitted {admitted} past 98 of 100");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn units_given_back_after_their_window_are_not_counted_returned() {
    let window = Duration::from_secs(1);
    room_in_window(window, Duration::from_millis(500)).await;
    let redis = RedisServer::start();
    let (store, clock) = store(&redis, 0.01, Duration::from_secs(1)).await;
    // Blocks of up to 10 in windows of a second.
    let limits = fixed(1_000, Unit::Second);
    heat(&store, &clock, &limits, 5).await;
    assert_eq!(requests(&store, &limits, 1).await, 1);
    assert_eq!(store.leases.counts.taken.load(super::Ordering::Relaxed), 1);
    // The window ends (Redis runs on this machine's clock): the store no longer takes
    // the block's units back.
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("a clock after 1970");
    let into = Duration::from_nanos(nanos_of(since_epoch) % nanos_of(window));
    tokio::time::sleep(window - into + Duration::from_millis(50)).await;
    store.give_back_leases(Duration::from_secs(1)).await;
    let returned = returned(&store);
    assert_eq!(returned, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_is_adopted_into_the_local_view() {
    let (_redis, store, _clock, limits) =
        hot_in_an_hour(100, (0.5, Duration::from_secs(1)), 60).await;
    // 60 through the store, then a take of what is left: 40, the view full.
    assert_eq!(requests(&store, &limits, 1).await, 1);
    assert_eq!(
        store
            .leases
            .counts
            .units_leased
            .load(super::Ordering::Relaxed),
        40
    );
    // 39 given back: the store admits again, and the view must not deny for it.
    store.give_back_leases(Duration::from_secs(1)).await;
    let returned = returned(&store);
    assert_eq!(returned, 39);
    let answer = store.apply(KEY, &limits, Hits::Consume(1)).await;
    let (verdict, by) = answer.expect("an answer");
    assert_eq!((verdict.decision.admitted, by), (true, DecidedBy::Store));
}
