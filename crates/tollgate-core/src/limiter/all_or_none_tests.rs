//! All or none on the memory store: a refused request moves no counter (but by its charges
//! and refunds), whatever its descriptors, and no other request sees its units counted in
//! passing.

use std::sync::Arc;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::store::MemoryStore;

const SECOND: u64 = crate::clock::NANOS_PER_SECOND;

/// The issue's rules: an organisation, its teams and their members (100, 50, 10 a
/// minute); `user` 1 a minute beside `org`; a budget charged at stream end; an in-flight
/// limit; a rule that refuses everything.
pub(super) const RULES: &str = r#"
domain: d
descriptors:
  - key: org
    rate_limit: {unit: minute, requests_per_unit: 100}
    descriptors:
      - key: team
        rate_limit: {unit: minute, requests_per_unit: 50}
        descriptors:
          - key: member
            rate_limit: {unit: minute, requests_per_unit: 10}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tokens
    budget: true
    rate_limit: {unit: hour, requests_per_unit: 1000}
  - key: slots
    in_flight: {max: 1, expire_after: 60s}
  - key: closed
    rate_limit: {unit: minute, requests_per_unit: 0}
  - key: many
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

fn limiter_on(options: Options) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_nanos(1_000 * SECOND));
    let rules = Rules::from_yaml("rules.yaml", RULES).expect("rules load");
    let store = Store::Memory(MemoryStore::new(
        crate::Capacity::default(),
        Arc::new(clock.clone()),
    ));
    (Limiter::with_recorder(rules, store, options, ()), clock)
}

fn limiter() -> Limiter {
    limiter_on(Options::default()).0
}

/// `[org=o]`, `[org=o, team=t]` and `[org=o, team=t, member=m]`, each with `hits`.
pub(super) fn levels(
    team: &'static str,
    member: &'static str,
    hits: Hits,
) -> Vec<Descriptor<'static>> {
    vec![
        Descriptor::new([("org", "o")]).with_hits(hits),
        Descriptor::new([("org", "o"), ("team", team)]).with_hits(hits),
        Descriptor::new([("org", "o"), ("team", team), ("member", member)]).with_hits(hits),
    ]
}

async fn decide(l: &Limiter, descriptors: Vec<Descriptor<'_>>) -> Decision {
    l.decide(&Request::new("d", descriptors))
        .await
        .expect("decides")
}

/// What is left on each descriptor of `descriptors`, checked (counting nothing).
async fn left(l: &Limiter, descriptors: Vec<Descriptor<'_>>) -> Vec<u64> {
    let checks = descriptors
        .into_iter()
        .map(|d| d.with_hits(Hits::Check))
        .collect();
    decide(l, checks)
        .await
        .descriptors
        .iter()
        .map(|o| o.limited().expect("counted").remaining)
        .collect()
}

#[tokio::test]
async fn a_request_refused_on_one_descriptor_counts_on_none() {
    // The issue: `org` 100 and `user` 1 a minute, three requests carrying both.
    let l = limiter();
    let both = || {
        vec![
            Descriptor::new([("org", "acme")]),
            Descriptor::new([("user", "ann")]),
        ]
    };
    let overs: Vec<bool> = [
        decide(&l, both()).await,
        decide(&l, both()).await,
        decide(&l, both()).await,
    ]
    .iter()
    .map(|d| d.over_limit)
    .collect();
    assert_eq!(overs, [false, true, true]);
    assert_eq!(
        left(&l, vec![Descriptor::new([("org", "acme")])]).await,
        [99],
        "org counted the admitted request only"
    );
}

#[tokio::test]
async fn a_member_refused_at_ten_leaves_team_and_org_unchanged() {
    let l = limiter();
    for _ in 0..10 {
        assert!(
            !decide(&l, levels("t", "m", Hits::Consume(1)))
                .await
                .over_limit
        );
    }
    for _ in 0..5 {
        let refused = decide(&l, levels("t", "m", Hits::Consume(1))).await;
        assert!(refused.over_limit);
        let hits: Vec<u64> = refused
            .descriptors
            .iter()
            .map(|o| o.limited().expect("counted").hits)
            .collect();
        assert_eq!(hits[..2], [0, 0], "org and team counted nothing");
    }
    assert_eq!(left(&l, levels("t", "m", Hits::Check)).await, [90, 40, 0]);
}

