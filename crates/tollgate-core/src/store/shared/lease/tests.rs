//! Leases on an injected clock against the store's own algorithms: the counter's states
//! changed by `lease_effect`, as the Lua script and `tollgate_apply` change them.

use proptest::prelude::*;

use std::time::Duration;

use super::{LeasePolicy, Leases, Miss, PERIOD, Spend, Taken};
use crate::algo::testing::at;
use crate::algo::{Gcra, Hits, LimitState, mul_div};
use crate::clock::{Clock, ManualClock, NANOS_PER_MICRO, Timestamp, nanos_of};
use crate::limit::{Algorithm, Limit};
use crate::store::shared::protocol::{Ask, lease_effect};
use crate::store::store_clock::LocalTime;
use crate::unit::Unit;

/// The simulated store's clock is the local one: `t` read locally.
fn local(t: Timestamp) -> LocalTime {
    LocalTime::read(t)
}

const KEY: &str = "hot";
pub(super) const SECOND: u64 = crate::clock::NANOS_PER_SECOND;

/// One shared counter as the store holds it, and the clock both sides read.
pub(super) struct Counter {
    limits: Vec<Limit>,
    states: Vec<LimitState>,
    pub(super) clock: ManualClock,
    /// Store calls made so far.
    pub(super) calls: u64,
    /// Those of them that counted units: takes granted and hits admitted.
    counting: u64,
}

impl Counter {
    pub(super) fn new(limits: Vec<Limit>, start_ns: u64) -> Self {
        let states = limits.iter().map(LimitState::new).collect();
        Self {
            limits,
            states,
            clock: ManualClock::new(Timestamp::from_nanos(start_ns)),
            calls: 0,
            counting: 0,
        }
    }

    /// One store call at the clock's time; its flag (units granted, or admitted).
    fn call(&mut self, ask: Ask) -> u64 {
        let now = self.clock.now();
        self.calls += 1;
        let flag = lease_effect(&mut self.states, &self.limits, now, 0, ask);
        if flag > 0 && !matches!(ask, Ask::GiveBack { .. }) {
            self.counting += 1;
        }
        flag
    }

    /// A request of `n` units through `leases`, as `SharedStore::apply` makes it: from
    /// the block, by a take, or as plain hits; whether it was admitted.
    pub(super) fn request(&mut self, leases: &Leases, n: u64) -> bool {
        let now = self.clock.now();
        let (miss, stale) = match leases.spend(KEY, &self.limits, n, local(now)) {
            Spend::Spent(_) => return true,
            Spend::Missed { next, stale } => (next, stale),
        };
        if let Some(back) = stale {
            self.call(back.ask);
        }
        // Every take here is answered before the next request: none is waited for.
        let Miss::Take(want) = miss else {
            return self.call(Ask::Hits(Hits::Consume(n))) == 1;
        };
        let granted = self.call(Ask::Take { need: n, want });
        let after = self.states.clone();
        let taken = Taken {
            granted,
            to_request: n.min(granted),
            after: &after,
            now,
            sent_local: local(now),
        };
        if let Some(back) = leases.took(KEY, &self.limits, taken) {
            self.call(back.ask);
        }
        granted > 0
    }

    /// Gives back what `sweep` hands out at the clock's time (every block when `all`).
    pub(super) fn sweep(&mut self, leases: &Leases, all: bool) {
        for back in leases.sweep(local(self.clock.now()), all) {
            self.call(back.ask);
        }
    }

    /// Units the store still has room for at the clock's time.
    fn room(&self) -> u64 {
        crate::algo::evaluate(&self.states, &self.limits, self.clock.now(), 0)
            .decision
            .remaining
    }
}

pub(super) fn leases(max_fraction: f64) -> Leases {
    Leases::new(LeasePolicy {
        enabled: true,
        max_fraction,
    })
}

/// Instances with leases on one counter, each swept every period as `spawn_sweeper`
/// sweeps.
pub(super) struct Fleet {
    pub(super) counter: Counter,
    instances: Vec<Leases>,
    swept_ns: u64,
}

impl Fleet {
    pub(super) fn new(limits: Vec<Limit>, max_fraction: f64, instances: usize, at: u64) -> Self {
        Self {
            counter: Counter::new(limits, at),
            instances: (0..instances).map(|_| leases(max_fraction)).collect(),
            swept_ns: at,
        }
    }

