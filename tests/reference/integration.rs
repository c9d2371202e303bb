//! The reference's own integration suite (`integration-test/` of its module): each of its
//! scripts, with its Envoy configurations (`examples/envoy/proxy.yaml` in front,
//! `mock.yaml` as the upstream), its rule files (`examples/ratelimit/config/`), its
//! statsd_exporter mapping and the environment of its compose file, run with bash and curl
//! against the reference itself (a control, which must pass) and against Tollgate, in its
//! default mode (sliding windows) and in reference mode.
//!
//! [`newest`]: the same suite from a checkout of the reference's newest source, named by
//! `REFERENCE_NEWEST_DIR` (the module proxy serves only the pinned version, and no other
//! project's code is copied into this one; without it these tests skip, saying so). Its
//! scripts include quota-mode budgets waiting a minute for a one-a-minute limit; they run
//! against Tollgate in both modes (the pinned reference predates them).
//!
//! Only hosts and ports are rewritten, into copies under `target/`: the compose file's
//! service names become 127.0.0.1 and its ports free ones. One variable is added to the
//! compose file's environment, for both servers: `STATS_FLUSH_INTERVAL=1s`. The
//! reference sends statsd every 10 s by default, and
//! `value-included-in-stats-key-when-unspecified.sh` reads the metrics 5 s after its
//! requests, so with the default it passes against the reference only when a flush
//! happens to fall into those 5 s, about every other run.
//!
//! Each script runs on a stack of its own (redis-server, statsd_exporter, the server, two
//! Envoys), so that a failure names one script and one server; it starts with at least
//! 5 s left in the current minute, as the scripts' one-minute limits would otherwise reset
//! under them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;
use tollgate_testkit::envoy::Envoy;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::reference::{self, Installed, Reference, RuntimeRoot};
use tollgate_testkit::statsd_exporter::StatsdExporter;
use tollgate_testkit::tollgate::Server;
use tollgate_testkit::{free_ports, http, process, serial, wait};

use crate::support::{tollgate_with_env, vars, work_dir};

/// How long one script may run (the longest sleeps 60 s).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(90);
/// The scripts' limits are per minute; none needs more than this of one.
const SCRIPT_NEEDS: Duration = Duration::from_secs(5);

/// One test per script and target, named `integration::SCRIPT::TARGET` (the targets
/// given as `test name: Target variant`), and the list of the scripts, `$list`.
macro_rules! scripts {
    ($list:ident from $source:ident against $targets:tt: $($name:ident => $file:literal),* $(,)?) => {
        /// Every script of the source that has tests here.
        const $list: &[&str] = &[$($file),*];
        $(
            mod $name {
                script_tests!($source, $file, $targets);
            }
        )*
    };
}

/// The tests of one script, one per target.
macro_rules! script_tests {
    ($source:ident, $file:literal, [$($test:ident: $target:ident),*]) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                crate::integration::run(
                    crate::integration::Source::$source,
                    $file,
                    crate::integration::Target::$target,
                )
                .await;
            }
        )*
    };
}

scripts! {
    SCRIPTS from Module against [
        reference: Reference, tollgate: Tollgate, tollgate_reference_mode: TollgateReferenceMode
    ]:
    replaces => "replaces.sh",
    simple_get => "simple-get.sh",
    trigger_ratelimit => "trigger-ratelimit.sh",
    trigger_shadow_mode_key => "trigger-shadow-mode-key.sh",
    value_included_in_stats_key_when_unspecified => "value-included-in-stats-key-when-unspecified.sh",
}

/// The suite of the reference's newest source.
mod newest {
    scripts! {
        SCRIPTS from Newest against [tollgate: Tollgate, tollgate_reference_mode: TollgateReferenceMode]:
        multiservice_tokenquota => "multiservice-tokenquota.sh",
        quota => "quota.sh",
        replaces => "replaces.sh",
        simple_get => "simple-get.sh",
        token_quota => "token-quota.sh",
        trigger_ratelimit => "trigger-ratelimit.sh",
        trigger_shadow_mode_key => "trigger-shadow-mode-key.sh",
        value_included_in_stats_key_when_unspecified => "value-included-in-stats-key-when-unspecified.sh",
    }

