//! Calendar windows through the whole decision, on an injected clock: budgets charged past
//! a calendar month, a minute limit beside it, and resets that end exactly at local
//! midnight.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use super::*;
use crate::clock::ManualClock;
use crate::store::MemoryStore;

const RULES: &str = r#"
domain: c
descriptors:
  - key: tenant
    quota_mode: true
    rate_limit: {unit: month, requests_per_unit: 1000, calendar: true, time_zone: Europe/Berlin}
  - key: mixed
    rate_limits:
      - {unit: minute, requests_per_unit: 3, algorithm: fixed_window}
      - {unit: month, requests_per_unit: 5, calendar: true, time_zone: Asia/Tokyo}
  - key: day
    rate_limit: {unit: day, requests_per_unit: 1, calendar: true, time_zone: America/New_York}
  - key: quarter
    rate_limit: {unit: month, unit_multiplier: 3, requests_per_unit: 1, calendar: true}
"#;

const HOUR: u64 = 3_600;

/// A limiter whose clock stands at the RFC 3339 instant `start`.
fn limiter_at(start: &str) -> (Limiter, ManualClock) {
    let t: Timestamp = start.parse().expect("a valid instant");
    let clock = ManualClock::new(crate::Timestamp::from_nanos(
        u64::try_from(t.as_nanosecond()).expect("after 1970"),
    ));
    let rules = Rules::from_yaml("calendar.yaml", RULES).expect("rules load");
    let store = Store::Memory(MemoryStore::new(
        crate::Capacity::default(),
        Arc::new(clock.clone()),
    ));
    (
        Limiter::with_recorder(rules, store, Options::default(), ()),
        clock,
    )
}

async fn limited(l: &Limiter, key: &str, hits: Hits) -> Limited {
    super::tests::limited_on(l, "c", (key, "acme"), hits).await
}

#[tokio::test]
async fn a_monthly_budget_renews_at_midnight_on_the_first_in_its_zone() {
    // 23:00 on 31 March in Berlin (summer time): the month ends in one hour.
    let (l, clock) = limiter_at("2026-03-31T21:00:00Z");
    let charged = limited(&l, "tenant", Hits::Charge(1_200)).await;
    assert!(!charged.admitted, "1,200 of 1,000 does not fit");
    assert_eq!(charged.hits, 1_200, "a budget's charge is recorded anyway");
    let over = limited(&l, "tenant", Hits::Check).await;
    assert!(!over.admitted);
    assert_eq!(over.reset, Duration::from_secs(HOUR));
    clock.advance(Duration::from_secs(HOUR) - Duration::from_nanos(1));
    assert!(!limited(&l, "tenant", Hits::Check).await.admitted);
    clock.advance(Duration::from_nanos(1));
    let april = limited(&l, "tenant", Hits::Consume(1)).await;
    assert!(
        april.admitted,
        "a new month at 00:00 on 1 April, Berlin time"
    );
    assert_eq!(april.remaining, 999);
    // April in Berlin: 30 days, no daylight-saving change.
    assert_eq!(april.reset, Duration::from_secs(30 * 24 * HOUR));
}

#[tokio::test]
async fn a_minute_limit_and_a_calendar_month_count_together() {
    // 08:00 on 28 February in Tokyo; the local month ends at 15:00 UTC.
    let (l, clock) = limiter_at("2026-02-27T23:00:00Z");
    for left in [2, 1, 0] {
        let ok = limited(&l, "mixed", Hits::Consume(1)).await;
        assert!(ok.admitted);
        assert_eq!(ok.remaining, left, "the minute is the tighter");
    }
    let minute = limited(&l, "mixed", Hits::Consume(1)).await;
    assert!(!minute.admitted);
    assert_eq!(minute.reset, Duration::from_secs(60));
    clock.advance(Duration::from_secs(60));
    for _ in 0..2 {
        assert!(limited(&l, "mixed", Hits::Consume(1)).await.admitted);
    }
    let month = limited(&l, "mixed", Hits::Consume(1)).await;
    assert!(!month.admitted, "5 a month");
    assert_eq!(month.reset, Duration::from_secs(16 * HOUR - 60));
}

#[tokio::test]
async fn a_local_day_lasts_25_hours_when_the_clocks_go_back() {
    // Midnight in New York on 1 November 2026, daylight time: the day has 25 hours.
    let (l, clock) = limiter_at("2026-11-01T04:00:00Z");
    let first = limited(&l, "day", Hits::Consume(1)).await;
    assert!(first.admitted);
    assert_eq!(first.reset, Duration::from_secs(25 * HOUR));
    clock.advance(Duration::from_secs(24 * HOUR));
    let denied = limited(&l, "day", Hits::Consume(1)).await;
    assert!(!denied.admitted, "24 hours later it is still 1 November");
    assert_eq!(denied.reset, Duration::from_secs(HOUR));
    clock.advance(Duration::from_secs(HOUR));
    assert!(limited(&l, "day", Hits::Consume(1)).await.admitted);
}

#[tokio::test]
async fn a_quarter_resets_on_the_first_of_april() {
    let (l, _) = limiter_at("2026-02-01T00:00:00Z");
    assert!(limited(&l, "quarter", Hits::Consume(1)).await.admitted);
    let denied = limited(&l, "quarter", Hits::Consume(1)).await;
    assert!(!denied.admitted);
    // February and March 2026: 28 + 31 days.
    assert_eq!(denied.reset, Duration::from_secs(59 * 24 * HOUR));
}