    /// A request of `n` units to instance `i`, `after_ns` after the last step; whether
    /// it was admitted.
    pub(super) fn request(&mut self, i: usize, n: u64, after_ns: u64) -> bool {
        self.counter.clock.advance(Duration::from_nanos(after_ns));
        let now = self.counter.clock.now().as_nanos();
        if now - self.swept_ns >= nanos_of(PERIOD) {
            for leases in &self.instances {
                self.counter.sweep(leases, false);
            }
            self.swept_ns = now;
        }
        self.counter.request(&self.instances[i], n)
    }
}

fn fixed(requests: u32, unit: Unit) -> Limit {
    Limit::new(requests, unit)
        .with_algorithm(Algorithm::FixedWindow)
        .expect("fixed window")
}

/// Units left in the counter's block, 0 without one.
fn held(leases: &Leases) -> u64 {
    let tracked = leases.tracked.lock().expect("tracked");
    let entries = &tracked.entries;
    entries
        .get(KEY)
        .and_then(|e| e.block.as_ref())
        .map_or(0, |b| b.left)
}

/// `count` requests of one unit spread evenly over one period; how many were admitted.
fn one_period(counter: &mut Counter, leases: &Leases, count: u64) -> u64 {
    let step = PERIOD / u32::try_from(count).expect("a count of requests");
    (0..count)
        .filter(|_| {
            let admitted = counter.request(leases, 1);
            counter.clock.advance(step);
            admitted
        })
        .count() as u64
}

#[test]
fn a_block_is_sized_to_one_period_of_recent_traffic() {
    let mut counter = Counter::new(vec![fixed(100_000, Unit::Minute)], 0);
    let leases = leases(0.01);
    assert_eq!(one_period(&mut counter, &leases, 50), 50);
    assert_eq!(leases.counts.taken.load(super::Ordering::Relaxed), 0);
    // The next period knows the last one's 50 requests: one take of 50, the rest local.
    assert_eq!(one_period(&mut counter, &leases, 50), 50);
    assert_eq!(leases.counts.taken.load(super::Ordering::Relaxed), 1);
    assert_eq!(
        leases.counts.units_leased.load(super::Ordering::Relaxed),
        50
    );
    assert_eq!(
        leases
            .counts
            .local_admissions
            .load(super::Ordering::Relaxed),
        49
    );
    // Traffic far above the largest block (1 % of the limit) takes blocks of that size.
    one_period(&mut counter, &leases, 4_000);
    counter.request(&leases, 1);
    assert!(held(&leases) < 1_000);
    assert!(leases.counts.units_leased.load(super::Ordering::Relaxed) >= 50 + 1_000);
}

#[test]
fn a_block_is_shown_as_held_and_a_reset_drops_it() {
    let mut counter = Counter::new(vec![fixed(100_000, Unit::Minute)], 0);
    let leases = leases(0.01);
    assert_eq!(leases.view(KEY, LocalTime::default()), None);
    one_period(&mut counter, &leases, 50);
    one_period(&mut counter, &leases, 50);
    // A third period takes 50 at its start and spends 20 of them.
    one_period(&mut counter, &leases, 20);
    let now = counter.clock.now();
    let view = leases.view(KEY, local(now)).expect("a block");
    assert_eq!((view.left, view.spendable), (30, 30));
    assert_eq!(
        view.ends,
        Some(at(60 * SECOND).since(now)),
        "spendable until the minute ends"
    );
    leases.forget(Some("another"));
    assert_eq!(held(&leases), 30);
    leases.forget(Some(KEY));
    assert_eq!(leases.view(KEY, local(now)), None);
    // The next take is of the last period's 20, half of them spent.
    assert_eq!(one_period(&mut counter, &leases, 10), 10);
    assert_eq!(held(&leases), 10, "a new block");
    leases.forget(None);
    assert_eq!(held(&leases), 0);
}

