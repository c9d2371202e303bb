use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, Capacity, Hits, Limit, ManualClock, MemoryStore, Store, Unit};

use super::*;
use crate::rlqs::part::{Parts, settle_report};
use crate::rlqs::reserve::{Counter, reserve_grants};

const S: u64 = 1_000_000_000;
const WINDOW_NS: u64 = 10 * S;

fn bucket(value: &str) -> BucketKey {
    BucketKey {
        domain: Arc::from("d"),
        entries: vec![("k".to_owned(), value.to_owned())].into(),
    }
}

fn counted(remaining: u64) -> Budget {
    Budget::Counted {
        remaining,
        window_ns: WINDOW_NS,
    }
}

fn table(clock: &ManualClock) -> Table {
    Table::new(Arc::new(clock.clone()), Duration::from_secs(30), 100_000)
}

fn stats(streams: usize, buckets: usize) -> TableStats {
    TableStats { streams, buckets }
}

fn tokens(max_tokens: u32) -> Strategy {
    Strategy::TokenBucket {
        max_tokens,
        fill_interval_s: 10,
    }
}

/// The strategies sent, as (stream, strategy).
fn assigned(sends: &[Send]) -> Vec<(StreamId, Strategy)> {
    sends
        .iter()
        .filter_map(|s| match s.action {
            Action::Assign { strategy, .. } => Some((s.stream, strategy)),
            Action::Abandon => None,
        })
        .collect()
}

/// A report of bucket "a", its reservations settled first (`budget` is the counter's view
/// after that), as the stream adapter does.
fn report(t: &mut Table, stream: StreamId, allowed: u64, denied: u64, budget: Budget) -> Vec<Send> {
    t.take_reservations(stream, &bucket("a"));
    t.report(stream, &bucket("a"), allowed, denied, budget)
        .expect("under the bucket cap")
}

#[test]
fn the_first_report_subscribes_and_the_ttl_follows_the_reporting_interval() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    let sends = report(&mut t, 1, 1, 0, counted(100));
    assert_eq!(
        sends,
        vec![Send {
            stream: 1,
            bucket: bucket("a"),
            // Half: room is kept for an Envoy that subscribes next.
            action: Action::Assign {
                strategy: tokens(50),
                ttl_s: 15,
            },
        }]
    );
    clock.advance(2 * S);
    // Its second report shows a rate: alone, it gets the whole.
    let sends = report(&mut t, 1, 1, 0, counted(99));
    assert!(matches!(sends[0].action, Action::Assign { ttl_s: 6, .. }));
    assert_eq!(assigned(&sends), vec![(1, tokens(99))]);
    assert_eq!(t.stats(), stats(1, 1));
}

#[test]
fn a_newcomer_waits_for_the_room_others_hold_then_gets_it_pushed() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 10, 0, counted(100));
    clock.advance(S);
    assert_eq!(
        assigned(&report(&mut t, 1, 10, 0, counted(100))),
        vec![(1, tokens(100))]
    );
    // Stream 1's 100 are reserved in the counter (it may have spent them): nothing is free
    // for stream 2.
    assert_eq!(
        assigned(&report(&mut t, 2, 0, 10, counted(0))),
        vec![(2, Strategy::DenyAll)]
    );
    clock.advance(S);
    // Stream 1 spent 30 (its 70 unused came back); of the 70 left it gets its part by
    // demand (20 of 30), and stream 2 is pushed its part of what is free (10 of 40: its
    // rate is not known yet, room is kept for one more).
    assert_eq!(
        assigned(&report(&mut t, 1, 30, 0, counted(70))),
        vec![(1, tokens(46)), (2, tokens(17))]
    );
}

#[test]
fn a_closed_streams_share_goes_to_the_others_its_grant_stays_reserved() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 10, 0, counted(100));
    report(&mut t, 2, 0, 10, counted(0));
    // Stream 1 goes with its grant reserved in the counter (it may have been spent): the
    // room comes back when the counter's window forgets it, and then it is all stream 2's.
    assert_eq!(t.close(1).sends, vec![]);
    clock.advance(WINDOW_NS);
    assert_eq!(
        assigned(&report(&mut t, 2, 0, 10, counted(100))),
        vec![(2, tokens(100))]
    );
    assert_eq!(t.stats(), stats(1, 1));
    assert_eq!(t.close(2).emptied, vec![bucket("a")]);
}

