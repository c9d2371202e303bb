use std::sync::Arc;
use std::time::Duration;

use tollgate_core::{Algorithm, Capacity, Hits, Limit, ManualClock, MemoryStore, Store, Unit};

use super::*;

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
    Table::new(Arc::new(clock.clone()), Duration::from_secs(30))
}

fn stats(streams: usize, buckets: usize) -> TableStats {
    TableStats { streams, buckets }
}

fn tokens(max_tokens: u32, tokens_per_fill: u32) -> Strategy {
    Strategy::TokenBucket {
        max_tokens,
        tokens_per_fill,
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

fn report(t: &mut Table, stream: StreamId, allowed: u64, denied: u64, budget: Budget) -> Vec<Send> {
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
            action: Action::Assign {
                strategy: tokens(100, 1),
                ttl_s: 15,
            },
        }]
    );
    clock.advance(2 * S);
    let sends = report(&mut t, 1, 0, 0, counted(99));
    assert!(matches!(sends[0].action, Action::Assign { ttl_s: 6, .. }));
    assert_eq!(t.stats(), stats(1, 1));
}

#[test]
fn a_newcomer_waits_for_the_room_others_hold_then_gets_it_pushed() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    assert_eq!(
        assigned(&report(&mut t, 1, 10, 0, counted(100))),
        vec![(1, tokens(100, 1))]
    );
    // Stream 1 may have spent all 100 unreported: nothing is free for stream 2.
    assert_eq!(
        assigned(&report(&mut t, 2, 0, 10, counted(100))),
        vec![(2, Strategy::DenyAll)]
    );
    clock.advance(S);
    // Stream 1 spent 30; of the 70 left it gets its part by demand (20 of 30), and
    // stream 2 is pushed its part of what is free.
    assert_eq!(
        assigned(&report(&mut t, 1, 30, 0, counted(70))),
        vec![(1, tokens(46, 1)), (2, tokens(23, 1))]
    );
}

#[test]
fn a_spent_grant_of_the_same_size_is_sent_as_a_new_bucket() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 1, 0, counted(50));
    // Envoy keeps an unchanged token bucket (emptied); a spent one must differ.
    assert_eq!(
        assigned(&report(&mut t, 1, 5, 0, counted(50))),
        vec![(1, tokens(50, 2))]
    );
    assert_eq!(
        assigned(&report(&mut t, 1, 5, 0, counted(50))),
        vec![(1, tokens(50, 1))]
    );
    // Nothing spent: the same bucket, kept.
    assert_eq!(
        assigned(&report(&mut t, 1, 0, 0, counted(50))),
        vec![(1, tokens(50, 1))]
    );
}

#[test]
fn a_closed_stream_hands_its_share_on_once_its_last_grant_has_aged_out() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 10, 0, counted(100));
    assert_eq!(
        assigned(&report(&mut t, 2, 0, 10, counted(100))),
        vec![(2, Strategy::DenyAll)]
    );
    // Stream 1's grant may have been spent without a report: held back for a window.
    assert_eq!(t.close(1), vec![]);
    clock.advance(S);
    assert_eq!(
        assigned(&report(&mut t, 2, 0, 10, counted(100))),
        vec![(2, Strategy::DenyAll)]
    );
    clock.advance(WINDOW_NS);
    assert_eq!(
        assigned(&report(&mut t, 2, 0, 10, counted(100))),
        vec![(2, tokens(100, 1))]
    );
    assert_eq!(t.stats(), stats(1, 1));
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
    assert_eq!(t.sweep(), vec![]);
    clock.advance(10 * S);
    assert_eq!(
        t.sweep(),
        vec![Send {
            stream: 1,
            bucket: bucket("a"),
            action: Action::Abandon,
        }]
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
        Err(TooManyBuckets)
    );
    // Another stream is not affected.
    assert!(t.report(2, &bucket("one more"), 1, 0, allow).is_ok());
}

/// One simulated Envoy: arrivals at a steady rate, its assignment enforced as Envoy 1.40
/// does (a token bucket starts full and refills continuously; an unchanged one is kept).
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
        if let Strategy::TokenBucket { max_tokens, .. } = strategy
            && self.strategy != Some(strategy)
        {
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
                tokens_per_fill,
                fill_interval_s,
            }) => {
                let refill = f64::from(tokens_per_fill) / fill_interval_s as f64 * dt_s;
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
/// half-way, then demand shifting between the others. Counted on a real memory store with a fixed window. Per window, the admitted
/// total stays within the limit plus Envoy's refill (at most 2 tokens per stream per window,
/// tokens_per_fill ≤ 2 per window) plus the first request of each subscription (admitted
/// before any assignment); and the limit is used.
#[tokio::test]
async fn a_simulated_fleet_admits_the_limit_per_window_and_no_more() {
    const LIMIT: u64 = 100;
    let start = 1_000 * WINDOW_NS;
    let clock = ManualClock::new(start);
    let store = Store::Memory(MemoryStore::new(
        Capacity::default(),
        Arc::new(clock.clone()),
    ));
    let limits = [Limit::new(LIMIT as u32, Unit::Second)
        .with_multiplier(10)
        .and_then(|l| l.with_algorithm(Algorithm::FixedWindow))
        .expect("a valid limit")];
    let mut t = Table::new(Arc::new(clock.clone()), Duration::from_secs(60));
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
    let mut admitted = vec![0u64; windows];
    for tick in 0..(windows as u64 * WINDOW_NS / tick_ns) {
        let now = start + tick * tick_ns;
        clock.advance(now - clock.now_ns());
        let window = ((now - start) / WINDOW_NS) as usize;
        if now - start == 35 * S {
            envoys[1].alive = false;
            let sends = t.close(2);
            deliver(&mut envoys, &sends);
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
                let verdict = store
                    .apply("k", &limits, Hits::Charge(allowed))
                    .await
                    .expect("memory store");
                let remaining = match verdict.decision.admitted {
                    true => verdict.decision.remaining,
                    false => 0,
                };
                let budget = Budget::Counted {
                    remaining,
                    window_ns: WINDOW_NS,
                };
                let sends = t
                    .report(i as StreamId + 1, &bucket("a"), allowed, denied, budget)
                    .expect("under the cap");
                deliver(&mut envoys, &sends);
            }
        }
    }
    let refill = 2 * envoys.len() as u64;
    for (w, n) in admitted.iter().enumerate() {
        let subscriptions = if w == 0 { envoys.len() as u64 } else { 0 };
        assert!(
            *n <= LIMIT + refill + subscriptions,
            "window {w} admitted {n}: {admitted:?}"
        );
        assert!(
            *n >= LIMIT * 9 / 10,
            "window {w} admitted only {n}: {admitted:?}"
        );
    }
}

fn deliver(envoys: &mut [Envoy], sends: &[Send]) {
    for (stream, strategy) in assigned(sends) {
        envoys[stream as usize - 1].apply(strategy);
    }
}