#[tokio::test]
async fn a_team_exhausted_by_others_refuses_the_member() {
    let l = limiter();
    for member in ["a", "b", "c", "d", "e"] {
        for _ in 0..10 {
            assert!(
                !decide(&l, levels("t", member, Hits::Consume(1)))
                    .await
                    .over_limit
            );
        }
    }
    let refused = decide(&l, levels("t", "f", Hits::Consume(1))).await;
    assert!(refused.over_limit, "the team has used its 50");
    assert!(refused.descriptors[1].is_over());
    assert!(
        !refused.descriptors[2].is_over(),
        "the member alone had room"
    );
    assert_eq!(left(&l, levels("t", "f", Hits::Check)).await, [50, 0, 10]);
    // Another team of the organisation still has its own 50.
    assert!(
        !decide(&l, levels("u", "f", Hits::Consume(1)))
            .await
            .over_limit
    );
}

#[tokio::test]
async fn a_refund_gives_back_every_level_it_names() {
    let l = limiter();
    decide(&l, levels("t", "m", Hits::Consume(10))).await;
    assert_eq!(left(&l, levels("t", "m", Hits::Check)).await, [90, 40, 0]);
    // The member is at its limit; the refund names every level and frees each.
    let refund = decide(&l, levels("t", "m", Hits::Refund(4))).await;
    assert!(!refund.over_limit);
    assert_eq!(left(&l, levels("t", "m", Hits::Check)).await, [94, 44, 4]);
    // More than was counted: each level is emptied, never below nothing.
    decide(&l, levels("t", "m", Hits::Refund(1_000))).await;
    assert_eq!(left(&l, levels("t", "m", Hits::Check)).await, [100, 50, 10]);
    let mut fitted = 0;
    for _ in 0..11 {
        fitted += usize::from(
            !decide(&l, levels("t", "m", Hits::Consume(1)))
                .await
                .over_limit,
        );
    }
    assert_eq!(fitted, 10, "the refund freed no unit that was not counted");
}

#[tokio::test]
async fn charges_are_recorded_though_the_request_is_refused() {
    let (l, _) = limiter_on(Options {
        all_or_nothing: true,
        ..Options::default()
    });
    let request = || {
        vec![
            Descriptor::new([("user", "ann")]),
            Descriptor::new([("tokens", "ann")]).with_hits(Hits::Consume(300)),
        ]
    };
    assert!(!decide(&l, request()).await.over_limit);
    let refused = decide(&l, request()).await;
    assert!(refused.over_limit, "user is over");
    assert_eq!(refused.descriptors[1].limited().expect("counted").hits, 300);
    assert_eq!(
        left(&l, vec![Descriptor::new([("tokens", "ann")])]).await,
        [400]
    );
}

#[tokio::test]
async fn the_same_counter_named_twice_counts_both_or_neither() {
    let l = limiter();
    let twice = || vec![Descriptor::new([("org", "o")]).with_hits(Hits::Consume(30)); 2];
    assert!(!decide(&l, twice()).await.over_limit, "60 of 100");
    let refused = decide(&l, twice()).await;
    assert!(refused.over_limit, "the first 30 fit, the second not");
    assert_eq!(left(&l, vec![Descriptor::new([("org", "o")])]).await, [40]);
}

#[tokio::test]
async fn sixty_four_descriptors_all_over_move_nothing() {
    let l = limiter();
    let values: Vec<String> = (0..64).map(|i| format!("v{i}")).collect();
    let request = |hits| {
        values
            .iter()
            .map(|v| Descriptor::new([("many", v.as_str())]).with_hits(hits))
            .collect::<Vec<_>>()
    };
    assert!(!decide(&l, request(Hits::Consume(1))).await.over_limit);
    let refused = decide(&l, request(Hits::Consume(1))).await;
    assert!(refused.over_limit);
    assert!(refused.descriptors.iter().all(Outcome::is_over));
    assert!(left(&l, request(Hits::Check)).await.iter().all(|&n| n == 0));
    // One over among 64: the 63 that fit give back what they took.
    let fresh: Vec<String> = (0..63).map(|i| format!("w{i}")).collect();
    let mut fresh_request: Vec<Descriptor<'_>> = fresh
        .iter()
        .map(|v| Descriptor::new([("many", v.as_str())]))
        .collect();
    fresh_request.push(Descriptor::new([("closed", "x")]));
    assert!(decide(&l, fresh_request).await.over_limit);
    let checks = fresh
        .iter()
        .map(|v| Descriptor::new([("many", v.as_str())]))
        .collect();
    assert!(
        left(&l, checks).await.iter().all(|&n| n == 1),
        "nothing counted"
    );
}

#[tokio::test]
async fn a_slot_taken_by_a_refused_request_is_free_again() {
    let l = limiter();
    let request = vec![
        Descriptor::new([("slots", "s")]),
        Descriptor::new([("closed", "x")]),
    ];
    let refused = decide(&l, request).await;
    assert!(refused.over_limit);
    let slot = refused.descriptors[0].limited().expect("counted");
    assert_eq!((slot.hits, slot.answered_metadata()), (0, None));
    let alone = decide(&l, vec![Descriptor::new([("slots", "s")])]).await;
    assert!(!alone.over_limit, "the slot was given back");
}