#[test]
fn a_grant_the_counter_cannot_hold_whole_is_shrunk_or_revoked() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 1, 0, counted(100));
    t.shrink(1, &bucket("a"), 30);
    let shrunk = t.take_reservations(1, &bucket("a"));
    assert_eq!(
        shrunk.iter().map(|r| r.tokens).collect::<Vec<_>>(),
        vec![30]
    );
    report(&mut t, 1, 1, 0, counted(100));
    t.shrink(1, &bucket("a"), 0);
    assert_eq!(t.take_reservations(1, &bucket("a")), vec![]);
    // Denied now, so it is pushed its part when another report finds room (the newcomer
    // gets a third: room is kept for one more).
    assert_eq!(
        assigned(&report(&mut t, 2, 1, 0, counted(100))),
        vec![(2, tokens(33)), (1, tokens(50))]
    );
}

#[test]
fn a_window_end_gives_holders_of_its_grants_a_new_assignment() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 1, 0, counted(100));
    report(&mut t, 2, 0, 0, Budget::Fixed(Strategy::AllowAll));
    clock.advance(S);
    // Stream 1 holds a grant of the window gone; stream 2 holds none and is not told.
    let sends = t.cut(&bucket("a"), clock.now_ns(), counted(100));
    assert_eq!(assigned(&sends), vec![(1, tokens(50))]);
    let held: Vec<(u64, bool)> = t
        .take_reservations(1, &bucket("a"))
        .iter()
        .map(|r| (r.tokens, r.cut))
        .collect();
    assert_eq!(held, vec![(50, true), (50, false)]);
    assert_eq!(t.cut(&bucket("a"), clock.now_ns(), counted(0)), vec![]);
}

#[test]
fn idle_buckets_are_abandoned() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 1, 0, Budget::Fixed(Strategy::AllowAll));
    t.report(2, &bucket("b"), 1, 0, Budget::Fixed(Strategy::AllowAll))
        .expect("under the cap");
    clock.advance(20 * S);
    // Reports without requests do not keep a bucket alive; requests do.
    report(&mut t, 1, 0, 0, Budget::Fixed(Strategy::AllowAll));
    t.report(2, &bucket("b"), 3, 0, Budget::Fixed(Strategy::AllowAll))
        .expect("under the cap");
    assert_eq!(t.sweep(), Departures::default());
    clock.advance(10 * S);
    assert_eq!(
        t.sweep(),
        Departures {
            sends: vec![Send {
                stream: 1,
                bucket: bucket("a"),
                action: Action::Abandon,
            }],
            emptied: vec![bucket("a")],
            shrunk: false,
        }
    );
    assert_eq!(t.stats(), stats(2, 1));
}

#[test]
fn new_rules_are_pushed_to_every_stream_whose_assignment_changes() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 1, 0, Budget::Fixed(Strategy::AllowAll));
    report(&mut t, 2, 1, 0, Budget::Fixed(Strategy::AllowAll));
    let deny = Budget::Fixed(Strategy::DenyAll);
    assert_eq!(
        assigned(&t.replan(&bucket("a"), deny)),
        vec![(1, Strategy::DenyAll), (2, Strategy::DenyAll)]
    );
    assert_eq!(t.replan(&bucket("a"), deny), vec![]);
    assert_eq!(t.replan(&bucket("unknown"), deny), vec![]);
}

#[test]
fn a_stream_may_not_subscribe_to_unbounded_buckets() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    let allow = Budget::Fixed(Strategy::AllowAll);
    for i in 0..MAX_BUCKETS_PER_STREAM {
        t.report(1, &bucket(&i.to_string()), 1, 0, allow)
            .expect("under the cap");
    }
    assert_eq!(
        t.report(1, &bucket("one more"), 1, 0, allow),
        Err(TooManyBuckets::Stream)
    );
    // Another stream is not affected.
    assert!(t.report(2, &bucket("one more"), 1, 0, allow).is_ok());
}

#[test]
fn all_streams_together_hold_at_most_the_global_bound() {
    let clock = ManualClock::new(100 * S);
    let mut t = Table::new(Arc::new(clock.clone()), Duration::from_secs(30), 5);
    let allow = Budget::Fixed(Strategy::AllowAll);
    for stream in 1..=2 {
        t.open(stream);
        for name in ["a", "b"] {
            t.report(stream, &bucket(name), 1, 0, allow)
                .expect("under the bound");
        }
    }
    t.open(3);
    t.report(3, &bucket("a"), 1, 0, allow).expect("the fifth");
    // A bucket another stream holds counts again for this one.
    assert_eq!(
        t.report(3, &bucket("b"), 1, 0, allow),
        Err(TooManyBuckets::Total(5))
    );
    // Reporting what it holds is not refused.
    assert!(t.report(1, &bucket("a"), 2, 0, allow).is_ok());
    // A closed stream's buckets make room.
    t.close(1);
    assert!(t.report(3, &bucket("b"), 1, 0, allow).is_ok());
    assert!(t.report(3, &bucket("c"), 1, 0, allow).is_ok());
    assert_eq!(
        t.report(2, &bucket("c"), 1, 0, allow),
        Err(TooManyBuckets::Total(5))
    );
}

