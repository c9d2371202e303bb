//! The settling model: seeded random sequences of hits, checks, charges, refunds,
//! reservations settled at stream end (on any instance, as Envoy's stream-done call may
//! reach another replica), in-flight slots and hot counters that lease, across three
//! instances on one real store, while calls miss their deadlines every way a link can make
//! them: requests held past their deadline, answers held past the wait, links cut and
//! connections reset, the store paused or locked. Redis single and PostgreSQL put each
//! instance behind a Toxiproxy link of its own; a Cluster is paused and has its
//! connections killed node by node. An instance is restarted now and then (its drain
//! settles it).
//!
//! Then every fault heals, leased blocks are given back and every ledger settles, and each
//! counter must hold exactly what the answers said: admitted + charged − refunded; for an
//! in-flight counter, the slots of every request admitted and not released. A call in
//! doubt (its connection cut after it was sent) may leave a counter over by that call's
//! units, never under. And requests running at once never passed `max` plus the stated
//! bound (docs/RULES.md): `max` for each instance.
//!
//! A refund is never more than what answers decided by the store counted, less what was
//! refunded: a larger one may find the store holding less (other instances' debts not yet
//! landed), which gives back only what is there (docs/SHARED-STORE.md, Forgiving).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::redis::cluster::RedisCluster;
use tollgate_testkit::rng::Rng;
use tollgate_testkit::toxiproxy::{Direction, Proxy, Toxic, Toxiproxy};
use tollgate_testkit::wait::room_in_window;

use super::exactness::{Stalled, settled, stored};
use super::{Shared, connect, seeds, subscribed};
use crate::algo::Hits;
use crate::limit::{Algorithm, Limit};
use crate::store::DecidedBy;
use crate::store::shared::lease::LeasePolicy;
use crate::store::shared::{SharedBehaviour, SharedStore};
use crate::store::{Capacity, OnStoreError};
use crate::unit::Unit;

/// Instances in the fleet.
const INSTANCES: usize = 3;
/// Each windowed key's limit, per hour.
const LIMIT: u32 = 200;
/// Slots of the in-flight key.
const MAX: u32 = 6;
/// How long a request waits for the store: met by a healthy store on a busy host, so
/// that the faults decide which calls miss it.
const TIMEOUT: Duration = Duration::from_millis(100);
/// How long a held request or answer is held: past every deadline.
const HELD: Duration = Duration::from_millis(250);
/// Steps per sequence.
const STEPS: usize = 160;
/// The most units one call moves (a refund's); a call in doubt leaves at most this over.
const MOST_UNITS: u64 = 60;
/// A quota no count reaches: the counters read with it show their whole count.
const READ_QUOTA: u32 = 1_000_000;

/// The model's keys: two windowed, one in-flight.
const KEYS: usize = 3;
const SLOTS_KEY: usize = 2;

/// What a step does.
#[derive(Debug, Clone, Copy)]
enum Step {
    Consume(u64),
    Check,
    Charge(u64),
    Refund(u64),
    /// A reservation made: its units consumed now, settled later.
    Reserve(u64),
    /// The oldest reservation settled: its units refunded, `used` of them charged.
    Settle {
        used: u64,
    },
    /// Requests that make a counter hot, so that it leases.
    Burst,
    /// An in-flight request starts.
    Acquire,
    /// A request holding a confirmed slot ends: its release.
    Release,
    /// A request admitted without a slot ends (no release names it).
    End,
    /// Instance restarted: drained, then replaced.
    Restart,
}

/// What goes wrong during one step.
#[derive(Debug, Clone, Copy)]
enum Fault {
    None,
    /// The instance's requests reach the store after their deadline.
    HoldRequests,
    /// The store's answers reach the instance after its wait.
    HoldAnswers,
    /// The instance's link is cut, and healed after the step.
    Cut,
    /// The instance's connections are reset as data goes through.
    Reset,
    /// The store runs every call after its deadline.
    Pause,
}

fn step(rng: &mut Rng) -> (Step, usize) {
    let units = |rng: &mut Rng, most: usize| rng.below(most) as u64 + 1;
    let windowed = rng.below(SLOTS_KEY);
    match rng.below(100) {
        0..22 => (Step::Consume(units(rng, 20)), windowed),
        22..26 => (Step::Check, windowed),
        26..34 => (Step::Charge(units(rng, 40)), windowed),
        34..42 => (Step::Refund(units(rng, MOST_UNITS as usize)), windowed),
        42..52 => (Step::Reserve(units(rng, 30)), windowed),
        52..62 => (
            Step::Settle {
                used: units(rng, 30),
            },
            windowed,
        ),
        62..66 => (Step::Burst, windowed),
        66..80 => (Step::Acquire, SLOTS_KEY),
        80..90 => (Step::Release, SLOTS_KEY),
        90..97 => (Step::End, SLOTS_KEY),
        _ => (Step::Restart, windowed),
    }
}

