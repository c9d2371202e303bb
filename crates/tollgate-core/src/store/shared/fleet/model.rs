//! The fleet model: seeded random sequences of hits, checks, charges, refunds, resets,
//! limit changes (a runtime override: the same counter under another limit) and store
//! pauses across three instances on one real store, each decision compared with one exact
//! counter per key under the limit in force; on fixed and sliding windows, and on
//! in-flight slots (hits acquire, refunds release, a charge is a hit: a slot is taken only
//! if it fits).
//!
//! The exact counter is an interval: a request the store did not answer in time may or
//! may not have been counted when it ran late, so it widens the interval instead of
//! guessing. Every decision must hold for the whole interval:
//! - an admission never takes the count past the limit (from the interval's low end),
//!   but for units of lease blocks taken before a charge took the count past it, at
//!   most [`LEASE_LEEWAY`] of them;
//! - a refusal by the store or a local view is one the exact counter would make, but for
//!   [`LEASE_LEEWAY`]: units leased to instances are counted in the store before they
//!   are admitted (docs/STORES.md, "Leases"). A refusal decided per `--on-store-error` is the
//!   setting's (here: deny) and is not held to it.

use std::sync::Arc;
use std::time::Duration;

use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::rng::Rng;
use tollgate_testkit::wait::{POLL, room_in_window};

use super::{Shared, instances, seeds};
use crate::algo::Hits;
use crate::limit::{Algorithm, Limit};
use crate::store::shared::lease::LeasePolicy;
use crate::store::shared::{SharedBehaviour, SharedStore};
use crate::store::{Capacity, DecidedBy, OnStoreError};
use crate::unit::Unit;

/// Every key's limit, per hour: small enough that sequences reach it often. An override
/// lowers it down to [`LOWEST_LIMIT`] and raises it back, keeping the lease blocks (a
/// fraction of the limit) within [`LEASE_LEEWAY`].
const LIMIT: u64 = 200;
const LOWEST_LIMIT: u64 = 100;
/// The largest lease block, as a fraction of the limit.
const LEASE_FRACTION: f64 = 0.05;
/// Instances in the fleet.
const INSTANCES: usize = 3;
/// Refusals allowed while the exact count is this close to the limit: every instance
/// may hold a block of its lease.
const LEASE_LEEWAY: u64 = INSTANCES as u64 * (LIMIT as f64 * LEASE_FRACTION) as u64;
/// How long a request waits for the store; a paused store makes every request wait it.
const TIMEOUT: Duration = Duration::from_millis(150);
/// Steps per sequence.
const STEPS: usize = 250;

/// One key's exact count, as an interval, and the units spent from lease blocks while
/// it was over the limit since it last went down.
#[derive(Debug, Clone, Copy, Default)]
struct Exact {
    low: u64,
    high: u64,
    spent_over: u64,
}

impl Exact {
    fn add(&mut self, n: u64) {
        self.low += n;
        self.high += n;
    }

    fn take(&mut self, n: u64) {
        self.low = self.low.saturating_sub(n);
        self.high = self.high.saturating_sub(n);
        self.spent_over = 0;
    }
}

/// What a step does.
#[derive(Debug, Clone, Copy)]
enum Step {
    Consume(u64),
    Check,
    Charge(u64),
    Refund(u64),
    Reset,
    /// An override sets the key's limit to this, mid-window.
    SetLimit(u64),
    /// The store stops answering for a few requests (Redis only).
    Pause,
}

fn step(rng: &mut Rng, pauses: bool) -> Step {
    let units = |rng: &mut Rng, most: usize| rng.below(most) as u64 + 1;
    match rng.below(100) {
        0..50 => Step::Consume(units(rng, 40)),
        50..58 => Step::Check,
        58..68 => Step::Charge(units(rng, 80)),
        68..90 => Step::Refund(units(rng, 120)),
        90..92 => {
            Step::SetLimit(LOWEST_LIMIT + rng.below((LIMIT - LOWEST_LIMIT) as usize + 1) as u64)
        }
        92..96 => Step::Reset,
        _ if pauses => Step::Pause,
        _ => Step::Consume(1),
    }
}

