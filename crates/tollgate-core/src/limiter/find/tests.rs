use std::sync::Arc;
use std::time::Duration;

use crate::clock::{ManualClock, Timestamp};
use crate::limit::{Algorithm, Limit};
use crate::request::{Descriptor, Request};
use crate::rules::Rules;
use crate::store::{Capacity, MemoryStore, Reading, Store, StoreError};
use crate::unit::Unit;

use super::*;
use crate::counter::Counter;

const S: u64 = crate::clock::NANOS_PER_SECOND;
const RULES: &str = r#"
domain: d
descriptors:
  - key: client
    descriptors:
      - key: route
        rate_limit: {unit: hour, requests_per_unit: 3, algorithm: fixed_window}
  - key: open
    rate_limit: {unlimited: true}
"#;

fn limiter(clock: &ManualClock) -> Limiter {
    let rules = Rules::from_yaml("r.yaml", RULES).expect("rules");
    let store = MemoryStore::new(Capacity::default(), Arc::new(clock.clone()));
    Limiter::new(rules, Store::Memory(store))
}

fn limited(found: Found) -> Counter {
    match found {
        Found::Limited { counter, .. } => counter,
        other => panic!("a limited rule was expected, got {other:?}"),
    }
}

#[tokio::test]
async fn a_bucket_in_any_order_finds_the_counter_should_rate_limit_counts_on() {
    let clock = ManualClock::new(Timestamp::from_nanos(600 * S));
    let limiter = limiter(&clock);
    let descriptor = Descriptor::new([("client", "c1"), ("route", "/r")]);
    let by_descriptor = limited(limiter.find_descriptor("d", &descriptor));
    let by_bucket = limited(limiter.find_bucket("d", &[("route", "/r"), ("client", "c1")]));
    assert_eq!(by_bucket, by_descriptor);
    let store = limiter.store();
    by_bucket.charge(store, 2).await.expect("memory store");
    let request = Request::new("d", vec![descriptor]);
    assert!(!limiter.decide(&request).await.expect("decided").over_limit);
    assert!(limiter.decide(&request).await.expect("decided").over_limit);
    let read = by_bucket.read(store).await.expect("memory store");
    assert_eq!((read.admitted, read.remaining), (true, 0));
}

#[test]
fn unlimited_and_unmatched_entries_have_no_counter() {
    let clock = ManualClock::new(Timestamp::from_nanos(600 * S));
    let limiter = limiter(&clock);
    assert!(matches!(
        limiter.find_bucket("d", &[("open", "x")]),
        Found::Unlimited(_)
    ));
    assert!(matches!(
        limiter.find_bucket("d", &[("nope", "x")]),
        Found::NoRule
    ));
    assert!(matches!(
        limiter.find_bucket("other", &[("open", "x")]),
        Found::NoRule
    ));
    let half = Descriptor::new([("route", "/r")]);
    assert!(matches!(limiter.find_descriptor("d", &half), Found::NoRule));
}

#[tokio::test]
async fn every_operation_counts_as_it_says() {
    let clock = ManualClock::new(Timestamp::from_nanos(600 * S));
    let store = Store::Memory(MemoryStore::new(
        Capacity::default(),
        Arc::new(clock.clone()),
    ));
    let limit = Limit::new(10, Unit::Minute)
        .with_algorithm(Algorithm::FixedWindow)
        .expect("a valid limit");
    let counter = Counter::for_limits("d", [("k", "v")], &[limit]);
    let remaining = async |reading: Result<Reading, StoreError>| {
        let reading = reading.expect("memory store");
        (reading.admitted, reading.remaining)
    };
    assert_eq!(remaining(counter.read(&store).await).await, (true, 10));
    assert_eq!(remaining(counter.consume(&store, 4).await).await, (true, 6));
    assert_eq!(
        remaining(counter.consume(&store, 7).await).await,
        (false, 6)
    );
    assert_eq!(
        counter.reserve(&store, 8).await.expect("memory"),
        6,
        "what was left"
    );
    assert_eq!(counter.reserve(&store, 1).await.expect("memory"), 0);
    assert_eq!(remaining(counter.refund(&store, 3).await).await, (true, 3));
    // A charge counts past the limit, and says it did not fit.
    assert_eq!(remaining(counter.charge(&store, 5).await).await, (false, 3));
    assert_eq!(remaining(counter.read(&store).await).await, (false, 0));
    let reading = counter.read(&store).await.expect("memory store");
    assert_eq!(reading.limit_index, 0);
    assert_eq!(reading.reset, Duration::from_secs(60));
    clock.advance(Duration::from_nanos(60 * S));
    assert_eq!(remaining(counter.read(&store).await).await, (true, 10));
}

#[tokio::test]
async fn a_companion_is_a_counter_of_its_own() {
    let clock = ManualClock::new(Timestamp::from_nanos(600 * S));
    let limiter = limiter(&clock);
    let counter = limited(limiter.find_bucket("d", &[("client", "c1"), ("route", "/r")]));
    let wide = Limit::new(100, Unit::Minute);
    let demand = counter.companion("demand", std::slice::from_ref(&wide));
    assert_ne!(demand.key(), counter.key());
    assert!(demand.key().ends_with(counter.key()));
    assert_eq!(demand.limits(), [wide]);
    demand
        .charge(limiter.store(), 50)
        .await
        .expect("memory store");
    let read = counter.read(limiter.store()).await.expect("memory store");
    assert_eq!(read.remaining, 3, "the rule's counter is untouched");
}
