//! How request descriptors are matched against rules, and which counter each
//! match uses.

use std::sync::atomic::{AtomicU64, Ordering};

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, TestRunner};
use tollgate_testkit::grpc::{
    Code, RateLimit, Unit, assert_limited, assert_unlimited, code, limit, overall, request,
};

use crate::in_process::InProcess;

const RULES: &str = r#"
domain: match
descriptors:
  - key: path
    value: /api/special
    rate_limit: {unit: minute, requests_per_unit: 100, name: exact}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 50, name: api_prefix}
  - key: path
    value: "*/special"
    rate_limit: {unit: minute, requests_per_unit: 40, name: special_suffix}
  - key: path
    value: "a*b*c"
    rate_limit: {unit: minute, requests_per_unit: 30, name: a_b_c}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 10, name: path_default}

  - key: k1
    value: v1
    rate_limit: {unit: hour, requests_per_unit: 7, name: parent}
    descriptors:
      - key: k2
        rate_limit: {unit: hour, requests_per_unit: 3, name: child}
  - key: only_nested
    value: v1
    descriptors:
      - key: k2
        value: v2
        rate_limit: {unit: day, requests_per_unit: 2, name: leaf}

  - key: free
    rate_limit: {unlimited: true}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 2, name: shadowed}
"#;

/// Kept apart from `RULES` so a problem with `replaces` cannot hide the rest.
const REPLACES_RULES: &str = r#"
domain: match
descriptors:
  - key: foo
    rate_limit: {unit: minute, requests_per_unit: 1, name: foo_limit}
  - key: bar
    rate_limit:
      unit: minute
      requests_per_unit: 10
      name: bar_limit
      replaces:
        - name: foo_limit
"#;

/// Counter-isolation rules: key-only defaults, limit 1 per minute, so any
/// shared counter shows up as an OVER_LIMIT on the second request.
const SEPARATORS: [&str; 9] = ["_", "|", "=", "%", "{", "}", ":", ".", "/"];

fn isolation_rules() -> String {
    let mut yaml = String::from(
        "domain: iso\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    yaml.push_str(
        "  - key: x\n    descriptors:\n      - key: y\n        rate_limit: {unit: minute, requests_per_unit: 1}\n",
    );
    for sep in SEPARATORS {
        yaml.push_str(&format!(
            "  - key: 'a{sep}b'\n    rate_limit: {{unit: minute, requests_per_unit: 1}}\n"
        ));
    }
    yaml
}

fn minute(rpu: u32, name: &str) -> RateLimit {
    limit(rpu, Unit::Minute, name)
}

#[tokio::test]
async fn exact_value_beats_wildcard_beats_key_only_default() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let cases = [
        ("/api/special", minute(100, "exact")),
        ("/api/other", minute(50, "api_prefix")),
        ("/api/", minute(50, "api_prefix")),
        ("/x/special", minute(40, "special_suffix")),
        ("/elsewhere", minute(10, "path_default")),
    ];
    for (path, expected) in cases {
        let status = rls.check("match", &[("path", path)]).await;
        let remaining = expected.requests_per_unit - 1;
        assert_limited(&status, Code::Ok, &expected, remaining);
    }
}

#[tokio::test]
async fn first_matching_wildcard_in_file_order_wins() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    // Matches both `/api/*` and `*/special`; `/api/*` comes first.
    let status = rls.check("match", &[("path", "/api/v2/special")]).await;
    assert_limited(&status, Code::Ok, &minute(50, "api_prefix"), 49);
}

#[tokio::test]
async fn several_wildcards_in_one_value() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    for path in ["abc", "a-b-c", "axxbyyc", "abbbc", "a*b*c"] {
        let status = rls.check("match", &[("path", path)]).await;
        assert_eq!(
            status.current_limit,
            Some(minute(30, "a_b_c")),
            "{path} should match a*b*c"
        );
    }
    for path in ["acb", "ab", "bc", "xabc", "abcx", "a_b_c_d"] {
        let status = rls.check("match", &[("path", path)]).await;
        assert_eq!(
            status.current_limit,
            Some(minute(10, "path_default")),
            "{path} should not match a*b*c"
        );
    }
}

