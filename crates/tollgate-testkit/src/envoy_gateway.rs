//! What Envoy Gateway sets on the rate-limit service it deploys, for the tests that check
//! Tollgate runs in its place.

/// The environment variables Envoy Gateway gives every deployment, with its values; the
/// xDS address, the node and the certificates' paths vary and are left to each test.
pub const ENV: [(&str, &str); 10] = [
    ("RUNTIME_ROOT", "/data"),
    ("RUNTIME_SUBDIRECTORY", "ratelimit"),
    ("RUNTIME_IGNOREDOTFILES", "true"),
    ("RUNTIME_WATCH_ROOT", "false"),
    ("LOG_LEVEL", "info"),
    ("USE_STATSD", "false"),
    ("CONFIG_TYPE", "GRPC_XDS_SOTW"),
    ("GRPC_SERVER_USE_TLS", "true"),
    ("REDIS_SOCKET_TYPE", "tcp"),
    ("PROMETHEUS_MAPPER_YAML", "/etc/statsd-exporter/conf.yaml"),
];
