use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as ProtoUnit;
use envoy_types::pb::google::protobuf::UInt64Value;

use super::*;
use crate::limiter::ManualClock;
use crate::store::MemoryStore;

const SECOND: u64 = 1_000_000_000;

const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: api
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 2}
      - {name: per_day, unit: day, requests_per_unit: 3}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: broad
    rate_limit: {name: broad, unit: minute, requests_per_unit: 1}
  - key: narrow
    rate_limit: {name: narrow, unit: minute, requests_per_unit: 5, replaces: [{name: broad}]}
"#;

fn service() -> (Service, ManualClock) {
    service_with(Options::default())
}

fn service_with(options: Options) -> (Service, ManualClock) {
    let clock = ManualClock::new(1_000 * SECOND);
    let metrics = Metrics::new();
    let rules = crate::config::parse_str_into(
        "rules.yaml",
        RULES,
        Defaults::default(),
        &metrics.descriptors,
    )
    .expect("rules load");
    let store = Store::Memory(MemoryStore::new(1_000, Arc::new(clock.clone())));
    let service = Service::new(rules, store, Arc::new(metrics), options);
    (service, clock)
}

fn descriptor(key: &str, value: &str) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![Entry {
            key: key.into(),
            value: value.into(),
        }],
        ..Default::default()
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: "d".into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn status(s: &Service, d: RateLimitDescriptor) -> DescriptorStatus {
    let response = s.decide(&request(vec![d])).await.expect("decides");
    response.statuses.into_iter().next().expect("one status")
}

fn over(status: &DescriptorStatus) -> bool {
    status.code == i32::from(Code::OverLimit)
}

#[tokio::test]
async fn descriptor_hits_zero_checks_without_consuming() {
    let (s, _) = service();
    let mut check = descriptor("user", "ann");
    check.hits_addend = Some(UInt64Value { value: 0 });
    for _ in 0..5 {
        let st = status(&s, check.clone()).await;
        assert!(!over(&st));
        assert_eq!(
            st.limit_remaining, 2,
            "a check reports what one more request would leave"
        );
    }
    for _ in 0..3 {
        assert!(!over(&status(&s, descriptor("user", "ann")).await));
    }
    assert!(
        over(&status(&s, check).await),
        "a check says when the next request would be denied"
    );
}

#[tokio::test]
async fn negative_hits_give_units_back() {
    let (s, _) = service();
    let mut three = descriptor("user", "ann");
    three.hits_addend = Some(UInt64Value { value: 3 });
    assert_eq!(status(&s, three.clone()).await.limit_remaining, 0);
    let mut refund = descriptor("user", "ann");
    refund.hits_addend = Some(UInt64Value { value: 2 });
    refund.is_negative_hits = true;
    let st = status(&s, refund).await;
    assert!(!over(&st));
    assert_eq!(st.limit_remaining, 2);
    assert_eq!(
        status(&s, descriptor("user", "ann")).await.limit_remaining,
        1
    );
}

#[tokio::test]
async fn request_hits_addend_applies_to_descriptors_without_their_own() {
    let (s, _) = service();
    let mut req = request(vec![descriptor("user", "ann")]);
    req.hits_addend = 2;
    let response = s.decide(&req).await.expect("decides");
    assert_eq!(response.statuses[0].limit_remaining, 1);
}

#[tokio::test]
async fn several_limits_report_the_tightest_and_count_all_or_nothing() {
    let (s, clock) = service();
    let first = status(&s, descriptor("api", "k")).await;
    assert_eq!(
        first.current_limit.as_ref().map(|l| l.name.as_str()),
        Some("per_second")
    );
    assert_eq!(first.limit_remaining, 1);
    status(&s, descriptor("api", "k")).await;
    let third = status(&s, descriptor("api", "k")).await;
    assert!(over(&third));
    assert_eq!(
        third.current_limit.as_ref().map(|l| l.name.as_str()),
        Some("per_second")
    );
    clock.advance(2 * SECOND);
    let fourth = status(&s, descriptor("api", "k")).await;
    assert!(
        !over(&fourth),
        "the denied third hit was not counted by the daily limit"
    );
    assert_eq!(
        fourth.current_limit.as_ref().map(|l| l.name.as_str()),
        Some("per_day")
    );
    let fifth = status(&s, descriptor("api", "k")).await;
    assert!(over(&fifth));
    assert_eq!(
        fifth.current_limit.as_ref().map(|l| l.name.as_str()),
        Some("per_day")
    );
}

#[tokio::test]
async fn token_bucket_rules_refill_continuously() {
    let (s, clock) = service();
    assert!(!over(&status(&s, descriptor("bucket", "b")).await));
    assert!(!over(&status(&s, descriptor("bucket", "b")).await));
    let denied = status(&s, descriptor("bucket", "b")).await;
    assert!(over(&denied));
    assert_eq!(
        denied.duration_until_reset.map(|d| (d.seconds, d.nanos)),
        Some((1, 0))
    );
    clock.advance(SECOND);
    assert!(!over(&status(&s, descriptor("bucket", "b")).await));
}

