use super::*;
use std::time::Duration;

use crate::unit::Unit;

fn rules(text: &str) -> Rules {
    match Rules::from_yaml("rules.yaml", text) {
        Ok(rules) => rules,
        Err(e) => panic!("rules should load: {e}"),
    }
}

fn problems(text: &str) -> String {
    match Rules::from_yaml("rules.yaml", text) {
        Ok(_) => panic!("rules should be rejected"),
        Err(e) => e.to_string(),
    }
}

/// The requests per unit of the rule matched by `entries`, or None for no limit.
fn matched(rules: &Rules, entries: &[(&str, &str)]) -> Option<u32> {
    let rule = rules.domain("d")?.find(entries.iter().copied())?;
    match &rule.policy {
        Policy::Limited { limits, .. } => Some(limits[0].requests_per_unit),
        Policy::Unlimited { .. } => Some(u32::MAX),
    }
}

const MATCHING: &str = r#"
domain: d
descriptors:
  - key: path
    value: /api/users
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: path
    value: /api/*
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: path
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: path
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: host
    value: "*.a.*.com"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: user
    descriptors:
      - key: plan
        value: gold
        rate_limit: {unit: minute, requests_per_unit: 6}
  - key: vip
    rate_limit: {unlimited: true}
"#;

#[test]
fn exact_then_first_wildcard_then_default() {
    let r = rules(MATCHING);
    assert_eq!(matched(&r, &[("path", "/api/users")]), Some(1));
    assert_eq!(matched(&r, &[("path", "/api/orders")]), Some(2));
    assert_eq!(matched(&r, &[("path", "/other")]), Some(3));
    assert_eq!(matched(&r, &[("host", "x.a.y.com")]), Some(5));
    assert_eq!(matched(&r, &[("host", "x.b.y.com")]), None);
}

#[test]
fn default_catches_what_no_value_matches() {
    let r = rules(
        "domain: d\ndescriptors:\n  - {key: k, value: a, rate_limit: {unit: second, requests_per_unit: 1}}\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 9}}\n",
    );
    assert_eq!(matched(&r, &[("k", "a")]), Some(1));
    assert_eq!(matched(&r, &[("k", "b")]), Some(9));
}

#[test]
fn a_limit_applies_only_at_the_last_entry() {
    let r = rules(MATCHING);
    assert_eq!(matched(&r, &[("user", "ann"), ("plan", "gold")]), Some(6));
    assert_eq!(matched(&r, &[("user", "ann")]), None);
    assert_eq!(matched(&r, &[("user", "ann"), ("plan", "free")]), None);
    assert_eq!(
        matched(&r, &[("user", "ann"), ("plan", "gold"), ("x", "y")]),
        None
    );
    assert_eq!(matched(&r, &[("nobody", "x")]), None);
    assert!(r.domain("unknown").is_none());
}

#[test]
fn unlimited_and_units() {
    let r = rules(MATCHING);
    assert_eq!(matched(&r, &[("vip", "x")]), Some(u32::MAX));
    for (name, unit) in [
        ("SECOND", Unit::Second),
        ("Month", Unit::Month),
        ("year", Unit::Year),
        ("week", Unit::Week),
    ] {
        let r = rules(&format!(
            "domain: d\ndescriptors:\n  - {{key: k, rate_limit: {{unit: {name}, requests_per_unit: 1}}}}\n"
        ));
        let rule = r.domain("d").and_then(|d| d.find([("k", "v")]));
        match rule.map(|r| &r.policy) {
            Some(Policy::Limited { limits, .. }) => {
                assert_eq!(limits[0].unit, unit);
                assert_eq!(limits[0].window, Duration::from_secs(unit.seconds()));
            }
            other => panic!("expected a limit, got {other:?}"),
        }
    }
}

#[test]
fn unit_multiplier_reports_the_nearest_unit_and_keeps_the_real_window() {
    let r = rules(
        "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, unit_multiplier: 30, requests_per_unit: 5}}\n",
    );
    match r
        .domain("d")
        .and_then(|d| d.find([("k", "v")]))
        .map(|r| &r.policy)
    {
        Some(Policy::Limited { limits, shape }) => {
            assert_eq!(limits[0].unit, Unit::Minute);
            assert_eq!(limits[0].window, Duration::from_secs(30));
            assert_eq!(&**shape, "s30000000000.10");
        }
        other => panic!("expected a limit, got {other:?}"),
    }
}

#[test]
fn missing_requests_per_unit_is_zero_and_numbers_are_values() {
    let r =
        rules("domain: d\ndescriptors:\n  - {key: code, value: 404, rate_limit: {unit: second}}\n");
    assert_eq!(matched(&r, &[("code", "404")]), Some(0));
}

#[test]
fn problems_name_the_file_the_place_and_the_reason() {
    let cases: &[(&str, &str)] = &[
        (
            "domain: ''\n",
            "rules.yaml: domain: config file cannot have empty domain",
        ),
        (
            "domain: d\ndescriptors:\n  - {value: x}\n",
            "rules.yaml: descriptors[0]: descriptor has empty key",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, value: v}\n  - {key: k, value: v}\n",
            "rules.yaml: descriptors[1]: duplicate descriptor key 'k' value 'v' (first at descriptors[0])",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k}\n  - {key: k, value: ''}\n",
            "rules.yaml: descriptors[1]: duplicate descriptor key 'k' with no value",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: fortnight, requests_per_unit: 1}}\n",
            "rules.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unlimited: true, unit: second}}\n",
            "rules.yaml: descriptors[0].rate_limit: should not specify rate limit unit when unlimited",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {name: a, unit: second, replaces: [{name: a}]}}\n",
            "rules.yaml: descriptors[0].rate_limit.replaces: replaces should not contain name of same descriptor",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limits: [{unit: second, replaces: [{name: ''}]}]}\n",
            "rules.yaml: descriptors[0].rate_limits[0].replaces: should not have an empty replaces entry",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, algorithm: magic}}\n",
            "rules.yaml: descriptors[0].rate_limit.algorithm: invalid algorithm 'magic'",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limits: [{unit: second}, {unit: day, unit_multiplier: 0}]}\n",
            "rules.yaml: descriptors[0].rate_limits[1].unit_multiplier: unit_multiplier must be at least 1",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, requests_per_unit: 4294967295, algorithm: token_bucket}}\n",
            "rules.yaml: descriptors[0].rate_limit.requests_per_unit: a token or leaky bucket refills at most 1,000,000 units a second (its time is counted in whole microseconds): 4294967295 per 1 s is faster",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, requests_per_unit: 1, algorithm: leaky_bucket, burst: 4294967295}}\n",
            "rules.yaml: descriptors[0].rate_limit.burst: a token or leaky bucket must fill within 100 years: a burst of 4294967295 at 1 per 3600 s takes longer",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: second, precision: 7}}\n",
            "rules.yaml: descriptors[0].rate_limit.precision: precision 7 does not split the window into whole milliseconds",
        ),
        (
            "domain: d\ndescriptors:\n  - key: a\n    descriptors:\n      - {key: b, rate_limit: {requests_per_unit: 1}}\n",
            "rules.yaml: descriptors[0].descriptors[0].rate_limit: missing rate limit unit",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: month, calendar: true, algorithm: sliding_window}}\n",
            "rules.yaml: descriptors[0].rate_limit.calendar: calendar windows are fixed windows: calendar cannot be combined with sliding_window",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limits: [{unit: minute}, {unit: day, calendar: true, algorithm: token_bucket}]}\n",
            "rules.yaml: descriptors[0].rate_limits[1].calendar: calendar windows are fixed windows: calendar cannot be combined with token_bucket",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: hour, calendar: true}}\n",
            "rules.yaml: descriptors[0].rate_limit.calendar: calendar applies to day, week, month or year, not hour",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, calendar: true, time_zone: Europe/Bonn}}\n",
            "rules.yaml: descriptors[0].rate_limit.time_zone: unknown time zone 'Europe/Bonn' (expected an IANA name such as Europe/Berlin)",
        ),
        (
            "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: day, time_zone: Europe/Berlin}}\n",
            "rules.yaml: descriptors[0].rate_limit.time_zone: time_zone applies only to a calendar window (calendar: true)",
        ),
    ];
    for (text, expected) in cases {
        let got = problems(text);
        assert!(
            got.contains(expected),
            "for {text:?}\n  got:      {got}\n  expected: {expected}"
        );
    }
}

#[test]
fn unknown_keys_are_errors_with_their_place() {
    let got = problems(
        "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requestsperunit: 5\n",
    );
    assert!(
        got.starts_with("rules.yaml: descriptors[0].rate_limit"),
        "{got}"
    );
    assert!(got.contains("requestsperunit"), "{got}");
    assert!(got.contains("line 6"), "{got}");
}

#[test]
fn syntax_errors_name_the_line() {
    let got = problems("domain: d\ndescriptors:\n  - key: [unclosed\n");
    assert!(got.starts_with("rules.yaml: "), "{got}");
    assert!(got.contains("line"), "{got}");
}

#[test]
fn every_problem_is_reported_not_just_the_first() {
    let got = problems(
        "domain: d\ndescriptors:\n  - {value: x}\n  - {key: k, rate_limit: {unit: eon}}\n",
    );
    assert_eq!(got.lines().count(), 2, "{got}");
}

#[test]
fn a_directory_loads_every_yaml_file_and_rejects_duplicate_domains() {
    let dir = tempfile::tempdir().expect("temp dir");
    let write =
        |name: &str, text: &str| std::fs::write(dir.path().join(name), text).expect("write");
    write("a.yaml", "domain: one\n");
    write("b.yml", "domain: two\n");
    write(".hidden.yaml", "domain: ''\n");
    write("notes.txt", "not yaml");
    let loaded = Rules::load(dir.path(), Defaults::default()).expect("loads");
    assert_eq!(
        loaded.domains().map(|(n, _)| n).collect::<Vec<_>>(),
        ["one", "two"]
    );

    write("c.yaml", "domain: one\n");
    let err = Rules::load(dir.path(), Defaults::default())
        .expect_err("duplicate domain")
        .to_string();
    assert!(
        err.contains("c.yaml: domain: duplicate domain 'one' (also in"),
        "{err}"
    );
    assert!(err.contains("a.yaml"), "{err}");
}

#[test]
fn a_missing_path_is_a_clear_error() {
    let err = Rules::load(Path::new("/nonexistent/rules"), Defaults::default())
        .expect_err("missing")
        .to_string();
    assert!(err.starts_with("/nonexistent/rules: cannot read"), "{err}");
}

#[test]
fn unordered_entries_are_placed_in_the_order_rules_nest() {
    let r = rules(
        r#"
domain: d
descriptors:
  - key: path
    value: /health
    rate_limit: {unit: second, requests_per_unit: 9}
  - key: user
    descriptors:
      - key: path
        value: /api/*
        rate_limit: {unit: second, requests_per_unit: 5}
      - key: path
        rate_limit: {unit: second, requests_per_unit: 6}
  - key: tenant
    value: acme
    rate_limit: {unit: second, requests_per_unit: 7}
"#,
    );
    let d = r.domain("d").expect("domain d");
    let find = |entries: &[(&'static str, &'static str)]| {
        d.find_unordered(entries).map(|(order, rule)| {
            let rpu = match &rule.policy {
                Policy::Limited { limits, .. } => limits[0].requests_per_unit,
                Policy::Unlimited { .. } => u32::MAX,
            };
            (order, rpu)
        })
    };
    // `path` sorts before `user`, but only `user` → `path` places both: the walk backtracks.
    assert_eq!(
        find(&[("path", "/api/x"), ("user", "ann")]),
        Some((vec![("user", "ann"), ("path", "/api/x")], 5))
    );
    // Wildcard, then the key-only default, as for ShouldRateLimit.
    assert_eq!(
        find(&[("user", "bob"), ("path", "/other")]).map(|(_, rpu)| rpu),
        Some(6)
    );
    assert_eq!(find(&[("path", "/health")]).map(|(_, rpu)| rpu), Some(9));
    // Every entry must find a level; a level without a limit is no match.
    assert_eq!(find(&[("path", "/health"), ("extra", "x")]), None);
    assert_eq!(find(&[("user", "ann")]), None);
    assert_eq!(find(&[("tenant", "other")]), None);
    // The order found is the descriptor ShouldRateLimit sends for the same rule.
    let (order, _) = d
        .find_unordered(&[("path", "/api/x"), ("user", "ann")])
        .expect("a match");
    assert!(d.find(order).is_some());
}

#[test]
fn an_unknown_unit_is_no_unit_for_an_unlimited_limit_as_in_the_reference() {
    let r = rules(
        "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unlimited: true, unit: UNKNOWN}}\n",
    );
    assert_eq!(matched(&r, &[("k", "v")]), Some(u32::MAX));
    let errors = problems(
        "domain: d\ndescriptors:\n  - {key: k, rate_limit: {unit: unknown, requests_per_unit: 1}}\n",
    );
    assert!(
        errors.contains("descriptors[0].rate_limit.unit: invalid rate limit unit 'unknown'"),
        "{errors}"
    );
}

#[test]
fn share_threshold_counts_every_value_of_a_wildcard_as_its_pattern() {
    let r = rules(
        r#"
domain: d
descriptors:
  - key: files
    value: "docs/*"
    share_threshold: true
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 2}
  - key: files
    value: "img/*"
    rate_limit: {unit: minute, requests_per_unit: 2}
"#,
    );
    let domain = r.domain("d").expect("domain d");
    let shared = domain
        .find([("files", "docs/a.pdf"), ("user", "u")])
        .expect("a rule");
    assert_eq!(shared.key_value(0, "docs/a.pdf"), "docs/*");
    assert_eq!(shared.key_value(1, "u"), "u");
    let own = domain.find([("files", "img/a.png")]).expect("a rule");
    assert_eq!(own.key_value(0, "img/a.png"), "img/a.png");

    let errors = problems(
        "domain: d\ndescriptors:\n  - {key: k, value: exact, share_threshold: true, rate_limit: {unit: second, requests_per_unit: 1}}\n",
    );
    assert!(
        errors.contains(
            "descriptors[0].share_threshold: share_threshold applies only to a wildcard value"
        ),
        "{errors}"
    );
}

fn reference_mode(text: &str) -> Result<Rules, ConfigErrors> {
    let mut builder = RulesBuilder::new(Defaults {
        reference: true,
        ..Defaults::default()
    });
    builder.add_yaml("rules.yaml", text);
    builder.finish()
}

#[test]
fn reference_mode_counts_fixed_windows_and_refuses_what_only_tollgate_has() {
    let rules = reference_mode(
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let rule = rules.domain("d").and_then(|d| d.find([("a", "x")]));
    let Some(Policy::Limited { limits, .. }) = rule.map(|r| &r.policy) else {
        panic!("a limited rule");
    };
    assert_eq!(limits[0].algorithm.kind(), AlgorithmKind::FixedWindow);

    let errors = reference_mode(
        r#"
domain: d
descriptors:
  - key: a
    rate_limit: {unit: minute, requests_per_unit: 5, algorithm: sliding_window}
  - key: b
    rate_limits: [{unit: minute, requests_per_unit: 5}]
  - key: c
    rate_limit: {unit: minute, requests_per_unit: 5, unit_multiplier: 2}
  - key: e
    budget: true
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: f
    rate_limit: {unit: month, requests_per_unit: 5, calendar: true}
"#,
    )
    .err()
    .map(|e| e.to_string())
    .unwrap_or_default();
    for (place, says) in [
        (
            "descriptors[0].rate_limit.algorithm",
            "counts fixed windows",
        ),
        (
            "descriptors[1].rate_limits",
            "one rate_limit per descriptor",
        ),
        (
            "descriptors[2].rate_limit.unit_multiplier",
            "the reference's units only",
        ),
        ("descriptors[3].budget", "counts every hit"),
        (
            "descriptors[4].rate_limit.calendar",
            "calendar windows are Tollgate's",
        ),
    ] {
        assert!(
            errors.contains(&format!("rules.yaml: {place}: REFERENCE_MODE"))
                && errors.contains(says),
            "no '{place}: … {says}' in:\n{errors}"
        );
    }
}

#[test]
fn calendar_limits_are_fixed_windows_in_their_zone_and_the_settings_can_make_them_so() {
    let text = "domain: d\ndescriptors:\n  - key: tenant\n    rate_limits:\n      - {unit: minute, requests_per_unit: 100}\n      - {unit: month, requests_per_unit: 1000000, calendar: true, time_zone: europe/berlin}\n  - key: plain\n    rate_limit: {unit: day, requests_per_unit: 5, algorithm: fixed_window}\n  - key: refused\n    rate_limit: {unit: day, requests_per_unit: 5, algorithm: fixed_window, calendar: false}\n";
    let zone = |rules: &Rules, key: &str, at: usize| {
        let rule = rules.domain("d")?.find([(key, "x")])?;
        let Policy::Limited { limits, .. } = &rule.policy else {
            return None;
        };
        let limit = limits.get(at)?;
        let calendar = limit.calendar()?;
        assert_eq!(limit.algorithm(), Algorithm::FixedWindow);
        Some(calendar.zone_name().to_owned())
    };
    let plain = rules(text);
    assert_eq!(zone(&plain, "tenant", 0), None);
    assert_eq!(zone(&plain, "tenant", 1).as_deref(), Some("Europe/Berlin"));
    assert_eq!(zone(&plain, "plain", 0), None);
    let defaults = Defaults {
        calendar_zone: Some("Asia/Tokyo".into()),
        ..Defaults::default()
    };
    let mut builder = RulesBuilder::new(defaults);
    builder.add_yaml("rules.yaml", text);
    let zoned = builder.finish().expect("rules load");
    assert_eq!(zone(&zoned, "tenant", 1).as_deref(), Some("Europe/Berlin"));
    assert_eq!(zone(&zoned, "plain", 0).as_deref(), Some("Asia/Tokyo"));
    assert_eq!(zone(&zoned, "refused", 0), None);
}

#[test]
fn a_parse_error_does_not_hide_the_problems_around_it() {
    let errors = problems(
        "domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    ratelimit:
      unit: second
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1, bogus: 2}
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
",
    );
    let lines: Vec<&str> = errors.lines().collect();
    assert_eq!(lines.len(), 4, "{errors}");
    assert!(
        lines[0].starts_with("rules.yaml: descriptors[1].ratelimit: unknown field `ratelimit`")
            && lines[0].ends_with("(line 6 column 5)"),
        "{errors}"
    );
    assert!(
        lines[1].starts_with("rules.yaml: descriptors[2].rate_limit.bogus: unknown field"),
        "{errors}"
    );
    assert_eq!(
        lines[2],
        "rules.yaml: descriptors[0].rate_limit.unit: invalid rate limit unit 'fortnight'"
    );
    assert!(
        lines[3].starts_with("rules.yaml: descriptors[3]: duplicate descriptor key 'a'"),
        "{errors}"
    );
}

#[test]
fn a_blanked_entry_is_not_reported_again_as_missing() {
    let errors = problems("domain: [d]\ndescriptors:\n  - key: a\n    value: [x\n");
    let lines: Vec<&str> = errors.lines().collect();
    assert!(lines[0].starts_with("rules.yaml: domain: "), "{errors}");
    assert!(
        lines.iter().all(|l| !l.contains("empty domain")),
        "{errors}"
    );
}
