//! The suites run the repository's example Envoy configuration, with loopback addresses
//! and the test's choices written over the lines the example marks "(test rewrites)".

use std::net::SocketAddr;

/// What a test changes in the example configuration.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// The upstream HTTP server (the `upstream` cluster).
    pub upstream: SocketAddr,
    /// Tollgate's gRPC address (the `ratelimit` cluster).
    pub ratelimit: SocketAddr,
    /// The rate-limit filter's `failure_mode_deny`.
    pub failure_mode_deny: bool,
}

/// `template` (the example `envoy.yaml`) with: the admin interface and the listener on
/// 127.0.0.1 port 0 (Envoy picks; [`super::Envoy::start`] asks it), the two clusters at the
/// given addresses, the given failure mode, and a filter timeout long enough that a slow
/// debug build on a loaded machine is not taken for an unreachable service.
///
/// Each rewritten line must occur exactly once in the template; if an edit breaks that,
/// this panics naming the line.
pub fn render(template: &str, params: &Params) -> String {
    render_with(template, params, Vec::new())
}

/// [`render`], plus the template's own `(test rewrites)` lines (file paths, say), each of
/// which must also occur exactly once.
pub fn render_with(template: &str, params: &Params, extra: Vec<(&'static str, String)>) -> String {
    let mut replacements = addresses(params.upstream, params.ratelimit);
    replacements.extend(extra);
    replacements.extend([
        (
            "failure_mode_deny: false",
            format!("failure_mode_deny: {}", params.failure_mode_deny),
        ),
        ("timeout: 0.25s", "timeout: 5s".to_owned()),
    ]);
    rewrite(template, replacements)
}

/// `template` (the example RLQS `envoy.yaml`) with the admin interface and the listener on
/// 127.0.0.1 port 0 and the two clusters at `upstream` and `ratelimit`.
pub fn render_rlqs(template: &str, upstream: SocketAddr, ratelimit: SocketAddr) -> String {
    rewrite(template, addresses(upstream, ratelimit))
}

/// An example `envoy.yaml` other than the main one (`in-flight/`) with the admin
/// interface and the listener on 127.0.0.1 port 0 and the two clusters at `upstream` and
/// `ratelimit`.
pub fn render_example(template: &str, upstream: SocketAddr, ratelimit: SocketAddr) -> String {
    rewrite(template, addresses(upstream, ratelimit))
}

/// The quota-routing example's `envoy.yaml` with the admin interface and the listener on
/// 127.0.0.1 port 0, its two models at `models` and the `ratelimit` cluster at
/// `ratelimit`.
pub fn render_models(template: &str, models: [SocketAddr; 2], ratelimit: SocketAddr) -> String {
    let mut replacements = addresses(models[0], ratelimit);
    replacements.retain(|(from, _)| !from.contains("upstream"));
    replacements.extend([
        (
            "{ address: model-a, port_value: 5678 }",
            loopback(models[0]),
        ),
        (
            "{ address: model-b, port_value: 5679 }",
            loopback(models[1]),
        ),
    ]);
    rewrite(template, replacements)
}

/// `addr` as a socket address of the example's YAML; only loopback addresses.
fn loopback(addr: SocketAddr) -> String {
    assert!(addr.ip().is_loopback(), "only loopback addresses: {addr}");
    format!("{{ address: {}, port_value: {} }}", addr.ip(), addr.port())
}

/// The rewrites of the admin and listener addresses and of the two clusters.
fn addresses(upstream: SocketAddr, ratelimit: SocketAddr) -> Vec<(&'static str, String)> {
    let any_port = "{ address: 127.0.0.1, port_value: 0 }";
    vec![
        (
            "{ address: 0.0.0.0, port_value: 9901 }",
            any_port.to_owned(),
        ),
        (
            "{ address: 0.0.0.0, port_value: 10000 }",
            any_port.to_owned(),
        ),
        (
            "{ address: upstream, port_value: 5678 }",
            loopback(upstream),
        ),
        (
            "{ address: tollgate, port_value: 8081 }",
            loopback(ratelimit),
        ),
    ]
}

/// Applies `replacements`, each of whose patterns must occur exactly once in `template`.
fn rewrite(template: &str, replacements: Vec<(&'static str, String)>) -> String {
    let mut yaml = template.to_owned();
    for (from, to) in replacements {
        let count = yaml.matches(from).count();
        assert_eq!(
            count, 1,
            "the example envoy.yaml must contain `{from}` exactly once (found {count}): the \
             tests rewrite it"
        );
        yaml = yaml.replace(from, &to);
    }
    yaml
}