#[tokio::test]
async fn a_limit_override_replaces_the_configured_limit() {
    let (s, _) = service();
    let mut d = descriptor("user", "ann");
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: RateLimitUnit::Hour.into(),
    });
    let st = status(&s, d.clone()).await;
    assert_eq!(
        st.current_limit
            .as_ref()
            .map(|l| (l.requests_per_unit, l.unit)),
        Some((1, ProtoUnit::Hour.into()))
    );
    assert!(over(&status(&s, d.clone()).await));
    // The configured 3/minute counter is a different counter and untouched.
    assert_eq!(
        status(&s, descriptor("user", "ann")).await.limit_remaining,
        2
    );

    d.limit = Some(RateLimitOverride {
        requests_per_unit: 1,
        unit: RateLimitUnit::Unknown.into(),
    });
    let err = s.decide(&request(vec![d])).await.expect_err("unknown unit");
    assert!(matches!(err, DecideError::InvalidArgument(m) if m.contains("unknown unit")));
}

#[tokio::test]
async fn an_override_for_an_unknown_domain_limits_nothing() {
    let (s, _) = service();
    let mut d = descriptor("user", "ann");
    d.limit = Some(RateLimitOverride {
        requests_per_unit: 0,
        unit: RateLimitUnit::Second.into(),
    });
    let mut req = request(vec![d]);
    req.domain = "other".into();
    let response = s.decide(&req).await.expect("decides");
    assert_eq!(response.statuses[0].current_limit, None);
}

#[tokio::test]
async fn shadow_mode_counts_but_never_denies() {
    let (s, _) = service();
    status(&s, descriptor("shadow", "x")).await;
    let second = status(&s, descriptor("shadow", "x")).await;
    assert!(!over(&second));
    assert_eq!(second.limit_remaining, 0);
}

#[tokio::test]
async fn replaced_limits_are_dropped_when_the_replacing_one_matches() {
    let (s, _) = service();
    let both = request(vec![descriptor("broad", "x"), descriptor("narrow", "x")]);
    for _ in 0..3 {
        let response = s.decide(&both).await.expect("decides");
        assert_eq!(response.statuses[0].current_limit, None);
        assert_eq!(response.overall_code, i32::from(Code::Ok));
    }
    // Alone, the broad limit applies (1/minute).
    assert!(!over(&status(&s, descriptor("broad", "x")).await));
    assert!(over(&status(&s, descriptor("broad", "x")).await));
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_while_statuses_tell_the_truth() {
    let (s, _) = service_with(Options {
        global_shadow_mode: true,
        ..Options::default()
    });
    for _ in 0..3 {
        status(&s, descriptor("user", "ann")).await;
    }
    let response = s
        .decide(&request(vec![descriptor("user", "ann")]))
        .await
        .expect("decides");
    assert_eq!(response.overall_code, i32::from(Code::Ok));
    assert!(over(&response.statuses[0]));
}

#[tokio::test]
async fn headers_come_from_the_tightest_status() {
    let (s, _) = service_with(Options {
        headers: headers::HeaderStyle::Reference,
        ..Options::default()
    });
    let response = s
        .decide(&request(vec![
            descriptor("user", "ann"),
            descriptor("api", "k"),
        ]))
        .await
        .expect("decides");
    let got: Vec<_> = response
        .response_headers_to_add
        .iter()
        .map(|h| (h.key.as_str(), h.value.as_str()))
        .collect();
    // api's per-second limit has 1 left of 2, user's has 2 of 3.
    assert_eq!(
        got,
        [
            ("RateLimit-Limit", "2"),
            ("RateLimit-Remaining", "1"),
            ("RateLimit-Reset", "1")
        ]
    );
}

#[tokio::test]
async fn metrics_count_hits_by_outcome() {
    let (s, _) = service();
    for _ in 0..5 {
        status(&s, descriptor("user", "ann")).await;
    }
    let _ = s.decide(&request(vec![])).await;
    let text = s.metrics().encode().expect("encodes");
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains("key1=\"user\""))
            .map(|l| l.rsplit(' ').next().unwrap_or_default().to_owned())
    };
    assert_eq!(
        line("ratelimit_service_rate_limit_total_hits{").as_deref(),
        Some("5")
    );
    assert_eq!(
        line("ratelimit_service_rate_limit_over_limit{").as_deref(),
        Some("2")
    );
    assert_eq!(
        line("ratelimit_service_rate_limit_within_limit{").as_deref(),
        Some("3")
    );
    // Limit 3, near threshold floor(2.4) = 2: the third hit is near the limit.
    assert_eq!(
        line("ratelimit_service_rate_limit_near_limit{").as_deref(),
        Some("1")
    );
    assert!(
        text.contains("ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 6"),
        "{text}"
    );
    assert!(
        text.contains("ratelimit_service_should_rate_limit_error{err_type=\"invalid_argument\"} 1"),
        "{text}"
    );
}
