//! The rules every Redis suite serves, where their counters live in Redis, and the
//! accuracy check of a steady overload.

use std::time::Duration;

use tollgate_testkit::accuracy::{OverloadRun, assert_steady_overload_kept};
use tollgate_testkit::grpc::Rls;
use tollgate_testkit::keys::{Shape, redis_key};
pub use tollgate_testkit::process::blocking;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::{Serve, Server};
use tollgate_testkit::wait;

pub const DOMAIN: &str = "rl";

/// Limits of the Redis suites, each for one purpose.
pub const RULES: &str = tollgate_testkit::shared_store_rules!(
    "rl",
    "  # 5 per hour, the reference's fixed window.
  - key: fixed
    rate_limit: {unit: hour, requests_per_unit: 5, algorithm: fixed_window}
"
);

pub use tollgate_testkit::shared_store::{
    ACC_LIMIT, ACC_SUB_WINDOW, ACC_WINDOW, PROBE_LIMIT, USER_LIMIT, YEARLY_LIMIT,
    assert_instances_share_exactly, await_exact_probe,
};
pub const HOUR: Duration = Duration::from_secs(3_600);

/// The Redis key of the counter for `rule=value` under [`RULES`].
pub fn key(prefix: &str, rule: &str, value: &str) -> String {
    let shape = match rule {
        "user" => Shape::sliding(Duration::from_secs(60)),
        "fixed" => Shape::Fixed { window: HOUR },
        "probe" | "busy" | "hundred" => Shape::sliding(HOUR),
        "yearly" => Shape::sliding(Duration::from_secs(365 * 86_400)),
        "acc" => Shape::sliding(ACC_WINDOW),
        other => panic!("no rule for `{other}` in RULES"),
    };
    redis_key(prefix, DOMAIN, &[(rule, value)], &[shape])
}

/// `tollgate serve` on [`RULES`] with counters in a Redis deployment of `redis_type` at `url`.
pub fn serve(redis_type: &str, url: &str) -> Serve {
    Serve::rules(RULES).redis(redis_type, url)
}

/// One instance on the single Redis `redis` with the admin token, once connected.
pub async fn admin_instance(redis: &RedisServer) -> Server {
    serve("single", &redis.url())
        .args(["--store-timeout", "1s"])
        .env("ADMIN_TOKEN", tollgate_testkit::admin::TOKEN)
        .start_connected()
        .await
}

/// [`serve`] with `args`, once the store is connected.
pub async fn connected(redis_type: &str, url: &str, args: &[&str]) -> Server {
    serve(redis_type, url).args(args).start_connected().await
}

/// Two instances on the deployment at `url` with `args`, once connected, and a client of
/// each.
pub async fn two_connected(redis_type: &str, url: &str, args: &[&str]) -> ([Server; 2], Vec<Rls>) {
    let a = connected(redis_type, url, args).await;
    let b = connected(redis_type, url, args).await;
    let clients = vec![a.client().await, b.client().await];
    ([a, b], clients)
}

/// The accuracy check of README.md ([`assert_steady_overload_kept`]) on the `acc` rule
/// (value `value`), round-robin over `servers`. Run it with `--on-store-error error`, so
/// that a stalled store shows up as failed answers instead of local decisions.
pub async fn assert_accurate_under_overload(servers: &[Server], value: &str) -> OverloadRun {
    let mut clients: Vec<Rls> = Vec::new();
    for server in servers {
        clients.push(server.client().await);
    }
    assert_steady_overload_kept(
        &clients,
        DOMAIN,
        &[("acc", value)],
        ACC_LIMIT,
        ACC_WINDOW,
        ACC_SUB_WINDOW,
    )
    .await
}

/// One normal connection to a redis-server, as `CLIENT LIST` describes it.
#[derive(Debug)]
pub struct Client {
    pub id: u64,
    /// The protocol it speaks: 2 or 3.
    pub resp: u8,
}

/// The normal connections to `redis`, but the one asking.
pub fn redis_clients(redis: &RedisServer) -> Vec<Client> {
    let list: String = redis.query(&["CLIENT", "LIST", "TYPE", "normal"]);
    fn field<T: std::str::FromStr>(line: &str, name: &str) -> Option<T> {
        line.split(' ')
            .find_map(|pair| pair.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
    }
    list.lines()
        .filter(|line| !line.contains("cmd=client|list"))
        .filter_map(|line| {
            Some(Client {
                id: field(line, "id")?,
                resp: field(line, "resp")?,
            })
        })
        .collect()
}

/// Closes every normal connection to each of `nodes` as Redis does to an idle client
/// (`CLIENT KILL TYPE normal`); the newest connection id each node had.
pub fn cut_connections(nodes: &[&RedisServer]) -> Vec<u64> {
    let cut = |node: &&RedisServer| {
        let newest = newest_connection(node).expect("a connection from Tollgate");
        let closed: u64 = node.query(&["CLIENT", "KILL", "TYPE", "normal"]);
        assert!(closed >= 1, "{closed} connections closed");
        newest
    };
    nodes.iter().map(cut).collect()
}

/// Waits until each of `nodes` has a connection newer than its id in `cut`: the
/// connections Tollgate made again.
pub fn await_new_connections(nodes: &[&RedisServer], cut: &[u64], timeout: Duration) {
    for (node, &cut) in nodes.iter().zip(cut) {
        wait::until(
            "a new connection from Tollgate",
            timeout,
            || match newest_connection(node) {
                Some(id) if id > cut => Ok(()),
                newest => Err(format!("newest connection {newest:?}, cut up to {cut}")),
            },
        );
    }
}

fn newest_connection(node: &RedisServer) -> Option<u64> {
    redis_clients(node).iter().map(|c| c.id).max()
}