#[test]
fn blocks_shrink_near_the_limit_down_to_one_unit_per_call() {
    let mut counter = Counter::new(vec![fixed(2_000, Unit::Hour)], 0);
    let leases = leases(0.01);
    let mut admitted = 0;
    let mut sizes = Vec::new();
    for _ in 0..40 {
        let before = leases.counts.units_leased.load(super::Ordering::Relaxed);
        admitted += one_period(&mut counter, &leases, 100);
        let after = leases.counts.units_leased.load(super::Ordering::Relaxed);
        sizes.push((after - before, counter.room()));
    }
    // Every unit of the hour admitted, and not one more.
    assert_eq!(admitted, 2_000);
    assert_eq!(counter.room(), 0);
    // Blocks of the largest size (20) while there is room, a quarter of the room near it,
    // then none: the last units go to the store one request at a time.
    assert_eq!(sizes.first().map(|s| s.0), Some(0));
    assert!(sizes.iter().any(|&(leased, _)| leased >= 5 * 20));
    let last_take = counter_last_take(&sizes);
    assert!(last_take > 0);
    assert!(sizes[last_take].0 < 5 * 20, "{sizes:?}");
    // The last block left under 8 units of room: a quarter of it is at most one unit.
    let tracked = leases.tracked.lock().expect("tracked");
    let entries = &tracked.entries;
    let room = entries
        .get(KEY)
        .and_then(|e| e.room)
        .expect("a take's room")
        .0;
    assert!(room < 8, "blocks stopped with {room} units of room");
}

/// The index of the last period in which a block was taken.
fn counter_last_take(sizes: &[(u64, u64)]) -> usize {
    sizes
        .iter()
        .rposition(|&(leased, _)| leased > 0)
        .unwrap_or(0)
}

#[test]
fn a_small_counter_never_leases() {
    // 1 % of 700 is 7, under the smallest block.
    let mut counter = Counter::new(vec![fixed(700, Unit::Second)], 0);
    let leases = leases(0.01);
    for _ in 0..10 {
        one_period(&mut counter, &leases, 10);
    }
    assert_eq!(leases.counts.taken.load(super::Ordering::Relaxed), 0);
    assert_eq!(
        leases
            .counts
            .local_admissions
            .load(super::Ordering::Relaxed),
        0
    );
    assert_eq!(counter.room(), 700 - 100);
}

#[test]
fn leases_off_never_lease() {
    let mut counter = Counter::new(vec![fixed(100_000, Unit::Second)], 0);
    let leases = Leases::new(LeasePolicy {
        enabled: false,
        ..LeasePolicy::default()
    });
    for _ in 0..5 {
        one_period(&mut counter, &leases, 100);
    }
    assert_eq!(leases.counts.taken.load(super::Ordering::Relaxed), 0);
}

/// Makes the counter hot and leaves it holding a block taken at the clock's time.
fn take_block(counter: &mut Counter, leases: &Leases) {
    one_period(counter, leases, 100);
    assert!(counter.request(leases, 1));
    assert!(held(leases) > 0, "no block taken");
}

#[test]
fn a_fixed_window_block_ends_with_its_window() {
    let mut counter = Counter::new(
        vec![fixed(100_000, Unit::Second)],
        SECOND - 5 * nanos_of(PERIOD),
    );
    let leases = leases(0.01);
    take_block(&mut counter, &leases);
    let left = held(&leases);
    let local = leases
        .counts
        .local_admissions
        .load(super::Ordering::Relaxed);
    // The window ends: the block is given back (to the old window) and a new one taken.
    counter.clock.advance(at(SECOND).since(counter.clock.now()));
    assert!(counter.request(&leases, 1));
    assert_eq!(
        leases
            .counts
            .local_admissions
            .load(super::Ordering::Relaxed),
        local
    );
    assert_eq!(counter.room(), 100_000 - 1 - held(&leases));
    assert!(left > 0);
}

/// A counter of 100,000 a second counted by `algorithm`, made hot from time 0, and what
/// `check` says of the block it took.
fn with_block<T>(algorithm: Algorithm, check: impl FnOnce(&super::Block, Timestamp) -> T) -> T {
    let limit = Limit::new(100_000, Unit::Second)
        .with_algorithm(algorithm)
        .expect("limit");
    let mut counter = Counter::new(vec![limit], 0);
    let leases = leases(0.01);
    take_block(&mut counter, &leases);
    let tracked = leases.tracked.lock().expect("tracked");
    let entries = &tracked.entries;
    let block = entries
        .get(KEY)
        .and_then(|e| e.block.as_ref())
        .expect("block");
    check(block, counter.clock.now())
}

