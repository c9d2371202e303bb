//! Environment variables that look like a setting but are none (`REDIS_ULR`): a setting
//! misspelt is silently not set, and a misspelt `REDIS_URL` runs each replica on its own
//! memory store. Each is warned about at startup, naming the closest setting. Only names
//! within a typo or two of one are: unrelated variables (`PATH`, `HOME`) are not.

use clap::CommandFactory as _;

use crate::config::settings::{Cli, all_args};

/// The reference's settings that Tollgate has no flag for: accepted, warned about or
/// refused (`compat`), never typos.
const REFERENCE_ONLY: &[&str] = &[
    "GRPC_UDS",
    "MEMCACHE_HOST_PORT",
    "MEMCACHE_MAX_IDLE_CONNS",
    "MEMCACHE_SRV",
    "MEMCACHE_SRV_REFRESH",
    "MEMCACHE_TLS",
    "MEMCACHE_TLS_CACERT",
    "MEMCACHE_TLS_CLIENT_CERT",
    "MEMCACHE_TLS_CLIENT_KEY",
    "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
    "PROMETHEUS_MAPPER_YAML",
    "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
    "REDIS_PERSECOND",
    "REDIS_PERSECOND_AUTH",
    "REDIS_PERSECOND_PIPELINE_LIMIT",
    "REDIS_PERSECOND_PIPELINE_WINDOW",
    "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_PERSECOND_POOL_SIZE",
    "REDIS_PERSECOND_SENTINEL_AUTH",
    "REDIS_PERSECOND_SOCKET_TYPE",
    "REDIS_PERSECOND_TIMEOUT",
    "REDIS_PERSECOND_TLS",
    "REDIS_PERSECOND_TYPE",
    "REDIS_PERSECOND_URL",
    "REDIS_PIPELINE_LIMIT",
    "REDIS_PIPELINE_WINDOW",
    "REDIS_POOL_ON_EMPTY_BEHAVIOR",
    "REDIS_POOL_SIZE",
    "REDIS_SENTINEL_AUTH",
    "REDIS_SOCKET_TYPE",
    "RUNTIME_IGNOREDOTFILES",
    "RUNTIME_WATCH_ROOT",
];

/// Other programs' names for a setting, which a user may bring along: never read.
const ALIASES: &[(&str, &str)] = &[("TOKIO_WORKER_THREADS", "WORKER_THREADS")];

/// Variables of the OpenTelemetry SDK (`OTEL_EXPORTER_OTLP_ENDPOINT`, …), read by it.
const SDK_PREFIX: &str = "OTEL_";

/// One warning per variable of `names` that is no setting but is close to one.
pub(crate) fn warnings(names: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut known: Vec<String> = all_args(&Cli::command())
        .iter()
        .filter_map(|arg| arg.get_env()?.to_str().map(str::to_owned))
        .collect();
    known.extend(REFERENCE_ONLY.iter().map(|n| (*n).to_owned()));
    known.sort();
    known.dedup();
    let mut found: Vec<String> = names
        .into_iter()
        .filter(|name| !name.starts_with(SDK_PREFIX) && !known.contains(name))
        .filter_map(|name| {
            let alias = ALIASES.iter().find(|(alias, _)| *alias == name);
            let meant = alias
                .map(|(_, meant)| *meant)
                .or_else(|| closest(&name, &known))?;
            Some(format!(
                "{name} is not a setting (it is ignored); did you mean {meant}?"
            ))
        })
        .collect();
    found.sort();
    found
}

/// The setting `name` is a typo of: the nearest by edit distance, if within one edit of
/// a short name or two of a long one (compared in capitals: the environment is
/// case-sensitive, so `redis_url` is a typo too).
fn closest<'a>(name: &str, known: &'a [String]) -> Option<&'a str> {
    let upper = name.to_ascii_uppercase();
    known
        .iter()
        .map(|setting| (distance(&upper, setting), setting))
        .filter(|(d, setting)| *d <= if setting.len() < 12 { 1 } else { 2 })
        .min()
        .map(|(_, setting)| setting.as_str())
}

/// Edits (insertions, deletions, substitutions, swaps of neighbours) from `a` to `b`.
fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut rows = vec![vec![0; b.len() + 1]; a.len() + 1];
    for (i, row) in rows.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in rows[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (rows[i - 1][j] + 1)
                .min(rows[i][j - 1] + 1)
                .min(rows[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(rows[i - 2][j - 2] + 1);
            }
            rows[i][j] = best;
        }
    }
    rows[a.len()][b.len()]
}

#[cfg(test)]
mod tests {
    use tollgate_testkit::envoy_gateway;

    use super::*;

    fn warned(names: &[&str]) -> Vec<String> {
        warnings(names.iter().map(|n| (*n).to_owned()))
    }

    #[test]
    fn a_near_miss_names_the_setting_meant() {
        assert_eq!(
            warned(&["REDIS_ULR"]),
            ["REDIS_ULR is not a setting (it is ignored); did you mean REDIS_URL?"]
        );
        assert_eq!(warned(&["redis_url"]).len(), 1);
        assert!(warned(&["LOG_LEVL"])[0].ends_with("did you mean LOG_LEVEL?"));
        assert!(warned(&["REDIS_POOL_SIZ"])[0].ends_with("did you mean REDIS_POOL_SIZE?"));
    }

    #[test]
    fn another_programs_name_for_a_setting_names_ours() {
        assert_eq!(
            warned(&["TOKIO_WORKER_THREADS"]),
            ["TOKIO_WORKER_THREADS is not a setting (it is ignored); did you mean WORKER_THREADS?"]
        );
    }

    #[test]
    fn settings_and_unrelated_variables_are_not_warned_about() {
        let quiet = [
            "REDIS_URL",
            "REDIS_POOL_SIZE",
            "PATH",
            "HOME",
            "HOSTNAME",
            "USER",
            "TERM",
            "LANG",
            "KUBERNETES_SERVICE_HOST",
            "REDIS_PORT",
            "REDIS_SERVICE_HOST",
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            "RUST_BACKTRACE",
            "HTTP_PROXY",
        ];
        assert_eq!(warned(&quiet), Vec::<String>::new());
    }

    #[test]
    fn envoy_gateway_environment_needs_no_warning() {
        let names = envoy_gateway::ENV
            .iter()
            .map(|(name, _)| (*name).to_owned());
        assert_eq!(warnings(names), Vec::<String>::new());
    }

    #[test]
    fn distance_counts_a_swap_as_one_edit() {
        assert_eq!(distance("REDIS_ULR", "REDIS_URL"), 1);
        assert_eq!(distance("HOME", "HOST"), 2);
        assert_eq!(distance("", "ABC"), 3);
    }
}
