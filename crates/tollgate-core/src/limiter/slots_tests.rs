//! In-flight rules on the memory store, on the injected clock: slots taken, refused past
//! `max`, released by refunds, and freed by themselves after `expire_after`.

use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::decision::InFlight;
use crate::store::MemoryStore;

const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    in_flight: {max: 2, expire_after: 60s}
"#;

fn limiter() -> (Limiter, ManualClock) {
    limiter_with(Options::default())
}

fn limiter_with(options: Options) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_nanos(1_000_000_000_000));
    let rules = Rules::from_yaml("rules.yaml", RULES).expect("rules load");
    let store = Store::Memory(MemoryStore::new(
        crate::Capacity::default(),
        Arc::new(clock.clone()),
    ));
    let limiter = Limiter::with_recorder(rules, store, options, ());
    (limiter, clock)
}

async fn hit(l: &Limiter, hits: Hits) -> Limited {
    super::tests::limited_on(l, "d", ("user", "ann"), hits).await
}

#[tokio::test]
async fn slots_are_taken_up_to_max_and_a_release_frees_one_at_once() {
    let (l, _) = limiter();
    for left in [1, 0] {
        let taken = hit(&l, Hits::Consume(1)).await;
        assert!(taken.admitted);
        assert_eq!(taken.remaining, left);
        assert_eq!(taken.limit.requests_per_unit(), 2, "the answer carries max");
    }
    let third = hit(&l, Hits::Consume(1)).await;
    assert!(!third.admitted, "the third in flight is refused");
    let released = hit(&l, Hits::Refund(1)).await;
    assert!(released.admitted);
    assert_eq!(released.remaining, 1, "the refused one took no slot");
    assert!(hit(&l, Hits::Consume(1)).await.admitted);
    assert!(!hit(&l, Hits::Consume(1)).await.admitted);
}

#[tokio::test]
async fn a_hit_of_several_takes_all_its_slots_or_none() {
    let (l, _) = limiter();
    assert!(hit(&l, Hits::Consume(1)).await.admitted);
    assert!(!hit(&l, Hits::Consume(2)).await.admitted);
    let check = hit(&l, Hits::Check).await;
    assert_eq!(check.remaining, 1, "the refused hit took no slot");
    assert!(hit(&l, Hits::Consume(1)).await.admitted);
}

#[tokio::test]
async fn a_slot_never_released_frees_itself_after_expire_after() {
    let (l, clock) = limiter();
    assert!(hit(&l, Hits::Consume(1)).await.admitted);
    clock.advance(Duration::from_secs(30));
    assert!(hit(&l, Hits::Consume(1)).await.admitted);
    let full = hit(&l, Hits::Consume(1)).await;
    assert!(!full.admitted);
    assert_eq!(
        full.reset,
        Duration::from_secs(30),
        "when the oldest frees itself"
    );
    clock.advance(Duration::from_secs(30));
    assert!(
        hit(&l, Hits::Consume(1)).await.admitted,
        "the oldest freed itself"
    );
    assert!(!hit(&l, Hits::Consume(1)).await.admitted);
}

#[tokio::test]
async fn quota_mode_never_takes_a_slot_past_max() {
    let (l, _) = limiter_with(Options {
        quota_mode: true,
        ..Options::default()
    });
    for _ in 0..3 {
        hit(&l, Hits::Consume(1)).await;
    }
    assert_eq!(hit(&l, Hits::Check).await.remaining, 0);
    hit(&l, Hits::Refund(1)).await;
    assert_eq!(
        hit(&l, Hits::Check).await.remaining,
        1,
        "two were taken, not three"
    );
}

#[tokio::test]
async fn explain_shows_the_slots_held() {
    let (l, _) = limiter();
    hit(&l, Hits::Consume(1)).await;
    let request = Request::new("d", vec![Descriptor::new([("user", "ann")])]);
    let explained = l.explain(&request).await.expect("explains");
    let peek = explained.descriptors[0].peek.as_ref().expect("peeked");
    let local = peek.local.as_ref().expect("the memory store's counter");
    assert_eq!(local.limits[0].count, 1, "one slot held");
    assert_eq!(local.limits[0].remaining, 1);
    assert_eq!(
        hit(&l, Hits::Check).await.remaining,
        1,
        "explaining took none"
    );
}

#[tokio::test]
async fn each_call_says_the_slots_held_released_and_expired() {
    let (l, clock) = limiter();
    let moved = |held, released, expired| {
        Some(InFlight {
            held,
            released,
            expired,
        })
    };
    assert_eq!(hit(&l, Hits::Consume(1)).await.in_flight, moved(1, 0, 0));
    assert_eq!(hit(&l, Hits::Consume(1)).await.in_flight, moved(2, 0, 0));
    let refused = hit(&l, Hits::Consume(1)).await;
    assert_eq!(refused.in_flight, moved(2, 0, 0), "a refusal takes nothing");
    let released = hit(&l, Hits::Refund(5)).await;
    assert_eq!(released.in_flight, moved(0, 2, 0), "released: those held");
    assert_eq!(hit(&l, Hits::Consume(2)).await.in_flight, moved(2, 0, 0));
    // Never released: the next call after expire_after counts them, even once the last
    // slot is gone (the counter is kept a window longer for that).
    clock.advance(Duration::from_secs(119));
    let found = hit(&l, Hits::Check).await;
    assert_eq!(found.in_flight, moved(0, 0, 2), "the leaked slots counted");
    assert_eq!(hit(&l, Hits::Check).await.in_flight, moved(0, 0, 0), "once");
}