#[test]
fn a_sliding_window_block_ends_with_its_sub_window() {
    with_block(Algorithm::SlidingWindow { precision: 10 }, |block, now| {
        let sub_window = SECOND / 10;
        let end = at((now.as_nanos() / sub_window + 1) * sub_window);
        assert_eq!(block.ends, end);
        assert!(block.spendable(local(end - Duration::from_nanos(1))) > 0);
        assert_eq!(block.spendable(local(end)), 0);
    });
}

#[test]
fn a_gcra_block_decays_as_the_bucket_refills() {
    with_block(Algorithm::TokenBucket { burst: 100_000 }, |block, now| {
        let left = block.spendable(local(now));
        assert_eq!(left, block.left);
        // One unit refills every 10 µs: that long before the arrival time the take left,
        // one unit is spendable, at it none.
        let interval = Duration::from_micros(10);
        let tat = block.decay.first().expect("decay").tat;
        assert!(block.spendable(local(now + 3 * interval)) <= left);
        assert_eq!(block.spendable(local(tat - 2 * interval)), 2.min(left));
        assert_eq!(block.spendable(local(tat - interval)), 1);
        assert_eq!(block.spendable(local(tat)), 0);
    });
}

/// A token bucket of `requests` a second (its burst too), hot from time one second on,
/// holding a block, and the leases it took it with.
fn bucket_with_block(requests: u32) -> (Counter, Leases) {
    let limit = Limit::new(requests, Unit::Second)
        .with_algorithm(Algorithm::TokenBucket { burst: requests })
        .expect("limit");
    let mut counter = Counter::new(vec![limit], SECOND);
    let leases = leases(0.01);
    take_block(&mut counter, &leases);
    (counter, leases)
}

#[test]
fn a_gcra_block_keeps_only_what_the_bucket_has_not_refilled() {
    // One unit a millisecond, a burst of 1,000: blocks of up to 10.
    let (mut counter, leases) = bucket_with_block(1_000);
    let left = held(&leases);
    // Until 5 ms before the arrival time the take left, when the bucket has refilled all
    // but 5 units of the block: the rest, unspent, has drained as if spent.
    let tat = {
        let tracked = leases.tracked.lock().expect("tracked");
        let entries = &tracked.entries;
        let block = entries.get(KEY).and_then(|e| e.block.as_ref());
        block.and_then(|b| b.decay.first()).expect("decay").tat
    };
    let five_ms = Duration::from_millis(5);
    counter
        .clock
        .advance((tat - five_ms).since(counter.clock.now()));
    assert!(left > 5, "a block of {left}");
    // Another instance fills the bucket; this one then spends what it may of its block.
    let mut admitted = 0;
    while counter.call(Ask::Hits(Hits::Consume(1))) == 1 {
        admitted += 1;
    }
    while counter.request(&leases, 1) {
        admitted += 1;
    }
    // A bucket admits its burst at one instant, and no more.
    assert_eq!(admitted, 1_000);
}

#[test]
fn a_take_dropped_unanswered_wakes_its_waiters_and_lets_the_counter_take_again() {
    use futures_util::FutureExt;
    let mut counter = Counter::new(vec![fixed(100_000, Unit::Minute)], 0);
    let leases = leases(0.01);
    one_period(&mut counter, &leases, 100);
    let now = counter.clock.now();
    let spend = || leases.spend(KEY, &counter.limits, 1, local(now));
    assert!(matches!(
        spend(),
        Spend::Missed {
            next: Miss::Take(_),
            ..
        }
    ));
    let Spend::Missed {
        next: Miss::Wait(waiting),
        ..
    } = spend()
    else {
        panic!("a second request does not wait for the take");
    };
    drop(super::take::TakeOut::new(&leases, KEY));
    assert!(
        waiting.now_or_never().is_some(),
        "the waiter is still asleep"
    );
    assert!(matches!(
        spend(),
        Spend::Missed {
            next: Miss::Take(_),
            ..
        }
    ));
}

