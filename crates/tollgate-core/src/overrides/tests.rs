use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::clock::ManualClock;
use crate::decision::{Limited, Outcome};
use crate::limiter::{Limiter, Matched, Options};
use crate::request::{Descriptor, Request};
use crate::store::{MemoryStore, Store};

const RULES: &str = r#"
domain: api
descriptors:
  - key: tenant
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: plan
    value: free
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

const START_SECONDS: u64 = 1_000;

fn limiter() -> (Limiter, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_nanos(START_SECONDS * NANOS_PER_SECOND));
    let rules = Rules::from_yaml("rules.yaml", RULES).expect("rules load");
    let store = Store::Memory(MemoryStore::new(
        crate::Capacity::default(),
        Arc::new(clock.clone()),
    ));
    (
        Limiter::with_recorder(rules, store, Options::default(), ()),
        clock,
    )
}

fn spec(value: &str, requests_per_unit: u32, unit: &str) -> Override {
    Override {
        domain: "api".into(),
        entries: vec![OverrideEntry {
            key: "tenant".into(),
            value: value.into(),
        }],
        limit: OverrideLimit {
            requests_per_unit,
            unit: unit.into(),
            unit_multiplier: None,
            algorithm: None,
            name: None,
        },
        expires_at: None,
    }
}

fn set(l: &Limiter, o: Override) {
    let compiled = l.compile_override(o, "test").expect("valid override");
    let mut all = Overrides::clone(&l.overrides());
    all.insert(compiled, DEFAULT_MAX_OVERRIDES)
        .expect("room for it");
    l.set_overrides(all);
}

async fn hit(l: &Limiter, value: &str) -> Limited {
    let req = Request::new("api", vec![Descriptor::new([("tenant", value)])]);
    let decision = l.decide(&req).await.expect("decides");
    match decision.descriptors.into_iter().next() {
        Some(Outcome::Limited(limited)) => limited,
        other => panic!("expected a counted descriptor, got {other:?}"),
    }
}

#[tokio::test]
async fn an_override_limits_exactly_its_descriptor_and_the_rule_serves_the_rest() {
    let (l, _) = limiter();
    set(&l, spec("acme", 5, "MINUTE"));
    for _ in 0..5 {
        let acme = hit(&l, "acme").await;
        assert!(acme.admitted);
        assert_eq!(
            acme.limit.requests_per_unit(),
            5,
            "the answer shows the override"
        );
    }
    assert!(!hit(&l, "acme").await.admitted);
    for _ in 0..2 {
        assert!(hit(&l, "other").await.admitted);
    }
    let other = hit(&l, "other").await;
    assert!(!other.admitted);
    assert_eq!(other.limit.requests_per_unit(), 2, "the rule's limit");
}

#[tokio::test]
async fn changing_the_limit_within_one_window_shape_keeps_the_count() {
    let (l, _) = limiter();
    assert!(hit(&l, "acme").await.admitted);
    assert!(hit(&l, "acme").await.admitted);
    assert!(!hit(&l, "acme").await.admitted, "the rule's 2 per minute");
    set(&l, spec("acme", 3, "minute"));
    let raised = hit(&l, "acme").await;
    assert!(raised.admitted, "one more fits under 3");
    assert_eq!(raised.remaining, 0, "the rule's two hits still count");
    assert!(!hit(&l, "acme").await.admitted);
    set(&l, spec("acme", 10, "minute"));
    assert_eq!(
        hit(&l, "acme").await.remaining,
        6,
        "three counted, then this one"
    );
}

#[tokio::test]
async fn removing_an_override_restores_the_rule() {
    let (l, _) = limiter();
    set(&l, spec("acme", 5, "minute"));
    assert_eq!(hit(&l, "acme").await.limit.requests_per_unit(), 5);
    let mut all = Overrides::clone(&l.overrides());
    let removed = all.remove("api", [("tenant", "acme")].into_iter());
    assert!(removed.is_some());
    l.set_overrides(all);
    assert_eq!(hit(&l, "acme").await.limit.requests_per_unit(), 2);
}