/// One simulated Envoy: arrivals at a steady rate, its assignment enforced as Envoy 1.40
/// does with the way Tollgate sends it (each token bucket starts full, then refills
/// continuously).
struct Envoy {
    rate: f64,
    phase_ns: u64,
    arrivals: f64,
    strategy: Option<Strategy>,
    tokens: f64,
    allowed: u64,
    denied: u64,
    subscribed: bool,
    alive: bool,
}

impl Envoy {
    fn apply(&mut self, strategy: Strategy) {
        if let Strategy::TokenBucket { max_tokens, .. } = strategy {
            self.tokens = f64::from(max_tokens);
        }
        self.strategy = Some(strategy);
    }

    /// One request now: admitted?
    fn admit(&mut self, dt_s: f64) -> bool {
        match self.strategy {
            None | Some(Strategy::AllowAll) => true,
            Some(Strategy::DenyAll) => false,
            Some(Strategy::TokenBucket {
                max_tokens,
                fill_interval_s,
            }) => {
                let refill = dt_s / fill_interval_s as f64;
                self.tokens = (self.tokens + refill).min(f64::from(max_tokens));
                let ok = self.tokens >= 1.0;
                if ok {
                    self.tokens -= 1.0;
                }
                ok
            }
        }
    }
}

/// The bound, checked on a simulated fleet: three Envoys, overloaded (105 requests per
/// second against 100 per 10 s), reporting every second at different phases, one leaving
/// half-way, then demand shifting between the others; counted on one memory store with a
/// fixed window, by one Tollgate or (as on a shared Redis) by two. Per window, the admitted
/// total stays within the limit plus Envoy's refill (one token per stream per window)
/// plus the first request of each subscription (admitted before any assignment); the
/// limit is used; and each Envoy gets about its part of the demand, wherever it reports.
#[tokio::test]
async fn a_simulated_fleet_admits_the_limit_per_window_and_no_more() {
    simulate_fleet(1).await;
}

#[tokio::test]
async fn a_fleet_split_over_two_tollgates_on_one_store_admits_the_limit_and_no_more() {
    simulate_fleet(2).await;
}