#[test]
fn the_sweep_gives_idle_blocks_back() {
    let mut counter = Counter::new(vec![fixed(100_000, Unit::Minute)], 0);
    let leases = leases(0.01);
    take_block(&mut counter, &leases);
    let admitted = 100_000 - counter.room() - held(&leases);
    counter.clock.advance(PERIOD);
    counter.sweep(&leases, false);
    assert!(held(&leases) > 0, "a block idle for one period is kept");
    counter.clock.advance(2 * PERIOD);
    counter.sweep(&leases, false);
    assert_eq!(held(&leases), 0);
    assert_eq!(100_000 - counter.room(), admitted);
    // With nothing held and nothing seen for a while, the counter is forgotten.
    counter.clock.advance(4 * PERIOD);
    counter.sweep(&leases, false);
    assert!(leases.tracked.lock().expect("tracked").entries.is_empty());
}

/// One step of a simulated load: which instance asks, for how many units, and how long
/// after the previous step.
#[derive(Debug, Clone)]
struct Step {
    instance: usize,
    units: u64,
    after_us: u64,
}

/// Phases of steady traffic, each at its own pace (from far above any limit to idle), so
/// that blocks are held when a window ends and the next window is overloaded.
fn steps(instances: usize) -> impl Strategy<Value = Vec<Step>> {
    let phase = (0..2_000_u64, 1..800_usize).prop_flat_map(move |(gap_us, len)| {
        let step =
            (0..instances, 1..4_u64, 0..=gap_us).prop_map(|(instance, units, after_us)| Step {
                instance,
                units,
                after_us,
            });
        prop::collection::vec(step, len)
    });
    prop::collection::vec(phase, 1..12).prop_map(|phases| phases.concat())
}

fn load() -> impl Strategy<Value = (Vec<Limit>, f64, Vec<Step>, usize)> {
    let limit = (800..5_000_u32, 0..3_u8, 1..5_u32).prop_map(|(requests, kind, seconds)| {
        let algorithm = match kind {
            0 => Algorithm::FixedWindow,
            1 => Algorithm::TokenBucket { burst: requests },
            _ => Algorithm::LeakyBucket { burst: requests },
        };
        Limit::new(requests, Unit::Second)
            .with_multiplier(seconds)
            .and_then(|l| l.with_algorithm(algorithm))
            .expect("limit")
    });
    (
        prop::collection::vec(limit, 1..3),
        0.005..0.5_f64,
        1..4_usize,
    )
        .prop_flat_map(|(limits, fraction, instances)| {
            (
                Just(limits),
                Just(fraction),
                steps(instances),
                Just(instances),
            )
        })
}