#[tokio::test]
async fn an_expired_override_no_longer_applies() {
    let (l, clock) = limiter();
    let mut o = spec("acme", 5, "minute");
    o.expires_at = Some(START_SECONDS + 30);
    set(&l, o);
    assert_eq!(hit(&l, "acme").await.limit.requests_per_unit(), 5);
    clock.advance(Duration::from_secs(30));
    assert_eq!(hit(&l, "acme").await.limit.requests_per_unit(), 2);
}

#[tokio::test]
async fn explain_says_an_override_applied_and_where_it_came_from() {
    let (l, _) = limiter();
    set(&l, spec("acme", 5, "minute"));
    let req = Request::new("api", vec![Descriptor::new([("tenant", "acme")])]);
    let explained = l.explain(&req).await.expect("explains");
    match &explained.descriptors[0].matched {
        Matched::Overridden { rule, by, source } => {
            assert_eq!(rule.path(), ["tenant"]);
            assert_eq!(by.limit.requests_per_unit, 5);
            assert_eq!(source, "test");
        }
        other => panic!("expected an override, got {other:?}"),
    }
}

#[test]
fn bad_overrides_are_refused_naming_the_field() {
    let (l, _) = limiter();
    let refused = |o: Override| l.compile_override(o, "test").expect_err("refused");
    let e = refused(spec("acme", 5, "fortnight"));
    assert_eq!(e.field, "limit.unit");
    assert!(e.message.contains("fortnight"), "{e}");
    let mut no_rule = spec("acme", 5, "minute");
    no_rule.entries[0].key = "region".into();
    let e = refused(no_rule);
    assert_eq!(e.field, "entries");
    assert!(e.message.contains("region=acme"), "{e}");
    let mut no_domain = spec("acme", 5, "minute");
    no_domain.domain = "web".into();
    assert_eq!(refused(no_domain).field, "domain");
    let mut algorithm = spec("acme", 5, "minute");
    algorithm.limit.algorithm = Some("random".into());
    assert_eq!(refused(algorithm).field, "limit.algorithm");
    let mut multiplier = spec("acme", 5, "minute");
    multiplier.limit.unit_multiplier = Some(0);
    assert_eq!(refused(multiplier).field, "limit.unit_multiplier");
    let mut empty = spec("acme", 5, "minute");
    empty.entries.clear();
    assert_eq!(refused(empty).field, "entries");
}

#[test]
fn more_than_the_maximum_is_refused_but_replacing_one_is_not() {
    let (l, _) = limiter();
    let compiled = |value: &str, n| l.compile_override(spec(value, n, "minute"), "test");
    let mut all = Overrides::default();
    all.insert(compiled("a", 1).expect("valid"), 2)
        .expect("room");
    all.insert(compiled("b", 1).expect("valid"), 2)
        .expect("room");
    let e = all
        .insert(compiled("c", 1).expect("valid"), 2)
        .expect_err("full");
    assert_eq!(e.field, "overrides");
    assert!(e.message.contains("at most 2"), "{e}");
    let replaced = all
        .insert(compiled("a", 7).expect("valid"), 2)
        .expect("a replacement adds none");
    assert_eq!(replaced.map(|o| o.spec().limit.requests_per_unit), Some(1));
    assert_eq!(all.len(), 2);
}

#[test]
fn overrides_are_stored_as_json_that_reads_back_the_same() {
    let mut o = spec("a|b=c", 5, "minute");
    o.expires_at = Some(9);
    o.limit.name = Some("gold".into());
    let text = serde_json::to_string(&o).expect("serialises");
    let back: Override = serde_json::from_str(&text).expect("parses");
    assert_eq!(back, o);
    assert_ne!(back.id(), spec("a", 5, "minute").id());
}