#[tokio::test]
async fn wildcard_matches_use_one_counter_per_actual_value() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let api = minute(50, "api_prefix");
    assert_limited(
        &rls.check("match", &[("path", "/api/a")]).await,
        Code::Ok,
        &api,
        49,
    );
    assert_limited(
        &rls.check("match", &[("path", "/api/a")]).await,
        Code::Ok,
        &api,
        48,
    );
    assert_limited(
        &rls.check("match", &[("path", "/api/b")]).await,
        Code::Ok,
        &api,
        49,
    );
}

#[tokio::test]
async fn nested_descriptors_apply_the_limit_of_the_last_entry() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let parent = limit(7, Unit::Hour, "parent");
    let child = limit(3, Unit::Hour, "child");

    let status = rls.check("match", &[("k1", "v1")]).await;
    assert_limited(&status, Code::Ok, &parent, 6);
    let status = rls
        .check("match", &[("k1", "v1"), ("k2", "anything")])
        .await;
    assert_limited(&status, Code::Ok, &child, 2);
    // The parent's counter was not touched by the nested request.
    let status = rls.check("match", &[("k1", "v1")]).await;
    assert_limited(&status, Code::Ok, &parent, 5);

    // No rule for a third level, nor for k1=other.
    assert_unlimited(
        &rls.check("match", &[("k1", "v1"), ("k2", "a"), ("k3", "b")])
            .await,
    );
    assert_unlimited(&rls.check("match", &[("k1", "other"), ("k2", "a")]).await);
    // Order of entries matters.
    assert_unlimited(&rls.check("match", &[("k2", "a"), ("k1", "v1")]).await);
}

#[tokio::test]
async fn an_intermediate_entry_without_its_own_limit_gets_none() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    assert_unlimited(&rls.check("match", &[("only_nested", "v1")]).await);
    let status = rls
        .check("match", &[("only_nested", "v1"), ("k2", "v2")])
        .await;
    assert_limited(&status, Code::Ok, &limit(2, Unit::Day, "leaf"), 1);
    assert_unlimited(
        &rls.check("match", &[("only_nested", "v1"), ("k2", "v3")])
            .await,
    );
}

#[tokio::test]
async fn unlimited_rule_is_ok_with_max_remaining_and_no_limit() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    for _ in 0..5 {
        let status = rls.check("match", &[("free", "x")]).await;
        assert_eq!(code(&status), Code::Ok, "{status:?}");
        assert_eq!(status.current_limit, None, "{status:?}");
        assert_eq!(status.limit_remaining, u32::MAX, "{status:?}");
    }
}

#[tokio::test]
async fn shadow_mode_counts_but_never_reports_over_limit() {
    let server = InProcess::rules(RULES).start();
    let mut rls = server.client().await;
    let shadowed = minute(2, "shadowed");
    for remaining in [1, 0, 0, 0] {
        let status = rls.check("match", &[("shadow", "s")]).await;
        assert_limited(&status, Code::Ok, &shadowed, remaining);
    }
}

#[tokio::test]
async fn replaces_drops_the_named_limit_matched_in_the_same_request() {
    let server = InProcess::rules(REPLACES_RULES).start();
    let mut rls = server.client().await;
    let bar = minute(10, "bar_limit");
    for remaining in [9, 8] {
        let resp = rls
            .ok(request("match", &[&[("foo", "f")], &[("bar", "b")]]))
            .await;
        assert_eq!(overall(&resp), Code::Ok, "{resp:?}");
        assert_unlimited(&resp.statuses[0]);
        assert_limited(&resp.statuses[1], Code::Ok, &bar, remaining);
    }
    // Without `bar` in the request, foo's own limit applies, and the replaced
    // requests above did not consume it.
    let foo = minute(1, "foo_limit");
    assert_limited(
        &rls.check("match", &[("foo", "f")]).await,
        Code::Ok,
        &foo,
        0,
    );
    assert_limited(
        &rls.check("match", &[("foo", "f")]).await,
        Code::OverLimit,
        &foo,
        0,
    );
}