/// Most units a limit may admit in `[from, to]` when `calls` store calls in it counted
/// units: per fixed window its requests. For GCRA, what one bucket admits: the units that
/// fit in the span plus the burst's tolerance, `(to − from + span(burst)) × requests /
/// window` (each admission moves the arrival time by its span, which may be at most the
/// tolerance ahead of now). Spans are whole microseconds, so a call's span may fall short
/// of its units' exact share by under a microsecond: each counting call adds one.
fn allowed(limit: &Limit, from_ns: u64, to_ns: u64, calls: u64) -> u64 {
    let requests = u64::from(limit.requests_per_unit);
    match limit.algorithm {
        Algorithm::TokenBucket { burst } | Algorithm::LeakyBucket { burst } => {
            let tolerance = nanos_of(Gcra::span(limit, u64::from(burst)));
            let bucket_ns = (to_ns - from_ns) + tolerance + calls * NANOS_PER_MICRO;
            mul_div(bucket_ns, requests, limit.window_nanos())
        }
        _ => requests,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn instances_with_leases_never_admit_past_a_limit((limits, fraction, steps, instances) in load()) {
        let mut fleet = Fleet::new(limits.clone(), fraction, instances, 7 * SECOND + 123);
        // Each admission: when, how many units, and the counting calls before and after it.
        let mut admissions: Vec<(u64, u64, u64, u64)> = Vec::new();
        for step in &steps {
            let before = fleet.counter.counting;
            if fleet.request(step.instance, step.units, step.after_us * 1_000) {
                let now = fleet.counter.clock.now().as_nanos();
                admissions.push((now, step.units, before, fleet.counter.counting));
            }
        }
        for limit in &limits {
            match limit.algorithm {
                Algorithm::FixedWindow => {
                    let mut per_window = std::collections::BTreeMap::new();
                    for &(at, units, _, _) in &admissions {
                        *per_window.entry(at / limit.window_nanos()).or_insert(0) += units;
                    }
                    for (window, admitted) in per_window {
                        prop_assert!(admitted <= allowed(limit, 0, 0, 0),
                            "window {window}: {admitted} admitted past {limit:?}");
                    }
                }
                _ => {
                    // Every span starting at an admission: one bucket's bound.
                    for (i, &(from, _, counted, _)) in admissions.iter().enumerate() {
                        let mut admitted = 0;
                        for &(at, units, _, after) in &admissions[i..] {
                            admitted += units;
                            let most = allowed(limit, from, at, after - counted);
                            prop_assert!(admitted <= most,
                                "{admitted} admitted in [{from}, {at}] past {most} of {limit:?}");
                        }
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// docs/STORES.md's under-use bound: with steady demand above a fixed window's limit on
    /// every instance, each window admits all of its limit but what blocks hold when it
    /// ends, at most one block (`LEASE_MAX_FRACTION` of the limit) per instance.
    #[test]
    fn instances_with_leases_use_a_limit_their_demand_passes(
        requests in 800..5_000_u32,
        seconds in 1..3_u32,
        fraction in 0.005..0.5_f64,
        instances in 1..5_usize,
        demand in 1.2..3.0_f64,
    ) {
        let limit = Limit::new(requests, Unit::Second)
            .with_multiplier(seconds)
            .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
            .expect("limit");
        let window_ns = limit.window_nanos();
        let mut fleet = Fleet::new(vec![limit], fraction, instances, 7 * window_ns);
        let per_window = (f64::from(requests) * demand) as u64;
        let gap_ns = window_ns / per_window;
        let mut admitted = std::collections::BTreeMap::new();
        for step in 1..2 * per_window {
            if fleet.request(step as usize % instances, 1, gap_ns) {
                let window = fleet.counter.clock.now().as_nanos() / window_ns;
                *admitted.entry(window).or_insert(0_u64) += 1;
            }
        }
        let block = (f64::from(requests) * fraction) as u64;
        let unused = instances as u64 * block;
        for (window, admitted) in admitted {
            prop_assert!(admitted <= u64::from(requests));
            prop_assert!(admitted + unused >= u64::from(requests),
                "window {window}: {admitted} of {requests}, {instances} instances, blocks of {block}");
        }
    }
}

#[test]
fn a_gcra_block_is_not_given_back() {
    // The stores ignore a give-back on GCRA: sending one would be a round trip for nothing.
    let (mut counter, leases) = bucket_with_block(100_000);
    let calls = counter.calls;
    counter.sweep(&leases, true);
    assert_eq!(counter.calls, calls, "a give-back was sent");
    assert_eq!(held(&leases), 0, "the block is dropped all the same");
}

/// Many counters each seen once a period (per-user or per-IP traffic) take no entry, so
/// they neither fill the table nor keep a counter that turns hot from leasing. Before, every
/// such request made an entry: 10,000 of them filled the table, and a hot counter then
/// went to the store per request until the sweep emptied it.
#[test]
fn a_hot_counter_leases_while_many_cold_ones_pass() {
    let leases = leases(0.01);
    let limits = [Limit::new(10_000, Unit::Second)];
    let start = Timestamp::from_nanos(1_000 * SECOND);
    for i in 0..20_000 {
        let cold = leases.spend(&format!("cold-{i}"), &limits, 1, local(start));
        assert!(matches!(
            cold,
            Spend::Missed {
                next: Miss::Usual,
                ..
            }
        ));
    }
    for _ in 0..3 {
        leases.spend(KEY, &limits, 1, local(start));
    }
    let next = local(start + PERIOD);
    let hot = leases.spend(KEY, &limits, 1, next);
    assert!(
        matches!(
            hot,
            Spend::Missed {
                next: Miss::Take(3),
                ..
            }
        ),
        "three requests in the last period: a block of three"
    );
    assert_eq!(leases.tracked.lock().expect("tracked").entries.len(), 1);
}