const SHARED_RULES: &str = r#"
domain: api
descriptors:
  - key: files
    value: docs/*
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: slots
    in_flight: {max: 2, expire_after: 1m}
"#;

fn shared_limiter() -> Limiter {
    let clock = ManualClock::new(Timestamp::from_nanos(START_SECONDS * NANOS_PER_SECOND));
    let rules = Rules::from_yaml("rules.yaml", SHARED_RULES).expect("rules load");
    let store = Store::Memory(MemoryStore::new(
        crate::Capacity::default(),
        Arc::new(clock),
    ));
    Limiter::with_recorder(rules, store, Options::default(), ())
}

fn of(key: &str, value: &str, requests_per_unit: u32, unit: &str) -> Override {
    let mut o = spec(value, requests_per_unit, unit);
    o.entries[0].key = key.into();
    o
}

async fn admitted(l: &Limiter, key: &str, value: &str) -> bool {
    let req = Request::new("api", vec![Descriptor::new([(key, value)])]);
    let decision = l.decide(&req).await.expect("decides");
    matches!(decision.descriptors.first(), Some(Outcome::Limited(d)) if d.admitted)
}

#[tokio::test]
async fn an_override_of_a_shared_value_counts_on_the_pattern_s_counter() {
    let l = shared_limiter();
    assert!(admitted(&l, "files", "docs/a").await);
    assert!(admitted(&l, "files", "docs/b").await);
    set(&l, of("files", "docs/a", 3, "minute"));
    assert!(admitted(&l, "files", "docs/a").await, "the third of 3");
    assert!(!admitted(&l, "files", "docs/a").await);
    assert!(
        !admitted(&l, "files", "docs/c").await,
        "3 counted of docs/*'s 2"
    );
    let e = l
        .compile_override(of("files", "docs/a", 3, "hour"), "test")
        .expect_err("another window");
    assert_eq!(e.field, "entries");
    assert!(e.message.contains("share_threshold"), "{e}");
}

#[test]
fn an_in_flight_descriptor_cannot_be_overridden() {
    let l = shared_limiter();
    let e = l
        .compile_override(of("slots", "ann", 3, "minute"), "test")
        .expect_err("in flight");
    assert!(e.message.contains("in_flight"), "{e}");
}

#[test]
fn texts_past_their_bounds_are_refused_even_when_restored() {
    let (l, _) = limiter();
    let mut long = spec("acme", 5, "minute");
    long.limit.name = Some("n".repeat(MAX_NAME_BYTES + 1));
    let e = l.restore_override(long, "a store").expect_err("too long");
    assert_eq!(e.field, "limit.name");
    let mut wide = spec("acme", 5, "minute");
    wide.entries = (0..3)
        .map(|i| OverrideEntry {
            key: format!("k{i}"),
            value: "v".repeat(MAX_DESCRIPTOR_BYTES / 3),
        })
        .collect();
    let e = l.restore_override(wide, "a store").expect_err("too wide");
    assert!(e.message.contains("in all"), "{e}");
    let e = l
        .restore_override(spec("a\0b", 5, "minute"), "a store")
        .expect_err("NUL");
    assert_eq!(e.field, "entries[0].value");
}

#[test]
fn pages_follow_the_ids_of_one_domain_and_skip_the_expired() {
    let (l, _) = limiter();
    let mut all = Overrides::default();
    for value in ["d", "a", "c", "b"] {
        let mut o = spec(value, 1, "minute");
        if value == "b" {
            o.expires_at = Some(START_SECONDS);
        }
        let compiled = l.compile_override(o, "test").expect("valid");
        all.insert(compiled, 10).expect("room");
    }
    let now = Timestamp::from_nanos(START_SECONDS * NANOS_PER_SECOND);
    let values = |page: &Page<'_>| -> Vec<String> {
        page.overrides
            .iter()
            .map(|o| o.spec().entries[0].value.clone())
            .collect()
    };
    let first = all.page(Some("api"), None, 2, now);
    assert_eq!(values(&first), ["a", "c"], "b has expired");
    let second = all.page(Some("api"), first.next.as_deref(), 2, now);
    assert_eq!(values(&second), ["d"]);
    assert_eq!(second.next, None);
    assert!(all.page(Some("ap"), None, 10, now).overrides.is_empty());
    assert_eq!(all.len(), 4, "b stays until purged");
    assert_eq!(all.expired(now).len(), 1);
}