    /// A script added to the newest source must get its tests.
    #[test]
    fn every_script_of_the_newest_source_has_its_tests() {
        let Some(dir) = super::newest("every_script_of_the_newest_source_has_its_tests") else {
            return;
        };
        assert_eq!(super::scripts_in(&dir), SCRIPTS, "in {}", dir.display());
    }
}

/// A script added to the module (at another pinned version) must get its tests.
#[test]
fn every_script_of_the_module_has_its_tests() {
    let Some(installed) =
        reference::or_skip("integration::every_script_of_the_module_has_its_tests")
    else {
        return;
    };
    let dir = installed.module_dir.clone();
    assert_eq!(
        scripts_in(&dir),
        SCRIPTS,
        "the scripts in {}",
        dir.display()
    );
}

/// The names of the scripts of the suite in `source`, sorted.
fn scripts_in(source: &Path) -> Vec<String> {
    let dir = source.join("integration-test/scripts");
    let mut found: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".sh"))
        .collect();
    found.sort();
    found
}

/// Where a script and its configurations come from.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// The module at the pinned version (`REFERENCE_MODULE_DIR`).
    Module,
    /// A checkout of the newest source (`REFERENCE_NEWEST_DIR`).
    Newest,
}

/// The checkout of the reference's newest source that `REFERENCE_NEWEST_DIR` names, or
/// none: `test` is then skipped, saying so.
fn newest(test: &str) -> Option<PathBuf> {
    match std::env::var_os("REFERENCE_NEWEST_DIR").filter(|dir| !dir.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir)),
        None => {
            reference::skipped(
                test,
                "REFERENCE_NEWEST_DIR names no checkout of the reference's newest source",
            );
            None
        }
    }
}

impl Source {
    fn dir(self, installed: &Installed, test: &str) -> Option<PathBuf> {
        match self {
            Self::Module => Some(installed.module_dir.clone()),
            Self::Newest => newest(test),
        }
    }
}

/// The server a script runs against.
#[derive(Clone, Copy, Debug)]
enum Target {
    Reference,
    Tollgate,
    /// Tollgate with `REFERENCE_MODE=true`.
    TollgateReferenceMode,
}

enum Running {
    Reference(Reference),
    Tollgate(Server),
}

impl Running {
    async fn start(target: Target, installed: &Installed, env: &[(String, String)]) -> Self {
        match target {
            Target::Reference => Self::Reference(Reference::start(installed, env).await),
            Target::Tollgate => Self::Tollgate(tollgate_with_env(env).start()),
            Target::TollgateReferenceMode => {
                let mut env = env.to_vec();
                env.extend(vars(&[("REFERENCE_MODE", "true")]));
                Self::Tollgate(tollgate_with_env(&env).start())
            }
        }
    }

    fn grpc(&self) -> std::net::SocketAddr {
        match self {
            Self::Reference(server) => server.grpc,
            Self::Tollgate(server) => server.grpc_addr(),
        }
    }

    /// The end of its log, and Tollgate's store metrics (a store answer slower than
    /// `STORE_TIMEOUT` is decided without the store).
    async fn diagnostics(&self) -> String {
        match self {
            Self::Reference(server) => format!("--- its log ---\n{}", server.log().tail(40)),
            Self::Tollgate(server) => {
                let page = server.get("/metrics").await.body;
                let store: Vec<&str> = page
                    .lines()
                    .filter(|line| {
                        line.starts_with("tollgate_store_") || line.starts_with("tollgate_local_")
                    })
                    .collect();
                format!(
                    "--- its log ---\n{}\n--- its store metrics ---\n{}",
                    server.stderr().tail(40),
                    store.join("\n")
                )
            }
        }
    }
}

