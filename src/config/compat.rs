//! Settings of the reference service that Tollgate does not implement. Deployments made for
//! the reference (Envoy Gateway's among them) set some of them; the ones that would change
//! behaviour are warned about at startup rather than silently ignored, and those without
//! which the deployment cannot work as meant stop startup with a reason. Those that are
//! no-ops here (`RUNTIME_IGNOREDOTFILES=true`, `RUNTIME_WATCH_ROOT`, `REDIS_POOL_SIZE`,
//! `PROMETHEUS_MAPPER_YAML`, `REDIS_SOCKET_TYPE=tcp`, …) are accepted without a word; the
//! docs/MIGRATING.md lists every setting of the reference and what Tollgate does with it.

use tollgate_core::redact;

/// When a variable matters.
#[derive(Debug, Clone, Copy)]
enum When {
    /// When set to a true value (`true`, `1`, …, as Go's `strconv.ParseBool`).
    True,
    /// When set to a false value.
    False,
    /// When set to anything but this value (compared case-insensitively).
    Not(&'static str),
    /// When set to anything but blanks.
    NotEmpty,
}

/// The reference's variables that Tollgate cannot honour and that a deployment relies on
/// when it sets them: startup stops, saying what to do instead.
const REFUSED: &[(&str, When, &str)] = &[
    (
        "GRPC_UDS",
        When::NotEmpty,
        "Tollgate serves gRPC on TCP only: point Envoy at GRPC_HOST:GRPC_PORT",
    ),
    (
        "REDIS_SENTINEL_AUTH",
        When::NotEmpty,
        "give the sentinels' password in their addresses in REDIS_URL \
         (master,redis://:PASSWORD@host:port,…)",
    ),
    (
        "MEMCACHE_HOST_PORT",
        When::NotEmpty,
        "memcached is not a Tollgate store: use BACKEND_TYPE=redis, postgres or memory",
    ),
    (
        "MEMCACHE_SRV",
        When::NotEmpty,
        "memcached is not a Tollgate store: use BACKEND_TYPE=redis, postgres or memory",
    ),
];

/// The reference's variables that change its behaviour and that Tollgate ignores, with
/// what the user gets instead.
const UNSUPPORTED: &[(&str, When, &str)] = &[
    (
        "REDIS_SOCKET_TYPE",
        When::Not("tcp"),
        "only TCP connections to Redis are supported",
    ),
    (
        "REDIS_PERSECOND",
        When::True,
        "a second Redis for per-second limits is not supported; one store holds every counter",
    ),
    (
        "RUNTIME_IGNOREDOTFILES",
        When::False,
        "dot-files are always skipped when reading rules",
    ),
];

/// One warning per unsupported setting found through `var`, naming it and its value.
pub(crate) fn warnings(var: impl Fn(&str) -> Option<String>) -> Vec<String> {
    found(UNSUPPORTED, var)
}

/// One reason per setting found through `var` that stops startup.
pub(crate) fn refusals(var: impl Fn(&str) -> Option<String>) -> Vec<String> {
    found(REFUSED, var)
}

fn found(table: &[(&str, When, &str)], var: impl Fn(&str) -> Option<String>) -> Vec<String> {
    table
        .iter()
        .filter_map(|(name, when, consequence)| {
            let value = var(name)?;
            let applies = match when {
                When::True => truthy(&value) == Some(true),
                When::False => truthy(&value) == Some(false),
                When::Not(expected) => !value.trim().eq_ignore_ascii_case(expected),
                When::NotEmpty => !value.trim().is_empty(),
            };
            let shown = redact::setting(name, &value);
            applies.then(|| format!("{name}={shown} is not supported: {consequence}"))
        })
        .collect()
}

/// Go's `strconv.ParseBool`, which the reference's settings use.
fn truthy(value: &str) -> Option<bool> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use tollgate_testkit::envoy_gateway;

    use super::*;

    fn warnings_for(pairs: &[(&str, &str)]) -> Vec<String> {
        let env: HashMap<&str, &str> = pairs.iter().copied().collect();
        warnings(|name| env.get(name).map(|v| (*v).to_owned()))
    }

    #[test]
    fn envoy_gateway_environment_needs_no_warning() {
        let mut env = envoy_gateway::ENV.to_vec();
        env.extend([
            ("GRPC_SERVER_TLS_CERT", "/certs/tls.crt"),
            ("GRPC_SERVER_TLS_KEY", "/certs/tls.key"),
            ("GRPC_SERVER_TLS_CA_CERT", "/certs/ca.crt"),
        ]);
        let found = warnings_for(&env);
        assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn settings_a_deployment_relies_on_stop_startup() {
        let env: HashMap<&str, &str> = [("GRPC_UDS", "/tmp/rl.sock"), ("MEMCACHE_SRV", " ")]
            .into_iter()
            .collect();
        let refused = refusals(|name| env.get(name).map(|v| (*v).to_owned()));
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].starts_with("GRPC_UDS=/tmp/rl.sock is not supported: "));
    }

    #[test]
    fn a_refused_password_is_not_repeated() {
        let refused = refusals(|name| (name == "REDIS_SENTINEL_AUTH").then(|| "hunter2".into()));
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(
            refused[0].starts_with("REDIS_SENTINEL_AUTH=*** is not supported: "),
            "{refused:?}"
        );
    }

    #[test]
    fn values_decide_whether_a_setting_matters() {
        assert!(warnings_for(&[("USE_STATSD", "false"), ("REDIS_PERSECOND", "0")]).is_empty());
        assert_eq!(warnings_for(&[("REDIS_PERSECOND", "True")]).len(), 1);
        assert_eq!(warnings_for(&[("REDIS_SOCKET_TYPE", "unix")]).len(), 1);
        assert!(warnings_for(&[("REDIS_SOCKET_TYPE", "TCP")]).is_empty());
        assert_eq!(
            warnings_for(&[("RUNTIME_IGNOREDOTFILES", "false")]).len(),
            1
        );
    }
}