#[tokio::test]
async fn counting_on_its_own_is_still_there_when_asked_for() {
    let (l, _) = limiter_on(Options {
        all_or_nothing: false,
        ..Options::default()
    });
    let both = || {
        vec![
            Descriptor::new([("org", "o")]),
            Descriptor::new([("user", "u")]),
        ]
    };
    decide(&l, both()).await;
    assert!(decide(&l, both()).await.over_limit);
    assert_eq!(left(&l, vec![Descriptor::new([("org", "o")])]).await, [98]);
}

#[tokio::test]
async fn shadow_mode_counts_as_the_enforced_answer_would() {
    let (l, _) = limiter_on(Options {
        global_shadow_mode: true,
        ..Options::default()
    });
    let both = || {
        vec![
            Descriptor::new([("org", "o")]),
            Descriptor::new([("user", "u")]),
        ]
    };
    decide(&l, both()).await;
    let shadowed = decide(&l, both()).await;
    assert!(!shadowed.over_limit, "shadow mode admits");
    assert_eq!(left(&l, vec![Descriptor::new([("org", "o")])]).await, [99]);
}

/// While requests over on `closed` keep counting on `org` and giving it back, a client
/// alone on `org` (limit 100, 99 used) is admitted every time: nobody ever sees the
/// units those requests take and return.
#[test]
fn no_request_sees_the_units_of_a_refused_one() {
    let (l, _) = limiter_on(Options::default());
    let l = Arc::new(l);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let org = || vec![Descriptor::new([("org", "o")])];
        decide(
            &l,
            vec![Descriptor::new([("org", "o")]).with_hits(Hits::Consume(99))],
        )
        .await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let refused: Vec<_> = (0..2)
            .map(|_| {
                let (l, stop) = (Arc::clone(&l), Arc::clone(&stop));
                tokio::spawn(async move {
                    let mut n = 0_u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let request = vec![
                            Descriptor::new([("org", "o")]),
                            Descriptor::new([("closed", "x")]),
                        ];
                        assert!(decide(&l, request).await.over_limit);
                        n += 1;
                        tokio::task::yield_now().await;
                    }
                    n
                })
            })
            .collect();
        let mut denied = 0;
        for _ in 0..20_000 {
            let one = decide(&l, org()).await;
            denied += usize::from(one.over_limit);
            if !one.over_limit {
                let back = org()
                    .into_iter()
                    .map(|d| d.with_hits(Hits::Refund(1)))
                    .collect();
                decide(&l, back).await;
            }
            tokio::task::yield_now().await;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut others = 0;
        for task in refused {
            others += task.await.expect("a task");
        }
        assert!(others > 0, "the refused requests ran");
        assert_eq!(denied, 0, "{denied} of 20,000 saw a refused request's unit");
    });
}

#[tokio::test]
async fn one_counter_named_sixty_four_times_is_counted_whole_or_not_at_all() {
    let l = limiter();
    let same = |n| vec![Descriptor::new([("many", "same")]).with_hits(Hits::Consume(1)); n];
    let refused = decide(&l, same(64)).await;
    assert!(
        refused.over_limit,
        "the first fits its limit of 1, the 63 after it not"
    );
    assert!(
        !decide(&l, same(1)).await.over_limit,
        "the refused request left its first unit uncounted"
    );
}

/// Requests naming two counters in opposite orders, on three threads: their shards are
/// always locked in one order, so none waits on another for ever. Every request is
/// refused (`closed`), so the counters stay empty throughout.
#[test]
fn requests_locking_counters_in_opposite_orders_never_deadlock() {
    let (l, _) = limiter_on(Options::default());
    let l = Arc::new(l);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(3)
        .enable_time()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let orders = [["x", "y"], ["y", "x"], ["x", "y"]];
        let tasks: Vec<_> = orders
            .into_iter()
            .map(|[first, second]| {
                let l = Arc::clone(&l);
                tokio::spawn(async move {
                    for _ in 0..20_000 {
                        let request = vec![
                            Descriptor::new([("org", first)]),
                            Descriptor::new([("org", second)]),
                            Descriptor::new([("closed", "c")]),
                        ];
                        assert!(decide(&l, request).await.over_limit);
                    }
                })
            })
            .collect();
        let all = futures_util::future::join_all(tasks);
        let done = tokio::time::timeout(std::time::Duration::from_secs(120), all).await;
        for joined in done.expect("requests still waiting on each other's locks") {
            joined.expect("a task");
        }
        let orgs = vec![
            Descriptor::new([("org", "x")]),
            Descriptor::new([("org", "y")]),
        ];
        assert_eq!(left(&l, orgs).await, [100, 100]);
    });
}
