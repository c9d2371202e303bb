use std::sync::Arc;

use crate::clock::{ManualClock, NANOS_PER_SECOND, Timestamp};
use crate::top::{CAPACITY, TopBy, TopEntry, TopWindow};
use crate::{Capacity, Descriptor, Limiter, MemoryStore, Options, Request, Rules, Store, TopQuery};

const RULES: &str = r#"
domain: web
descriptors:
  - key: ip
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 100}
"#;

fn limiter() -> (Limiter, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_nanos(1_000 * NANOS_PER_SECOND));
    let rules = Rules::from_yaml("rules.yaml", RULES).expect("rules load");
    let store = Store::Memory(MemoryStore::new(
        Capacity::default(),
        Arc::new(clock.clone()),
    ));
    let limiter = Limiter::with_recorder(rules, store, Options::default(), ());
    (limiter, clock)
}

/// Three heavy values (`a` thrice as often as `c`, `b` twice) among 6,000 one-off values
/// of `key`: 12,000 requests in all.
async fn heavy_mix(limiter: &Limiter, key: &str) {
    for i in 0..6_000u32 {
        let one_off = format!("x{i}");
        let heavy = [(i % 2 == 0, "a"), (i % 3 == 0, "b"), (i % 6 == 0, "c")];
        let values = heavy.iter().filter(|(on, _)| *on).map(|(_, v)| *v);
        for value in values.chain([one_off.as_str()]) {
            let request = Request::new("web", vec![Descriptor::new([(key, value)])]);
            limiter.decide(&request).await.expect("decides");
        }
    }
}

fn top(limiter: &Limiter, by: TopBy, window: TopWindow) -> Vec<TopEntry> {
    limiter.top(&TopQuery {
        domain: Some("web"),
        rule: None,
        by,
        window,
        n: 3,
        fleet: false,
    })
}

/// The entries name `expected` (descriptor, true count) in order, each true count within
/// the entry's stated bounds, each error within the sketch's bound.
fn assert_named(entries: &[TopEntry], rule: &str, expected: [(&str, u64); 3], total: u64) {
    let names: Vec<_> = entries.iter().map(|e| e.descriptor.as_str()).collect();
    let wanted: Vec<_> = expected.iter().map(|(d, _)| *d).collect();
    assert_eq!(names, wanted, "{entries:?}");
    for (entry, (_, truth)) in entries.iter().zip(expected) {
        assert_eq!(entry.rule, rule);
        assert!(
            entry.count >= truth && entry.count - entry.error <= truth,
            "{entry:?}"
        );
        assert!(entry.error <= total / CAPACITY as u64, "{entry:?}");
    }
}

#[tokio::test]
async fn the_heaviest_keys_are_named_in_order_within_the_error() {
    let (limiter, _clock) = limiter();
    heavy_mix(&limiter, "ip").await;
    let total = 12_000;
    let hits = [("ip=a", 3_000), ("ip=b", 2_000), ("ip=c", 1_000)];
    assert_named(
        &top(&limiter, TopBy::Hits, TopWindow::Minute),
        "ip",
        hits,
        total,
    );
    assert_named(
        &top(&limiter, TopBy::Hits, TopWindow::Hour),
        "ip",
        hits,
        total,
    );
    let denied = [("ip=a", 2_900), ("ip=b", 1_900), ("ip=c", 900)];
    assert_named(
        &top(&limiter, TopBy::Denied, TopWindow::Minute),
        "ip",
        denied,
        5_700,
    );
    assert!(top(&limiter, TopBy::Shadow, TopWindow::Minute).is_empty());
}

#[tokio::test]
async fn shadow_mode_would_be_denials_are_ranked_the_same_way() {
    let (limiter, _clock) = limiter();
    heavy_mix(&limiter, "trial").await;
    let shadow = [("trial=a", 2_900), ("trial=b", 1_900), ("trial=c", 900)];
    assert_named(
        &top(&limiter, TopBy::Shadow, TopWindow::Minute),
        "trial",
        shadow,
        5_700,
    );
    assert!(top(&limiter, TopBy::Denied, TopWindow::Minute).is_empty());
}

#[tokio::test]
async fn a_minute_later_the_minute_forgets_and_the_hour_remembers() {
    let (limiter, clock) = limiter();
    heavy_mix(&limiter, "ip").await;
    clock.advance(std::time::Duration::from_secs(61));
    assert!(top(&limiter, TopBy::Hits, TopWindow::Minute).is_empty());
    assert_eq!(top(&limiter, TopBy::Hits, TopWindow::Hour).len(), 3);
}

#[tokio::test]
async fn a_reload_that_keeps_a_rule_keeps_its_keys() {
    let (limiter, _clock) = limiter();
    heavy_mix(&limiter, "ip").await;
    limiter.install(Rules::from_yaml("rules.yaml", RULES).expect("rules load"));
    assert_eq!(top(&limiter, TopBy::Hits, TopWindow::Minute).len(), 3);
}