/// Which faults a sequence meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Faults {
    /// Calls miss their deadlines; no connection breaks, so no call is ever in doubt and
    /// every counter must be exact.
    Deadlines,
    /// Connections cut and reset too: a call in doubt may leave a counter over.
    Connections,
}

fn fault(rng: &mut Rng, proxied: bool, faults: Faults) -> Fault {
    let cuts = faults == Faults::Connections;
    match (rng.below(100), proxied, cuts) {
        (0..12, true, _) => Fault::HoldRequests,
        (12..24, true, _) => Fault::HoldAnswers,
        (24..28, true, true) => Fault::Cut,
        (28..31, _, true) => Fault::Reset,
        (31..38, _, _) => Fault::Pause,
        _ => Fault::None,
    }
}

/// One key's truth: what the answers counted, and how much of it answers decided by the
/// store (or a leased block, counted there when taken) put there, less every refund.
#[derive(Debug, Clone, Copy, Default)]
struct Exact {
    count: u64,
    stored_floor: u64,
}

/// The fleet, its links, its keys and their truth.
struct Model<'a> {
    shared: &'a Shared<'a>,
    fleet: Vec<Arc<SharedStore>>,
    /// Each instance's link to the store (Redis single and PostgreSQL).
    links: Vec<Proxy>,
    keys: [String; KEYS],
    limits: [Vec<Limit>; KEYS],
    exact: [Exact; KEYS],
    /// Reservations made and not settled: key and units.
    reservations: VecDeque<(usize, u64)>,
    /// Requests holding a confirmed slot, and requests admitted without one, running.
    confirmed: u64,
    unconfirmed: u64,
    /// Calls in doubt in instances already replaced.
    doubted_before: u64,
    faults: Faults,
    rng: Rng,
    seed: u64,
}