async fn run(source: Source, script: &str, target: Target) {
    let test = format!("integration: {script} of {source:?} against {target:?}");
    let Some(installed) = reference::or_skip(&test) else {
        return;
    };
    // Tollgate gives Redis 10 ms (its STORE_TIMEOUT): stacks starting and running beside
    // each other on a small machine would make it run out. Envoy's filter gets 2 s below,
    // not its default 20 ms, which a busy host missed (the scripts test answers, not speed).
    let _alone = serial::timing().await;
    let Some(module) = &source.dir(installed, &test) else {
        return;
    };
    let dir =
        TempDir::new_in(prepared(&work_dir("integration"))).expect("a directory for the copies");

    let redis = RedisServer::start();
    let statsd = StatsdExporter::start(
        installed,
        &module.join("examples/prom-statsd-exporter/conf.yaml"),
    )
    .await;
    let root = RuntimeRoot::new_in(dir.path());
    root.copy_rules_from(&module.join("examples/ratelimit/config"));
    let env = compose_env(
        &read(&module.join("integration-test/docker-compose-integration-test.yml")),
        &redis,
        &statsd,
        &root,
    );
    let server = Running::start(target, installed, &env).await;

    // Envoy listens with SO_REUSEPORT: the two must not be given one port. The newest
    // mock serves a second service on 10001.
    let [mock_port, proxy_port, second_port] = free_ports();
    let second = [("port_value: 10001", format!("port_value: {second_port}"))];
    let mock = rewrite(
        &rewrite_optional(&read(&module.join("examples/envoy/mock.yaml")), &second),
        &[
            ("address: 0.0.0.0", "address: 127.0.0.1".to_owned()),
            ("port_value: 8001", "port_value: 0".to_owned()),
            ("port_value: 9999", format!("port_value: {mock_port}")),
        ],
    );
    let _mock = Envoy::start_with_args(
        &mock,
        &["--service-node", "mock", "--service-cluster", "mock"],
    )
    .await;
    let proxy = rewrite(
        &rewrite_optional(&read(&module.join("examples/envoy/proxy.yaml")), &second),
        &[
            ("address: 0.0.0.0", "address: 127.0.0.1".to_owned()),
            ("address: ratelimit", "address: 127.0.0.1".to_owned()),
            ("address: envoy-mock", "address: 127.0.0.1".to_owned()),
            ("port_value: 8001", "port_value: 0".to_owned()),
            (
                "port_value: 8081",
                format!("port_value: {}", server.grpc().port()),
            ),
            ("port_value: 9999", format!("port_value: {mock_port}")),
            ("port_value: 8888", format!("port_value: {proxy_port}")),
            (
                "failure_mode_deny: false",
                "failure_mode_deny: false\n                      timeout: 2s".to_owned(),
            ),
        ],
    );
    let proxy = Envoy::start_with_args(
        &proxy,
        &["--service-node", "proxy", "--service-cluster", "proxy"],
    )
    .await;
    assert_eq!(proxy.listener.port(), proxy_port, "the proxy's listener");

    let text = read(&module.join("integration-test/scripts").join(script));
    let text = rewrite_optional(
        &text,
        &[
            ("envoy-proxy:8888", format!("127.0.0.1:{proxy_port}")),
            ("statsd:9102", statsd.web.to_string()),
        ],
    );
    for host in ["envoy-proxy", "envoy-mock", "statsd:", "ratelimit:"] {
        assert!(
            !text.contains(host),
            "{script} names {host} in a way not rewritten:\n{text}"
        );
    }
    let copy = dir.path().join(script);
    std::fs::write(&copy, &text).expect("write the script's copy");

    wait::room_in_window(Duration::from_secs(60), SCRIPT_NEEDS).await;
    let mut bash = Command::new("bash");
    bash.arg(&copy).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        bash.env("PATH", path);
    }
    let finished = process::run(script, bash, SCRIPT_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    if !finished.status.success() {
        let envoy_stats = http::get(proxy.admin, "/stats?filter=^cluster.mock.ratelimit")
            .await
            .body;
        panic!(
            "{script} failed against {target:?} ({}).\n--- its stdout ---\n{}--- its stderr ---\n{}\
             --- the proxy Envoy's rate-limit stats (errors and failure_mode_allowed count \
             answers that took longer than the filter's timeout of 2 s) ---\n{envoy_stats}\
             --- the server ---\n{}",
            finished.status,
            finished.stdout,
            finished.stderr,
            server.diagnostics().await
        );
    }
}

