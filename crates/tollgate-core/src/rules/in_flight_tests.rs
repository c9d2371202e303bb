//! The `in_flight` rule: what it compiles to, and every way of writing it wrong.

use std::time::Duration;

use super::*;
use crate::limit::Algorithm;

fn problems(text: &str, defaults: Defaults) -> String {
    let mut builder = RulesBuilder::new(defaults);
    builder.add_yaml("rules.yaml", text);
    match builder.finish() {
        Ok(_) => panic!("rules should be rejected"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn an_in_flight_rule_is_one_limit_of_slots_freeing_themselves_after_expire_after() {
    let text = "domain: d\ndescriptors:\n  - key: user\n    in_flight: {max: 2, expire_after: 90s, name: concurrent}\n";
    let rules = Rules::from_yaml("rules.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    let rule = rules.domain("d").and_then(|d| d.find([("user", "ann")]));
    let Some(Policy::Limited { limits, shape }) = rule.map(|r| &r.policy) else {
        panic!("a limited rule");
    };
    let [limit] = &limits[..] else {
        panic!("one limit: {limits:?}");
    };
    assert_eq!(limit.algorithm(), Algorithm::Slots);
    assert_eq!(limit.requests_per_unit(), 2);
    assert_eq!(limit.window(), Duration::from_secs(90));
    assert_eq!(limit.unit(), Unit::Minute, "Envoy is told the nearest unit");
    assert_eq!(limit.name(), Some("concurrent"));
    assert_eq!(&**shape, "i90000000000", "no rate limit shares its counter");
    assert!(!rule.is_some_and(Rule::charged));
}

#[test]
fn in_flight_refuses_what_it_cannot_mean() {
    let errors = problems(
        r#"
domain: d
descriptors:
  - key: a
    in_flight: {expire_after: 60s}
  - key: b
    in_flight: {max: 2}
  - key: c
    in_flight: {max: 2, expire_after: soon}
  - key: e
    in_flight: {max: 2, expire_after: 0s}
  - key: f
    in_flight: {max: 2, expire_after: 60s}
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: g
    budget: true
    in_flight: {max: 2, expire_after: 60s}
  - key: h
    in_flight: {max: 2, expire_after: 60s, burst: 3}
"#,
        Defaults::default(),
    );
    for (place, says) in [
        ("descriptors[0].in_flight", "needs max"),
        ("descriptors[1].in_flight", "needs expire_after"),
        (
            "descriptors[2].in_flight.expire_after",
            "'soon' is not a duration",
        ),
        (
            "descriptors[3].in_flight.expire_after",
            "between 1ms and 365 days",
        ),
        ("descriptors[4]", "cannot go with rate_limit"),
        ("descriptors[5]", "cannot go with budget"),
        ("descriptors[6].in_flight.burst", "unknown field `burst`"),
    ] {
        assert!(
            errors.contains(&format!("rules.yaml: {place}: ")) && errors.contains(says),
            "no '{place}: … {says}' in:\n{errors}"
        );
    }
}

#[test]
fn reference_mode_refuses_in_flight() {
    let text =
        "domain: d\ndescriptors:\n  - key: user\n    in_flight: {max: 2, expire_after: 60s}\n";
    let defaults = Defaults {
        reference: true,
        ..Defaults::default()
    };
    let errors = problems(text, defaults);
    assert!(
        errors.contains("rules.yaml: descriptors[0].in_flight: REFERENCE_MODE")
            && errors.contains("`in_flight` is Tollgate's"),
        "{errors}"
    );
}
