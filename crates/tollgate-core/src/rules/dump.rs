//! A readable dump of the loaded rules, one line per limit, like the reference's
//! `/rlconfig`:
//!
//! ```text
//! example.api_key_gold-key: unit=MINUTE requests_per_unit=600, name=gold, shadow_mode=false
//! ```
//!
//! A line starts with the domain and the descriptor path, each level written `key_value`,
//! `key_pattern*` for a wildcard value, or a bare `key` for a key-only default. Domains come
//! in name order; at each level keys in name order, and within a key the order matching
//! tries them: exact values (by value), wildcards (in file order), then the default. A
//! rule's limits keep their file order.

use std::fmt::Write as _;

use super::tree::{Level, Node, Policy, Rule, Rules};
use crate::limit::{Algorithm, Limit};

impl Rules {
    /// Every rule of every domain, one line per limit, each ending in a newline.
    pub fn dump(&self) -> String {
        let mut out = String::new();
        for (name, domain) in self.domains() {
            dump_level(&mut out, name, &domain.root);
        }
        out
    }
}

fn dump_level(out: &mut String, parent: &str, level: &Level) {
    let mut keys: Vec<_> = level.keys.iter().collect();
    keys.sort_by_key(|(key, _)| key.as_str());
    for (key, nodes) in keys {
        let mut exact: Vec<_> = nodes.exact.iter().collect();
        exact.sort_by_key(|(value, _)| value.as_str());
        for (value, node) in exact {
            dump_node(out, &format!("{parent}.{key}_{value}"), node);
        }
        for (pattern, node) in &nodes.wildcards {
            dump_node(out, &format!("{parent}.{key}_{pattern}"), node);
        }
        if let Some(node) = &nodes.default {
            dump_node(out, &format!("{parent}.{key}"), node);
        }
    }
}

fn dump_node(out: &mut String, path: &str, node: &Node) {
    if let Some(rule) = &node.rule {
        dump_rule(out, path, rule);
    }
    dump_level(out, path, &node.children);
}

fn dump_rule(out: &mut String, path: &str, rule: &Rule) {
    match &rule.policy {
        Policy::Unlimited { name } => {
            out.push_str(path);
            out.push_str(": unlimited");
            write_name(out, name.as_deref());
            write_flags(out, rule);
        }
        Policy::Limited { limits, .. } => {
            for limit in limits.iter() {
                out.push_str(path);
                out.push_str(": ");
                write_limit(out, limit);
                write_name(out, limit.name.as_deref());
                write_flags(out, rule);
            }
        }
    }
}

// Writing to a String cannot fail, so the results of `write!` below are ignored.

fn write_limit(out: &mut String, limit: &Limit) {
    if limit.algorithm == Algorithm::Slots {
        let _ = write!(
            out,
            "in_flight max={} expire_after={}ms",
            limit.requests_per_unit,
            limit.window.as_millis()
        );
        return;
    }
    let _ = write!(
        out,
        "unit={} requests_per_unit={}",
        limit.unit.as_str().to_ascii_uppercase(),
        limit.requests_per_unit
    );
    // A unit_multiplier makes the real window differ from the unit Envoy is told.
    if let Some(calendar) = &limit.calendar {
        out.push_str(" calendar=");
        calendar.write_shape(out);
    } else if limit.window.as_secs() != limit.unit.seconds() {
        let _ = write!(out, " window={}s", limit.window.as_secs());
    }
    if !matches!(limit.algorithm, Algorithm::SlidingWindow { .. }) {
        let _ = write!(out, " algorithm={}", limit.algorithm.kind().as_str());
    }
    if let Some(burst) = limit.algorithm.burst()
        && burst != limit.requests_per_unit
    {
        let _ = write!(out, " burst={burst}");
    }
}

fn write_name(out: &mut String, name: Option<&str>) {
    if let Some(name) = name {
        let _ = write!(out, ", name={name}");
    }
}

fn write_flags(out: &mut String, rule: &Rule) {
    let _ = write!(out, ", shadow_mode={}", rule.shadow_mode);
    if rule.detailed_metric {
        out.push_str(", detailed_metric=true");
    }
    if rule.quota_mode {
        out.push_str(", quota_mode=true");
        if let Some(group) = &rule.quota_group {
            let _ = write!(out, ", quota_group={group}");
        }
    } else if rule.charged {
        out.push_str(", budget=true");
    }
    if !rule.replaces.is_empty() {
        let _ = write!(out, ", replaces=[{}]", rule.replaces.join(","));
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use crate::rules::Rules;

    fn dump(yaml: &str) -> String {
        Rules::from_yaml("rules.yaml", yaml)
            .expect("valid rules")
            .dump()
    }

    #[test]
    fn one_line_per_limit_in_matching_order() {
        let text = dump(
            r#"
domain: example
descriptors:
  - key: path
    value: "/api/*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: api_key
    rate_limit: {unit: minute, requests_per_unit: 60}
  - key: api_key
    value: gold-key
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 600, name: gold}
    descriptors:
      - key: path
        rate_limits:
          - {unit: second, requests_per_unit: 10, algorithm: token_bucket, burst: 20}
          - {unit: minute, unit_multiplier: 5, requests_per_unit: 100, algorithm: fixed_window}
  - key: api_key
    value: bronze-key
    rate_limit: {unit: hour, requests_per_unit: 5, name: bronze, replaces: [{name: gold}]}
  - key: path
    value: "/*/admin"
    rate_limit: {unlimited: true, name: admin}
  - key: path
    value: "/health"
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 0}
  - key: nolimit
    descriptors:
      - key: inner
        value: x
        rate_limit: {unit: week, requests_per_unit: 7, calendar: true, time_zone: europe/berlin}
"#,
        );
        assert_eq!(
            text,
            "\
example.api_key_bronze-key: unit=HOUR requests_per_unit=5, name=bronze, shadow_mode=false, replaces=[gold]
example.api_key_gold-key: unit=MINUTE requests_per_unit=600, name=gold, shadow_mode=true
example.api_key_gold-key.path: unit=SECOND requests_per_unit=10 algorithm=token_bucket burst=20, shadow_mode=false
example.api_key_gold-key.path: unit=MINUTE requests_per_unit=100 window=300s algorithm=fixed_window, shadow_mode=false
example.api_key: unit=MINUTE requests_per_unit=60, shadow_mode=false
example.nolimit.inner_x: unit=WEEK requests_per_unit=7 calendar=week@Europe/Berlin algorithm=fixed_window, shadow_mode=false
example.path_/health: unit=DAY requests_per_unit=0, shadow_mode=false, detailed_metric=true
example.path_/api/*: unit=SECOND requests_per_unit=1, shadow_mode=false
example.path_/*/admin: unlimited, name=admin, shadow_mode=false
"
        );
    }

    #[test]
    fn an_in_flight_limit_shows_max_and_expire_after() {
        let text = dump(
            "domain: d\ndescriptors:\n  - key: user\n    in_flight: {max: 2, expire_after: 1500ms}\n",
        );
        assert_eq!(
            text,
            "d.user: in_flight max=2 expire_after=1500ms, shadow_mode=false\n"
        );
    }

    #[test]
    fn empty_rules_dump_nothing() {
        let rules = Rules::default();
        assert_eq!(rules.dump(), "");
        assert_eq!(dump("domain: empty\n"), "");
    }
}