impl Model<'_> {
    fn context(&self, what: &str) -> String {
        format!("seed {}: {what}; exact {:?}", self.seed, self.exact)
    }

    /// Runs `step` on instance `i` and key `k` under `fault`.
    async fn run(&mut self, i: usize, k: usize, step: Step, fault: Fault) {
        if let Step::Restart = step {
            return self.restart(i).await;
        }
        let toxic = self.inflict(i, fault).await;
        let stall = matches!(fault, Fault::Pause).then(|| Stalled::begin(self.shared));
        self.decide(i, k, step).await;
        if let Some(stall) = stall {
            stall.heal();
        }
        self.heal(i, fault, toxic).await;
    }

    /// Starts `fault` on instance `i`'s link (or the store): the toxic to take off.
    async fn inflict(&mut self, i: usize, fault: Fault) -> Option<Toxic> {
        let Some(link) = self.links.get(i) else {
            if let (Fault::Reset, Shared::Cluster(cluster)) = (fault, self.shared) {
                // A Cluster has no link of its own per instance: its connections are killed.
                for node in &cluster.nodes {
                    node.query::<i64>(&["CLIENT", "KILL", "TYPE", "normal"]);
                }
            }
            return None;
        };
        match fault {
            Fault::HoldRequests => Some(
                link.latency(Direction::Upstream, HELD, Duration::ZERO)
                    .await,
            ),
            Fault::HoldAnswers => Some(
                link.latency(Direction::Downstream, HELD, Duration::ZERO)
                    .await,
            ),
            Fault::Cut => {
                link.disable().await;
                None
            }
            Fault::Reset => Some(link.reset_peer(Direction::Upstream, Duration::ZERO).await),
            Fault::None | Fault::Pause => None,
        }
    }

    async fn heal(&mut self, i: usize, fault: Fault, toxic: Option<Toxic>) {
        let Some(link) = self.links.get(i) else {
            return;
        };
        if let Some(toxic) = toxic {
            link.remove(&toxic).await;
        }
        if let Fault::Cut = fault {
            link.enable().await;
        }
    }

    /// Instance `i`'s decision on `hits` for key `k`.
    async fn apply(&self, i: usize, k: usize, hits: Hits) -> (bool, DecidedBy, bool) {
        let (verdict, by) = self.fleet[i]
            .apply(&self.keys[k], &self.limits[k], hits)
            .await
            .expect("decided per --on-store-error");
        (verdict.decision.admitted, by, verdict.in_flight.is_some())
    }

    /// Records `n` units counted on key `k`, decided `by`.
    fn counted(&mut self, k: usize, n: u64, by: DecidedBy) {
        let exact = &mut self.exact[k];
        exact.count += n;
        if matches!(by, DecidedBy::Store | DecidedBy::Lease) {
            exact.stored_floor += n;
        }
    }

    /// Refunds at most `n` units of key `k` on instance `i`: what answers decided by the
    /// store counted there, less every refund.
    async fn refund(&mut self, i: usize, k: usize, n: u64) {
        let n = n.min(self.exact[k].stored_floor);
        if n == 0 {
            return;
        }
        self.apply(i, k, Hits::Refund(n)).await;
        let exact = &mut self.exact[k];
        exact.count -= n;
        exact.stored_floor -= n;
    }

    async fn decide(&mut self, i: usize, k: usize, step: Step) {
        match step {
            Step::Consume(n) | Step::Reserve(n) => {
                let (admitted, by, _) = self.apply(i, k, Hits::Consume(n)).await;
                if admitted {
                    self.counted(k, n, by);
                    if let Step::Reserve(_) = step {
                        self.reservations.push_back((k, n));
                    }
                }
            }
            Step::Check => {
                self.apply(i, k, Hits::Check).await;
            }
            Step::Charge(n) => {
                let (_, by, _) = self.apply(i, k, Hits::Charge(n)).await;
                self.counted(k, n, by);
            }
            Step::Refund(n) => self.refund(i, k, n).await,
            Step::Settle { used } => {
                let Some((k, reserved)) = self.reservations.pop_front() else {
                    return;
                };
                self.refund(i, k, reserved).await;
                let used = used.min(reserved);
                let (_, by, _) = self.apply(i, k, Hits::Charge(used)).await;
                self.counted(k, used, by);
            }
            Step::Burst => {
                for _ in 0..12 {
                    let n = self.rng.below(2) as u64 + 1;
                    let (admitted, by, _) = self.apply(i, k, Hits::Consume(n)).await;
                    if admitted {
                        self.counted(k, n, by);
                    }
                }
            }
            Step::Acquire => {
                let (admitted, by, confirmed) = self.apply(i, SLOTS_KEY, Hits::Consume(1)).await;
                if !admitted {
                    return;
                }
                // Every admitted request's slot is taken in the store, confirmed or owed.
                self.exact[SLOTS_KEY].count += 1;
                match confirmed {
                    true => self.confirmed += 1,
                    false => self.unconfirmed += 1,
                }
                let running = self.confirmed + self.unconfirmed;
                let bound = u64::from(MAX) * INSTANCES as u64;
                let context = self.context(&format!("{running} running, {by:?}"));
                assert!(running <= bound, "past max plus the bound: {context}");
            }
            Step::Release => {
                if self.confirmed == 0 {
                    return;
                }
                self.apply(i, SLOTS_KEY, Hits::Refund(1)).await;
                self.confirmed -= 1;
                self.exact[SLOTS_KEY].count -= 1;
            }
            Step::End => self.unconfirmed = self.unconfirmed.saturating_sub(1),
            Step::Restart => {}
        }
    }

    /// Drains instance `i` (its links healed first: a drain needs the store) and starts a
    /// fresh one in its place.
    async fn restart(&mut self, i: usize) {
        let old = self.fleet[i].clone();
        let drained = old.drain(Duration::from_secs(10)).await;
        assert!(drained, "{}", self.context("a drained instance settles"));
        self.doubted_before += in_doubt(&old);
        let url = match self.links.get(i) {
            Some(link) => self.url_of(link),
            None => self.shared.url(),
        };
        self.fleet[i] = connect(self.shared, &url, behaviour()).await;
        drop(old);
        subscribed(&self.fleet).await;
    }

    fn url_of(&self, link: &Proxy) -> String {
        match self.shared {
            Shared::Postgres(pg) => pg
                .url()
                .replace(&pg.host_port(), &link.listen().to_string()),
            Shared::Redis(_) | Shared::Cluster(_) => link.redis_url(),
        }
    }

    /// Heals everything, settles, and compares every counter with its truth.
    async fn check(&self) {
        for store in &self.fleet {
            store.give_back_leases(Duration::from_secs(10)).await;
        }
        settled(&self.fleet).await;
        let doubted: u64 =
            self.doubted_before + self.fleet.iter().map(|s| in_doubt(s)).sum::<u64>();
        let figures = |f: fn(&crate::store::SharedStats) -> u64| -> u64 {
            let shared = self.fleet.iter().filter_map(|s| s.stats().shared);
            shared.map(|s| f(&s)).sum()
        };
        // One line a seed, for the figures of a longer search (`--nocapture`).
        eprintln!(
            "seed {}: {} fallbacks, {} units charged late, {} credited, {} calls in doubt, {} leases",
            self.seed,
            figures(|s| s.fallbacks),
            figures(|s| s.debt_charged),
            figures(|s| s.credited),
            doubted,
            figures(|s| s.leases_taken),
        );
        for k in 0..KEYS {
            let read = read_limits(k);
            let count = stored(self.shared, &self.keys[k], &read).await;
            let exact = self.exact[k].count;
            let context =
                self.context(&format!("key {k} counts {count}, {doubted} calls in doubt"));
            assert!(count >= exact, "under the truth: {context}");
            assert!(
                count <= exact + doubted * MOST_UNITS,
                "over the truth: {context}"
            );
            if self.faults == Faults::Deadlines {
                assert_eq!(doubted, 0, "{context}");
                assert_eq!(count, exact, "{context}");
            }
        }
    }
}

