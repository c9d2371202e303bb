//! The reference's stat names for the series it has: what `/stats` on the debug port prints
//! and what the statsd sink sends. They are read from the same registry as `/metrics`
//! (its OpenMetrics text), and named back as the reference's statsd mapping
//! (`examples/prom-statsd-exporter/conf.yaml` there) would read them, so a statsd
//! pipeline maps them onto the same Prometheus series the reference's did.

use std::collections::BTreeMap;

/// One stat under the reference's name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Stat {
    /// A monotonic count since start.
    Counter(u64),
    /// Observed durations since start: how many and their sum in milliseconds.
    Timer { count: u64, sum_ms: f64 },
}

/// Every reference stat in `text` (an OpenMetrics exposition), by name.
pub(crate) fn read(text: &str) -> BTreeMap<String, Stat> {
    let mut stats = BTreeMap::new();
    let mut timers: BTreeMap<String, (u64, f64)> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(sample) = Sample::parse(line) else {
            continue;
        };
        if let Some(name) = timer_name(sample.series) {
            let timer = timers.entry(name.to_owned()).or_default();
            match sample.suffix {
                "_count" => timer.0 = sample.value as u64,
                "_sum" => timer.1 = sample.value * 1_000.0,
                _ => {}
            }
        } else if let Some(name) = counter_name(&sample) {
            stats.insert(name, Stat::Counter(sample.value as u64));
        }
    }
    for (name, (count, sum_ms)) in timers {
        stats.insert(name, Stat::Timer { count, sum_ms });
    }
    stats
}

/// `/stats`: one `name: value` line per stat, sorted by name.
pub(crate) fn text(stats: &BTreeMap<String, Stat>) -> String {
    let mut out = String::new();
    for (name, stat) in stats {
        match stat {
            Stat::Counter(n) => out.push_str(&format!("{name}: {n}\n")),
            Stat::Timer { count, sum_ms } => {
                out.push_str(&format!("{name}.count: {count}\n"));
                out.push_str(&format!("{name}.sum_ms: {sum_ms:.3}\n"));
            }
        }
    }
    out
}

/// One sample line: `series{labels} value`, the series split from a histogram's suffix.
struct Sample<'a> {
    series: &'a str,
    suffix: &'a str,
    labels: Vec<(&'a str, String)>,
    value: f64,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Option<Self> {
        let (head, value) = line.rsplit_once(' ')?;
        let value = value.parse::<f64>().ok().filter(|v| v.is_finite())?;
        let (name, labels) = match head.split_once('{') {
            Some((name, rest)) => (name, labels(rest.strip_suffix('}')?)?),
            None => (head, Vec::new()),
        };
        let (series, suffix) = ["_bucket", "_count", "_sum", "_total"]
            .iter()
            .find_map(|s| name.strip_suffix(s).map(|series| (series, *s)))
            .unwrap_or((name, ""));
        Some(Self {
            series,
            suffix,
            labels,
            value,
        })
    }

    fn label(&self, name: &str) -> &str {
        self.labels
            .iter()
            .find(|(n, _)| *n == name)
            .map_or("", |(_, v)| v.as_str())
    }
}

/// `a="x",b="y\"z"` as pairs, escapes undone.
fn labels(text: &str) -> Option<Vec<(&str, String)>> {
    let mut pairs = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let (name, after) = rest.split_once("=\"")?;
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next()? {
                (i, '"') => break i,
                (_, '\\') => match chars.next()?.1 {
                    'n' => value.push('\n'),
                    other => value.push(other),
                },
                (_, c) => value.push(c),
            }
        };
        pairs.push((name.trim_start_matches(','), value));
        rest = &after[end + 1..];
    }
    Some(pairs)
}

/// The reference's per-descriptor stats, by their Prometheus series.
const DESCRIPTOR_STATS: &[&str] = &[
    "total_hits",
    "over_limit",
    "near_limit",
    "within_limit",
    "shadow_mode",
];