/// `dir`, created.
fn prepared(dir: &Path) -> &Path {
    std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The `environment:` of the compose file's `ratelimit` service, with its hosts and ports
/// (`statsd`, `9125`, `redis:6379`, `/data`) pointing at this test's, and
/// `STATS_FLUSH_INTERVAL=1s` (see the module documentation).
fn compose_env(
    compose: &str,
    redis: &RedisServer,
    statsd: &StatsdExporter,
    root: &RuntimeRoot,
) -> Vec<(String, String)> {
    let mut env = service_environment(compose, "ratelimit");
    let rewrites = [
        ("STATSD_HOST", "statsd", statsd.statsd.ip().to_string()),
        ("STATSD_PORT", "9125", statsd.statsd.port().to_string()),
        ("REDIS_URL", "redis:6379", redis.host_port()),
        ("RUNTIME_ROOT", "/data", root.root().display().to_string()),
    ];
    for (name, from, to) in rewrites {
        let Some((_, value)) = env.iter_mut().find(|(n, _)| n == name) else {
            panic!("the compose file's ratelimit service sets no {name}");
        };
        assert_eq!(value, from, "{name} in the compose file");
        *value = to;
    }
    env.extend(vars(&[("STATS_FLUSH_INTERVAL", "1s")]));
    env
}

/// The `- NAME=VALUE` items of `environment:` of service `service` of a compose file.
fn service_environment(compose: &str, service: &str) -> Vec<(String, String)> {
    let header = format!("  {service}:");
    let mut lines = compose
        .lines()
        .skip_while(|line| *line != header)
        .skip(1)
        .take_while(|line| line.starts_with("    ") || line.trim().is_empty());
    let found = lines.any(|line| line.trim() == "environment:");
    assert!(
        found,
        "no environment: for service {service} in the compose file"
    );
    let env: Vec<(String, String)> = lines
        .map_while(|line| line.trim().strip_prefix("- "))
        .filter_map(|item| item.split_once('='))
        .map(|(name, value)| (name.to_owned(), value.to_owned()))
        .collect();
    assert!(
        !env.is_empty(),
        "an empty environment for service {service}"
    );
    env
}

/// `text` with each pattern replaced by its replacement, in one pass (what a replacement
/// writes is not looked at again); every pattern must occur.
fn rewrite(text: &str, rewrites: &[(&str, String)]) -> String {
    let (out, used) = replace_all(text, rewrites);
    for ((from, _), count) in rewrites.iter().zip(used) {
        assert!(count > 0, "`{from}` does not occur in:\n{text}");
    }
    out
}

/// [`rewrite`] for patterns that need not occur.
fn rewrite_optional(text: &str, rewrites: &[(&str, String)]) -> String {
    replace_all(text, rewrites).0
}

fn replace_all(text: &str, rewrites: &[(&str, String)]) -> (String, Vec<usize>) {
    let mut out = String::with_capacity(text.len());
    let mut used = vec![0; rewrites.len()];
    let mut rest = text;
    while let Some(next) = rest.chars().next() {
        match rewrites.iter().position(|(from, _)| rest.starts_with(from)) {
            Some(i) => {
                out.push_str(&rewrites[i].1);
                rest = &rest[rewrites[i].0.len()..];
                used[i] += 1;
            }
            None => {
                out.push(next);
                rest = &rest[next.len_utf8()..];
            }
        }
    }
    (out, used)
}