#[tokio::test]
async fn counter_keys_do_not_collide_across_key_value_boundaries() {
    let server = InProcess::rules(&isolation_rules()).start();
    let mut rls = server.client().await;
    for sep in SEPARATORS {
        let joined_value = format!("b{sep}c");
        let joined_key = format!("a{sep}b");
        assert_eq!(
            code(&rls.check("iso", &[("a", &joined_value)]).await),
            Code::Ok
        );
        assert_eq!(
            code(&rls.check("iso", &[(&joined_key, "c")]).await),
            Code::Ok,
            "a={joined_value} and {joined_key}=c share a counter"
        );

        // Two-entry descriptors whose naive concatenation is identical.
        let first = format!("1{sep}y{sep}2");
        let second = format!("2{sep}y{sep}3");
        let status = rls.check("iso", &[("x", &first), ("y", "3")]).await;
        assert_eq!(code(&status), Code::Ok, "{status:?}");
        let status = rls.check("iso", &[("x", "1"), ("y", &second)]).await;
        assert_eq!(
            code(&status),
            Code::Ok,
            "[x={first}, y=3] and [x=1, y={second}] share a counter"
        );
    }
}

#[tokio::test]
async fn tricky_values_each_get_their_own_counter() {
    let server = InProcess::rules(&isolation_rules()).start();
    let mut rls = server.client().await;
    let long = "v".repeat(4095);
    let values = [
        "b|c".to_owned(),
        "b%7Cc".to_owned(),
        "b%7cc".to_owned(),
        "b\\|c".to_owned(),
        "b_c".to_owned(),
        "b__c".to_owned(),
        "b=c".to_owned(),
        "b%3Dc".to_owned(),
        "{b}".to_owned(),
        "%7Bb%7D".to_owned(),
        "b:c".to_owned(),
        "b::c".to_owned(),
        "é".to_owned(),
        "e\u{301}".to_owned(),
        "%C3%A9".to_owned(),
        "日本".to_owned(),
        "%".to_owned(),
        "%%".to_owned(),
        format!("{long}1"),
        format!("{long}2"),
    ];
    for value in &values {
        let status = rls.check("iso", &[("a", value)]).await;
        assert_eq!(
            code(&status),
            Code::Ok,
            "value {value:?} shares a counter with an earlier one"
        );
    }
    // Each counter was really consumed.
    for value in &values {
        let status = rls.check("iso", &[("a", value)]).await;
        assert_eq!(code(&status), Code::OverLimit, "value {value:?}");
    }
}

#[test]
fn distinct_two_entry_descriptors_never_share_a_counter() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let server = InProcess::rules(&isolation_rules()).start();
    let client = runtime.block_on(server.client());
    // A fresh tag per run keeps reruns during shrinking on fresh counters.
    let run = AtomicU64::new(0);
    let value = "[a-c_|=%{}:.]{1,5}";

    let mut runner = TestRunner::new(ProptestConfig {
        cases: 64,
        failure_persistence: None,
        ..ProptestConfig::default()
    });
    let strategy = ((value, value), (value, value)).prop_filter("distinct", |(a, b)| a != b);
    runner
        .run(&strategy, |((x1, y1), (x2, y2))| {
            let tag = run.fetch_add(1, Ordering::Relaxed);
            let (x1, x2) = (format!("{tag}{x1}"), format!("{tag}{x2}"));
            let mut rls = client.clone();
            let (first, second) = runtime.block_on(async {
                let first = rls.check("iso", &[("x", &x1), ("y", &y1)]).await;
                let second = rls.check("iso", &[("x", &x2), ("y", &y2)]).await;
                (first, second)
            });
            prop_assert_eq!(code(&first), Code::Ok);
            prop_assert_eq!(
                code(&second),
                Code::Ok,
                "[x={}, y={}] and [x={}, y={}] share a counter",
                x1,
                y1,
                x2,
                y2
            );
            Ok(())
        })
        .expect("no two distinct descriptors share a counter");
}
