use std::sync::Arc;
use std::time::Duration;

use tollgate_core::ManualClock;

use super::*;

const S: u64 = 1_000_000_000;

fn bucket(value: &str) -> BucketKey {
    BucketKey {
        domain: Arc::from("d"),
        entries: vec![("k".to_owned(), value.to_owned())].into(),
    }
}

/// `per_s` requests per second for this instance's streams together, of a 1 s window.
fn per_second(per_s: f64) -> Budget {
    Budget::Rate {
        per_s,
        window_ns: S,
    }
}

fn table(clock: &ManualClock) -> Table {
    Table::new(Arc::new(clock.clone()), Duration::from_secs(30))
}

fn stats(streams: usize, buckets: usize) -> TableStats {
    TableStats { streams, buckets }
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

/// The rates sent, as (stream, requests per second).
fn rates(sends: &[Send]) -> Vec<(StreamId, f64)> {
    assigned(sends)
        .into_iter()
        .map(|(id, s)| (id, rate_of(s)))
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
    let sends = report(&mut t, 1, 1, 0, per_second(20.0));
    // Half: room is kept for an Envoy that subscribes next; a quarter second of it to
    // spend at once.
    assert_eq!(
        sends,
        vec![Send {
            stream: 1,
            bucket: bucket("a"),
            action: Action::Assign {
                strategy: Strategy::TokenBucket {
                    max_tokens: 3,
                    tokens_per_fill: 100,
                    fill_interval_s: 10,
                },
                ttl_s: 15,
                fresh: true,
            },
        }]
    );
    assert_eq!(t.period_ns(1, &bucket("a")), Some(0));
    clock.advance(2 * S);
    assert_eq!(t.period_ns(1, &bucket("a")), Some(2 * S));
    // Its second report shows a rate: alone, it gets the whole.
    let sends = report(&mut t, 1, 30, 10, per_second(20.0));
    assert!(matches!(sends[0].action, Action::Assign { ttl_s: 6, .. }));
    assert_eq!(rates(&sends), vec![(1, 20.0)]);
    assert_eq!(t.stats(), stats(1, 1));
}

#[test]
fn an_unchanged_rate_is_sent_again_as_it_is_and_small_drifts_keep_it() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 1, 0, per_second(20.0));
    clock.advance(5 * S);
    let first = report(&mut t, 1, 100, 0, per_second(20.0));
    assert!(matches!(
        first[0].action,
        Action::Assign { fresh: true, .. }
    ));
    clock.advance(5 * S);
    // The part grew by 3 %: Envoy keeps its bucket (tokens and all), not a full new one.
    let again = report(&mut t, 1, 100, 0, per_second(20.6));
    assert_eq!(assigned(&again), assigned(&first));
    assert!(matches!(
        again[0].action,
        Action::Assign { fresh: false, .. }
    ));
    clock.advance(5 * S);
    let halved = report(&mut t, 1, 100, 0, per_second(10.0));
    assert_eq!(rates(&halved), vec![(1, 10.0)]);
    assert!(matches!(
        halved[0].action,
        Action::Assign { fresh: true, .. }
    ));
}

#[test]
fn a_newcomer_waits_for_the_rate_others_hold_then_gets_it_pushed() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 1, 0, per_second(20.0));
    clock.advance(5 * S);
    assert_eq!(
        rates(&report(&mut t, 1, 150, 0, per_second(20.0))),
        vec![(1, 20.0)]
    );
    // Stream 1 holds the whole rate until it reports: nothing is left for stream 2.
    assert_eq!(
        assigned(&report(&mut t, 2, 1, 0, per_second(20.0))),
        vec![(2, Strategy::DenyAll)]
    );
    clock.advance(5 * S);
    // Stream 1 gets its part by demand (30 a second, and the newcomer counts as the others
    // do: half), and stream 2 is pushed its part of the rate stream 1 left (a third: it
    // counts itself twice, as if an equal newcomer followed).
    let sends = rates(&report(&mut t, 1, 100, 50, per_second(20.0)));
    assert_eq!(sends[0], (1, 10.0));
    assert_eq!(sends[1].0, 2);
    assert!((6.5..=20.0 / 3.0).contains(&sends[1].1), "{sends:?}");
    clock.advance(5 * S);
    // Stream 2's demand is known now (100 in 10 s against stream 1's 30 a second): a
    // quarter; and stream 1 is pushed the three quarters at once.
    let sends = rates(&report(&mut t, 2, 40, 60, per_second(20.0)));
    assert_eq!(sends, vec![(2, 5.0), (1, 15.0)]);
}

#[test]
fn a_closed_streams_rate_is_pushed_to_the_others() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 1, 0, per_second(20.0));
    report(&mut t, 2, 1, 0, per_second(20.0));
    clock.advance(5 * S);
    report(&mut t, 1, 50, 50, per_second(20.0));
    report(&mut t, 2, 50, 50, per_second(20.0));
    let departures = t.close(1);
    assert_eq!(rates(&departures.sends), vec![(2, 20.0)]);
    assert_eq!(departures.emptied, vec![]);
    assert_eq!(t.stats(), stats(1, 1));
    assert_eq!(t.close(2).emptied, vec![bucket("a")]);
}

#[test]
fn idle_buckets_are_abandoned() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    let allow = Budget::Fixed(Strategy::AllowAll);
    report(&mut t, 1, 1, 0, allow);
    t.report(2, &bucket("b"), 1, 0, allow)
        .expect("under the cap");
    clock.advance(20 * S);
    // Reports without requests do not keep a bucket alive; requests do.
    report(&mut t, 1, 0, 0, allow);
    t.report(2, &bucket("b"), 3, 0, allow)
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
        }
    );
    assert_eq!(t.stats(), stats(2, 1));
}

#[test]
fn new_rules_are_pushed_to_every_stream_whose_assignment_changes() {
    let clock = ManualClock::new(100 * S);
    let mut t = table(&clock);
    report(&mut t, 1, 1, 0, per_second(20.0));
    report(&mut t, 2, 1, 0, per_second(20.0));
    let deny = Budget::Fixed(Strategy::DenyAll);
    assert_eq!(
        assigned(&t.replan(&bucket("a"), deny)),
        vec![(1, Strategy::DenyAll), (2, Strategy::DenyAll)]
    );
    assert_eq!(t.replan(&bucket("a"), deny), vec![]);
    assert_eq!(t.replan(&bucket("unknown"), deny), vec![]);
    // A new limit is divided again from nothing (neither stream's rate is known: each
    // gets a third, as a newcomer), and each new bucket starts full.
    let sends = t.replan(&bucket("a"), per_second(40.0));
    let third = rates(&sends);
    assert_eq!(third.len(), 2);
    assert!(
        third.iter().all(|(_, r)| (13.0..=40.0 / 3.0).contains(r)),
        "{third:?}"
    );
    assert!(
        sends
            .iter()
            .all(|s| matches!(s.action, Action::Assign { fresh: true, .. }))
    );
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