async fn simulate_fleet(instances: usize) {
    const LIMIT: u64 = 100;
    // Mid-window, so that the first grants straddle a window boundary.
    let start = 1_000 * WINDOW_NS + 7_500_000_000;
    let clock = ManualClock::new(start);
    let store = Store::Memory(MemoryStore::new(
        Capacity::default(),
        Arc::new(clock.clone()),
    ));
    let limits = [Limit::new(LIMIT as u32, Unit::Second)
        .with_multiplier(10)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .expect("a valid limit")];
    let mut tables: Vec<Table> = (0..instances)
        .map(|_| Table::new(Arc::new(clock.clone()), Duration::from_secs(60), 100_000))
        .collect();
    // Alone, an instance's part is the whole limit.
    let parts: Vec<Parts> = (0..instances)
        .filter(|_| instances > 1)
        .map(|_| Parts::new(Arc::new(clock.clone()), Capacity::default()))
        .collect();
    let counter = Counter {
        key: "k",
        limits: &limits,
    };
    let mut envoys: Vec<Envoy> = [(30.0, 0), (60.0, 330), (15.0, 660)]
        .into_iter()
        .map(|(rate, phase_ms)| Envoy {
            rate,
            phase_ns: phase_ms * 1_000_000,
            arrivals: 0.0,
            strategy: None,
            tokens: 0.0,
            allowed: 0,
            denied: 0,
            subscribed: false,
            alive: true,
        })
        .collect();
    let tick_ns = 10_000_000;
    let windows = 8;
    // Per epoch-aligned window; the first and the last are partial.
    let mut admitted = vec![0u64; windows + 1];
    let mut by_envoy = vec![vec![0u64; windows + 1]; envoys.len()];
    for tick in 0..(windows as u64 * WINDOW_NS / tick_ns) {
        let now = start + tick * tick_ns;
        clock.advance(now - clock.now_ns());
        let window = (now / WINDOW_NS - start / WINDOW_NS) as usize;
        if now - start == 35 * S {
            envoys[1].alive = false;
            let t = &mut tables[1 % instances];
            let departures = t.close(2);
            if let Some(part) = parts.get(1) {
                assert_eq!(departures.emptied, vec![bucket("a")]);
                part.withdraw(&store, &counter).await.expect("memory store");
            }
            let sends = reserve(&store, t, parts.get(1), &limits, departures.sends).await;
            deliver(&mut envoys, &sends);
        }
        if now.is_multiple_of(WINDOW_NS) {
            // Window ends: whoever holds a grant of the window gone gets a new assignment.
            for (i, t) in tables.iter_mut().enumerate() {
                let part = parts.get(i);
                let budget = settle(&store, &counter, part, (&[], 0, 0), now).await;
                let sends = t.cut(&bucket("a"), now, budget);
                let sends = reserve(&store, t, part, &limits, sends).await;
                deliver(&mut envoys, &sends);
            }
        }
        if now - start == 55 * S {
            // Demand shifts: the quiet stream gets busy, the busy one quiet.
            envoys[0].rate = 5.0;
            envoys[2].rate = 90.0;
        }
        for i in 0..envoys.len() {
            let e = &mut envoys[i];
            if !e.alive {
                continue;
            }
            e.arrivals += e.rate * tick_ns as f64 / S as f64;
            let mut first = false;
            while e.arrivals >= 1.0 {
                e.arrivals -= 1.0;
                if e.admit(tick_ns as f64 / S as f64) {
                    e.allowed += 1;
                    admitted[window] += 1;
                    by_envoy[i][window] += 1;
                } else {
                    e.denied += 1;
                }
                first |= !e.subscribed;
                e.subscribed = true;
            }
            let on_timer = e.subscribed && (now - start) % S == e.phase_ns;
            if first || on_timer {
                let (allowed, denied) = (e.allowed, e.denied);
                (e.allowed, e.denied) = (0, 0);
                let id = i as StreamId + 1;
                let t = &mut tables[i % instances];
                let reservations = t.take_reservations(id, &bucket("a"));
                let part = parts.get(i % instances);
                let usage = (&reservations[..], allowed, denied);
                let budget = settle(&store, &counter, part, usage, now).await;
                let sends = t
                    .report(id, &bucket("a"), allowed, denied, budget)
                    .expect("under the cap");
                let sends = reserve(&store, t, part, &limits, sends).await;
                deliver(&mut envoys, &sends);
            }
        }
    }
    println!("admitted per window {admitted:?}, by Envoy {by_envoy:?}");
    // While all three report (windows 1 to 3), the busiest Envoy, alone on its instance
    // when there are two, gets about its part of the demand: 60 of 105 requests per second.
    let busiest: u64 = by_envoy[1][1..=3].iter().sum();
    let all: u64 = admitted[1..=3].iter().sum();
    let share = busiest as f64 / all as f64;
    assert!(
        (0.47..=0.67).contains(&share),
        "busiest Envoy's share {share}: {by_envoy:?}"
    );
    let refill = envoys.len() as u64;
    for (w, n) in admitted.iter().enumerate() {
        let subscriptions = if w == 0 { envoys.len() as u64 } else { 0 };
        assert!(
            *n <= LIMIT + refill + subscriptions,
            "window {w} admitted {n}: {admitted:?}"
        );
        let full = (1..windows).contains(&w);
        assert!(
            !full || *n >= LIMIT * 9 / 10,
            "window {w} admitted only {n}: {admitted:?}"
        );
    }
}

/// Settles a report (`usage`: reservations, allowed, denied) as the service does.
async fn settle(
    store: &Store,
    counter: &Counter<'_>,
    part: Option<&Parts>,
    (reservations, allowed, denied): (&[Reservation], u64, u64),
    now: u64,
) -> Budget {
    let usage = (allowed, denied);
    let (settled, remaining) = settle_report(store, counter, part, reservations, usage, now)
        .await
        .expect("memory store");
    Budget::Counted {
        remaining,
        window_ns: settled.window_ns,
    }
}

async fn reserve(
    store: &Store,
    t: &mut Table,
    part: Option<&Parts>,
    limits: &[Limit],
    sends: Vec<Send>,
) -> Vec<Send> {
    let counter_of = |_: &BucketKey| Some(("k".to_owned(), limits));
    let reserved = |_: &BucketKey, counter: &Counter<'_>, tokens| {
        if let Some(part) = part {
            part.mirror(counter, Hits::Charge(tokens));
        }
    };
    let shrink = |stream, bucket: &BucketKey, tokens| t.shrink(stream, bucket, tokens);
    reserve_grants(store, sends, counter_of, reserved, shrink).await
}

fn deliver(envoys: &mut [Envoy], sends: &[Send]) {
    for (stream, strategy) in assigned(sends) {
        envoys[stream as usize - 1].apply(strategy);
    }
}