/// Calls `store` took as in doubt.
fn in_doubt(store: &SharedStore) -> u64 {
    store.stats().shared.map_or(0, |s| s.calls_in_doubt)
}

fn behaviour() -> SharedBehaviour {
    SharedBehaviour {
        timeout: TIMEOUT,
        on_error: OnStoreError::Local,
        local_capacity: Capacity::default(),
        leases: LeasePolicy {
            enabled: true,
            max_fraction: 0.05,
        },
    }
}

/// Key `k`'s limits with `quota`: the same window shape whatever the quota, so the same
/// counter.
fn limits(k: usize, quota: u32) -> Vec<Limit> {
    let limit = match k {
        0 => Limit::new(quota, Unit::Hour).with_algorithm(Algorithm::FixedWindow),
        1 => {
            Limit::new(quota, Unit::Hour).with_algorithm(Algorithm::SlidingWindow { precision: 10 })
        }
        _ => Limit::in_flight(quota, Duration::from_secs(3600)),
    };
    vec![limit.expect("a valid limit")]
}

/// Key `k`'s limits as they are read at the end: a quota no count reaches.
fn read_limits(k: usize) -> Vec<Limit> {
    limits(k, READ_QUOTA)
}

/// Runs seeded sequences on `shared` meeting `faults`, each instance behind a link of its
/// own where the store is one server.
async fn run(shared: Shared<'_>, faults: Faults, seeds: std::ops::Range<u64>) {
    let toxiproxy = match shared {
        Shared::Redis(_) | Shared::Postgres(_) => Some(Toxiproxy::start().await),
        Shared::Cluster(_) => None,
    };
    let upstream = match &shared {
        Shared::Redis(redis) => redis.host_port(),
        Shared::Postgres(pg) => pg.host_port(),
        Shared::Cluster(_) => String::new(),
    };
    let mut links = Vec::new();
    if let Some(toxiproxy) = &toxiproxy {
        for i in 0..INSTANCES {
            links.push(toxiproxy.proxy(&format!("instance-{i}"), &upstream).await);
        }
    }
    for seed in seeds {
        room_in_window(Duration::from_secs(3600), Duration::from_secs(300)).await;
        let mut model = Model {
            shared: &shared,
            fleet: Vec::new(),
            links: Vec::new(),
            keys: [0, 1, 2].map(|k| format!("settling|seed={seed}|{faults:?}|k={k}#{k}")),
            limits: [limits(0, LIMIT), limits(1, LIMIT), limits(SLOTS_KEY, MAX)],
            exact: [Exact::default(); KEYS],
            reservations: VecDeque::new(),
            confirmed: 0,
            unconfirmed: 0,
            doubted_before: 0,
            faults,
            rng: Rng::new(seed),
            seed,
        };
        model.links = std::mem::take(&mut links);
        for i in 0..INSTANCES {
            let url = match model.links.get(i) {
                Some(link) => model.url_of(link),
                None => shared.url(),
            };
            model.fleet.push(connect(&shared, &url, behaviour()).await);
        }
        subscribed(&model.fleet).await;
        for _ in 0..STEPS {
            let i = model.rng.below(INSTANCES);
            let (step, k) = step(&mut model.rng);
            let fault = fault(&mut model.rng, !model.links.is_empty(), faults);
            model.run(i, k, step, fault).await;
        }
        model.check().await;
        links = std::mem::take(&mut model.links);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_redis_settles_exactly_after_faults() {
    let redis = RedisServer::start();
    run(Shared::Redis(&redis), Faults::Deadlines, seeds(2)).await;
    run(Shared::Redis(&redis), Faults::Connections, seeds(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_a_redis_cluster_settles_exactly_after_faults() {
    let cluster = RedisCluster::start();
    run(Shared::Cluster(&cluster), Faults::Deadlines, seeds(1)).await;
    run(Shared::Cluster(&cluster), Faults::Connections, seeds(1)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_on_postgres_settles_exactly_after_faults() {
    let pg = PostgresServer::start();
    run(Shared::Postgres(&pg), Faults::Deadlines, seeds(1)).await;
    run(Shared::Postgres(&pg), Faults::Connections, seeds(1)).await;
}