/// The fleet, its keys and their exact counts.
struct Model<'a> {
    fleet: Vec<Arc<SharedStore>>,
    algorithm: Algorithm,
    /// Each key's limit in force, and its limits as the stores are given them.
    limit: [u64; 2],
    limits: [Vec<Limit>; 2],
    keys: [String; 2],
    exact: [Exact; 2],
    redis: Option<&'a RedisServer>,
    seed: u64,
}

impl Model<'_> {
    /// Runs one step of instance `i` on key `k`, checking its decision.
    async fn run(&mut self, i: usize, k: usize, step: Step) {
        if let Step::SetLimit(n) = step {
            self.limit[k] = n;
            self.limits[k] = limits_of(self.algorithm, n);
            return;
        }
        let (store, key) = (&self.fleet[i], &self.keys[k]);
        let (limit, limits) = (self.limit[k], &self.limits[k]);
        let slots = self.algorithm == Algorithm::Slots;
        let hits = match step {
            Step::Consume(n) => Hits::Consume(n),
            Step::Charge(n) if slots => Hits::Consume(n),
            Step::Check => Hits::Check,
            Step::Charge(n) => Hits::Charge(n),
            // What was counted, at most, as a budget refunds: a refund of more would also
            // take back units leased and not yet admitted, which the exact counter lacks.
            Step::Refund(n) => match n.min(self.exact[k].low) {
                0 => return,
                n => Hits::Refund(n),
            },
            Step::Reset => {
                store.reset(key).await.expect("a reset reaches the store");
                self.exact[k] = Exact::default();
                self.settle(k).await;
                return;
            }
            Step::Pause => return self.pause(i, k).await,
            Step::SetLimit(_) => return,
        };
        let (verdict, by) = store
            .apply(key, limits, hits)
            .await
            .expect("decided per --on-store-error");
        let admitted = verdict.decision.admitted;
        let exact = &mut self.exact[k];
        let context = format!(
            "seed {}, {step:?} on instance {i}, {by:?}, {exact:?}, limit {limit}",
            self.seed
        );
        if by == DecidedBy::Fallback {
            // The store may still count it, late; a refund owed is left unknown too.
            match hits {
                Hits::Consume(n) | Hits::Charge(n) => exact.high += n,
                Hits::Refund(n) => exact.low = exact.low.saturating_sub(n),
                Hits::Check => {}
            }
            return;
        }
        match hits {
            Hits::Consume(n) if admitted && by == DecidedBy::Lease && exact.low + n > limit => {
                // A block was counted when it was taken, within the limit; a charge since
                // (or a lowered limit) took the count past it, which does not take the
                // block back: no more
                // than the blocks held can be spent so until the count goes down.
                exact.spent_over += n;
                assert!(
                    exact.spent_over <= LEASE_LEEWAY,
                    "spent past the blocks: {context}"
                );
                exact.add(n);
            }
            Hits::Consume(n) if admitted => {
                assert!(exact.low + n <= limit, "admitted past the limit: {context}");
                exact.add(n);
            }
            Hits::Consume(n) => assert!(
                exact.high + n + LEASE_LEEWAY > limit,
                "refused what the exact counter admits: {context}"
            ),
            Hits::Check => match admitted {
                true => assert!(exact.low <= limit, "checked within: {context}"),
                false => assert!(exact.high + LEASE_LEEWAY > limit, "checked over: {context}"),
            },
            Hits::Charge(n) => exact.add(n),
            Hits::Refund(n) => {
                exact.take(n);
                self.settle(k).await;
            }
        }
    }

    /// After a decrease: waits a while for every view of key `k` to leave room for what
    /// the exact counter admits. It does not fail here: the decisions that follow do,
    /// if a view still denies.
    async fn settle(&self, k: usize) {
        let room = self.limit[k].saturating_sub(self.exact[k].high + LEASE_LEEWAY);
        for _ in 0..100 {
            let settled = self.fleet.iter().all(|store| {
                let (key, hits) = (&self.keys[k], Hits::Consume(room));
                let denied = store
                    .local
                    .deny(key, &self.limits[k], hits, store.now(), || false);
                room == 0 || denied.is_none()
            });
            if settled {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Pauses Redis's writes while instance `i` sends a few requests for key `k`, each
    /// waiting the whole timeout; writes resume once every request's deadline has passed,
    /// so the store ignores them all.
    async fn pause(&mut self, i: usize, k: usize) {
        let Some(redis) = self.redis else { return };
        redis.query::<String>(&["CLIENT", "PAUSE", "30000", "WRITE"]);
        for _ in 0..2 {
            let (verdict, by) = self.fleet[i]
                .apply(&self.keys[k], &self.limits[k], Hits::Consume(1))
                .await
                .expect("decided per --on-store-error");
            // A lease's block or a local view may still decide without the store.
            if by == DecidedBy::Fallback {
                assert!(
                    !verdict.decision.admitted,
                    "seed {}: denied per the setting",
                    self.seed
                );
            } else if verdict.decision.admitted {
                self.exact[k].add(1);
            }
        }
        redis.query::<String>(&["CLIENT", "UNPAUSE"]);
        // The health probe, paused too, may have taken the store down meanwhile.
        for store in &self.fleet {
            assert!(
                store.wait_up(Duration::from_secs(10)).await,
                "the store answers again"
            );
        }
    }

    /// At the end: the store holds a count within the exact interval.
    async fn check_store(&self) {
        for k in 0..2 {
            let (key, exact, limit) = (&self.keys[k], &self.exact[k], self.limit[k]);
            let peek = self.fleet[0].peek(key, &self.limits[k], 0).await;
            let shared = peek
                .shared
                .expect("a shared store")
                .expect("the store answers");
            let count = limit.saturating_sub(shared.limits[0].remaining);
            let low = exact.low.min(limit);
            assert!(
                (low..=exact.high + LEASE_LEEWAY).contains(&count),
                "seed {}: the store counts {count} of {key}, the exact counter {exact:?}",
                self.seed
            );
        }
    }
}

/// Runs seeded sequences on `shared` for both window algorithms.
async fn run(shared: Shared<'_>, seeds: std::ops::Range<u64>) {
    let behaviour = SharedBehaviour {
        timeout: TIMEOUT,
        on_error: OnStoreError::Deny,
        local_capacity: Capacity::default(),
        leases: LeasePolicy {
            enabled: true,
            max_fraction: LEASE_FRACTION,
        },
    };
    let redis = match shared {
        Shared::Redis(redis) => Some(redis),
        Shared::Postgres(_) | Shared::Cluster(_) => None,
    };
    let fleet = instances(&shared, INSTANCES, behaviour).await;
    // Fixed windows of an hour: every sequence runs inside one.
    room_in_window(Duration::from_secs(3600), Duration::from_secs(300)).await;
    for seed in seeds {
        for (a, algorithm) in [
            Algorithm::FixedWindow,
            Algorithm::SlidingWindow { precision: 10 },
            Algorithm::Slots,
        ]
        .into_iter()
        .enumerate()
        {
            let mut model = Model {
                fleet: fleet.clone(),
                algorithm,
                limit: [LIMIT; 2],
                limits: [0, 1].map(|_| limits_of(algorithm, LIMIT)),
                keys: [0, 1].map(|k| format!("fleet|seed={seed}|k={k}#{a}")),
                exact: [Exact::default(); 2],
                redis,
                seed,
            };
            let mut rng = Rng::new(seed);
            for _ in 0..STEPS {
                let (i, k) = (rng.below(INSTANCES), rng.below(2));
                let step = step(&mut rng, redis.is_some());
                model.run(i, k, step).await;
            }
            model.check_store().await;
        }
    }
}

/// An hourly limit of `n` counted by `algorithm` (for slots, `n` of them that outlive the
/// sequence: none frees itself while it runs): the same window shape whatever `n`, so the
/// same counter, as an override's.
fn limits_of(algorithm: Algorithm, n: u64) -> Vec<Limit> {
    let limit = match algorithm {
        Algorithm::Slots => Limit::in_flight(n as u32, Duration::from_secs(3600)),
        algorithm => Limit::new(n as u32, Unit::Hour).with_algorithm(algorithm),
    };
    vec![limit.expect("a valid limit")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_redis_decides_as_one_exact_counter() {
    let redis = RedisServer::start();
    run(Shared::Redis(&redis), seeds(4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_postgres_decides_as_one_exact_counter() {
    let pg = PostgresServer::start();
    run(Shared::Postgres(&pg), seeds(3)).await;
}