fn counter_name(sample: &Sample<'_>) -> Option<String> {
    if !matches!(sample.suffix, "" | "_total") {
        return None;
    }
    if let Some(stat) = sample
        .series
        .strip_prefix("ratelimit_service_rate_limit_")
        .filter(|s| DESCRIPTOR_STATS.contains(s))
    {
        let key2 = sample.label("key2");
        let levels = match key2 {
            "" => sample.label("key1").to_owned(),
            _ => format!("{}.{key2}", sample.label("key1")),
        };
        let domain = sample.label("domain");
        return Some(format!(
            "ratelimit.service.rate_limit.{domain}.{levels}.{stat}"
        ));
    }
    match sample.series {
        "ratelimit_service_config_load_success" => {
            Some("ratelimit.service.config_load_success".into())
        }
        "ratelimit_service_config_load_error" => Some("ratelimit.service.config_load_error".into()),
        "ratelimit_service_total_requests" => Some(format!(
            "ratelimit_server.{}.total_requests",
            sample.label("grpc_method")
        )),
        "ratelimit_service_should_rate_limit_error" => Some(format!(
            "ratelimit.service.call.should_rate_limit.{}",
            sample.label("err_type")
        )),
        _ => None,
    }
}

fn timer_name(series: &str) -> Option<&'static str> {
    (series == "ratelimit_service_response_time_seconds")
        .then_some("ratelimit_server.ShouldRateLimit.response_time")
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = r#"# HELP ratelimit_service_rate_limit_total_hits Hits.
# TYPE ratelimit_service_rate_limit_total_hits counter
ratelimit_service_rate_limit_total_hits_total{domain="edge",key1="user",key2=""} 7
ratelimit_service_rate_limit_over_limit{domain="edge",key1="path_/a",key2="method_GET.x"} 2
ratelimit_service_rate_limit_within_limit{domain="q\"d",key1="k",key2=""} 1
ratelimit_service_config_load_success_total 3
ratelimit_service_total_requests{grpc_method="ShouldRateLimit"} 9
ratelimit_service_should_rate_limit_error{err_type="redis_error"} 4
ratelimit_service_response_time_seconds_sum 0.25
ratelimit_service_response_time_seconds_count 5
ratelimit_service_response_time_seconds_bucket{le="0.001"} 5
tollgate_store_up 1
# EOF
"#;

    #[test]
    fn series_are_named_as_the_reference_names_them() {
        let stats = read(EXPOSITION);
        let counter = |name: &str| stats.get(name).cloned();
        assert_eq!(
            counter("ratelimit.service.rate_limit.edge.user.total_hits"),
            Some(Stat::Counter(7))
        );
        assert_eq!(
            counter("ratelimit.service.rate_limit.edge.path_/a.method_GET.x.over_limit"),
            Some(Stat::Counter(2))
        );
        assert_eq!(
            counter("ratelimit.service.rate_limit.q\"d.k.within_limit"),
            Some(Stat::Counter(1))
        );
        assert_eq!(
            counter("ratelimit.service.config_load_success"),
            Some(Stat::Counter(3))
        );
        assert_eq!(
            counter("ratelimit_server.ShouldRateLimit.total_requests"),
            Some(Stat::Counter(9))
        );
        assert_eq!(
            counter("ratelimit.service.call.should_rate_limit.redis_error"),
            Some(Stat::Counter(4))
        );
        assert_eq!(
            counter("ratelimit_server.ShouldRateLimit.response_time"),
            Some(Stat::Timer {
                count: 5,
                sum_ms: 250.0
            })
        );
        assert_eq!(
            stats.len(),
            7,
            "Tollgate's own series are not the reference's"
        );
    }

    #[test]
    fn the_text_is_name_colon_value() {
        let text = text(&read(EXPOSITION));
        assert!(text.contains("ratelimit.service.rate_limit.edge.user.total_hits: 7\n"));
        assert!(text.contains("ratelimit_server.ShouldRateLimit.response_time.count: 5\n"));
        assert!(text.contains("ratelimit_server.ShouldRateLimit.response_time.sum_ms: 250.000\n"));
    }
}
