//! The Redis store against one real redis-server: limiting, sharing between instances, key
//! layout, round trips, accuracy under overload, cold instances, URL forms and AUTH.
//!
//! Normal-operation tests run Tollgate with `--store-timeout 1s`: they check what the
//! store decides, so a slow answer on a loaded machine must not turn into a local
//! decision. The 10 ms default and the failure modes are the subject of `faults`.

use std::time::{Duration, Instant, SystemTime};

use tollgate_testkit::accuracy::epoch_ns;
use tollgate_testkit::grpc::{Code, Rls, code};
use tollgate_testkit::load::{exactly, in_sequence, round_robin, timed_check};
use tollgate_testkit::redis::{Engine, RedisServer};
use tollgate_testkit::serial;
use tollgate_testkit::shared_store::count_down_then_deny;
use tollgate_testkit::tollgate::{Serve, Server};
use tollgate_testkit::wait::{self, room_in_window};

use crate::support::{
    DOMAIN, HOUR, RULES, USER_LIMIT, YEARLY_LIMIT, assert_accurate_under_overload,
    assert_instances_share_exactly, connected, key, redis_clients, serve, two_connected,
};
use tollgate_testkit::shared_store::assert_refunds_seen_at_once;

const TIMEOUT: &str = "1s";

/// Tollgate on `redis` with the long store timeout, once its store is connected.
async fn single(redis: &RedisServer, extra: &[&str]) -> Server {
    let args = [&["--store-timeout", TIMEOUT], extra].concat();
    connected("single", &redis.url(), &args).await
}

// ---------------------------------------------------------------------------
// The testkit's redis-server
// ---------------------------------------------------------------------------

#[test]
fn redis_server_runs_restarts_freezes_and_counts_commands() {
    let mut redis = RedisServer::start();
    assert_ne!(redis.port(), 6379);
    assert!(redis.ping());

    let before = redis.commandstats();
    let () = redis.query(&["SET", "k", "v"]);
    let () = redis.query(&["SET", "k", "w"]);
    let after = redis.commandstats();
    assert_eq!(after.calls("set"), before.calls("set") + 2, "{after:?}");
    assert_eq!(after.since(&before).get("set"), Some(&2), "{after:?}");
    assert_eq!(redis.keys("*"), ["k"]);

    // A restart keeps the port and loses the data (nothing is persisted).
    let port = redis.port();
    redis.restart();
    assert_eq!(redis.port(), port);
    assert!(redis.ping());
    assert_eq!(redis.dbsize(), 0);

    redis.freeze();
    assert!(!redis.ping(), "a frozen server must not answer");
    redis.thaw();
    assert!(redis.ping());

    redis.stop();
    assert!(!redis.ping());
    redis.launch();
    assert!(redis.ping());
}

// ---------------------------------------------------------------------------
// Limiting
// ---------------------------------------------------------------------------

async fn limits_over_redis_then_denies(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = single(&redis, &[]).await;
    let mut rls = server.client().await;

    count_down_then_deny(&mut rls, DOMAIN, 3).await;
    // Another value is another counter.
    let status = rls.check(DOMAIN, &[("user", "bob")]).await;
    assert_eq!(code(&status), Code::Ok, "{status:?}");

    // The counters live in Redis, not in the instance.
    assert_eq!(
        redis.keys("*"),
        [key("", "user", "ann"), key("", "user", "bob")],
        "one key per counter"
    );
    assert_eq!(server.store_health().await, 200);
}
on_each_engine!(limits_over_redis_then_denies);

async fn two_instances_share_one_counter(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let (_servers, mut clients) =
        two_connected("single", &redis.url(), &["--store-timeout", TIMEOUT]).await;

    assert_instances_share_exactly(&mut clients, DOMAIN).await;

    // Both instances deny from now on.
    for rls in &mut clients {
        let status = rls.check(DOMAIN, &[("user", "shared")]).await;
        assert_eq!(code(&status), Code::OverLimit, "{status:?}");
    }
}
on_each_engine!(two_instances_share_one_counter);

/// An instance started after a counter is full, connected to Redis before its first
/// request: its empty local view sends that request to Redis, which denies it (no
/// over-admission); the answer refreshes the local view, so later denials stay local.
#[tokio::test]
async fn cold_instance_denies_a_full_counter_at_once() {
    let redis = RedisServer::start();
    let (_warm, mut warm_rls) = fill_yearly(&redis, "cold").await;
    let cold = single(&redis, &[]).await;
    let mut cold_rls = cold.client().await;

    let before = redis.commandstats();
    let first = timed_check(&mut cold_rls, DOMAIN, &[("yearly", "cold")]).await;
    let after_first = redis.commandstats();
    assert_eq!(
        first.result,
        Ok(Code::OverLimit),
        "no over-admission: {first:?}"
    );
    assert_eq!(
        after_first.scripts() - before.scripts(),
        1,
        "a cold instance must ask Redis once: {:?}",
        after_first.since(&before)
    );

    let got = in_sequence(&mut cold_rls, DOMAIN, &[("yearly", "cold")], 5).await;
    let after = redis.commandstats();
    assert_eq!(got, exactly(0, 5));
    assert_eq!(
        after.scripts(),
        after_first.scripts(),
        "denials known to the local view must not reach Redis: {:?}",
        after.since(&after_first)
    );
    let status = warm_rls.check(DOMAIN, &[("yearly", "cold")]).await;
    assert_eq!(code(&status), Code::OverLimit, "{status:?}");
}

/// The same, with the first request sent as soon as the instance announces itself — what
/// a load balancer does with a freshly scaled-up instance. Redis is up the whole time, so
/// the instance must not over-admit while its connection is being set up (within the
/// store timeout of 1 s). Five fresh instances, to catch a race.
#[tokio::test]
async fn fresh_instance_denies_a_full_counter_from_its_first_request() {
    let redis = RedisServer::start();
    let _warm = fill_yearly(&redis, "fresh").await;
    for i in 0..5 {
        let fresh = serve("single", &redis.url())
            .args(["--store-timeout", TIMEOUT])
            .start();
        let mut rls = fresh.client().await;
        let first = timed_check(&mut rls, DOMAIN, &[("yearly", "fresh")]).await;
        assert_eq!(
            first.result,
            Ok(Code::OverLimit),
            "instance {i}: first request right after readiness over-admitted: {first:?}; \
             /healthcheck/store now {}",
            fresh.store_health().await
        );
    }
}

/// An instance that has filled `yearly=value` to its limit, and a client of it.
async fn fill_yearly(redis: &RedisServer, value: &str) -> (Server, Rls) {
    let server = single(redis, &[]).await;
    let mut rls = server.client().await;
    let got = in_sequence(&mut rls, DOMAIN, &[("yearly", value)], YEARLY_LIMIT).await;
    assert_eq!(got, exactly(YEARLY_LIMIT, 0));
    (server, rls)
}

// ---------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------

async fn keys_carry_the_prefix_one_value_per_counter_and_a_window_ttl(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = single(&redis, &["--cache-key-prefix", "tg-test:"]).await;
    let mut rls = server.client().await;

    let hour_ends = room_in_window(HOUR, Duration::from_secs(30)).await;
    let sliding = timed_check(&mut rls, DOMAIN, &[("user", "ann")]).await;
    let fixed = timed_check(&mut rls, DOMAIN, &[("fixed", "ann")]).await;
    assert_eq!(sliding.result, Ok(Code::Ok));
    assert_eq!(fixed.result, Ok(Code::Ok));

    let sliding_key = key("tg-test:", "user", "ann");
    let fixed_key = key("tg-test:", "fixed", "ann");
    let mut want = vec![sliding_key.clone(), fixed_key.clone()];
    want.sort();
    assert_eq!(redis.keys("*"), want, "exactly one key per counter");
    assert_eq!(redis.key_type(&sliding_key), "string");
    assert_eq!(redis.key_type(&fixed_key), "string");

    // Expiry as absolute times, bracketed by the client's clock readings.
    let ms = |t: SystemTime| (epoch_ns(t) / 1_000_000) as i64;
    let read_at = SystemTime::now();
    let (sliding_ttl, fixed_ttl) = (redis.pttl(&sliding_key), redis.pttl(&fixed_key));
    let read_done = SystemTime::now();
    assert!(
        sliding_ttl > 0 && fixed_ttl > 0,
        "{sliding_ttl} {fixed_ttl}"
    );

    // Sliding window of 60 s, sub-windows of 6 s: the hit is forgotten between one window
    // and one window plus one sub-window after it was counted.
    let expires = (ms(read_at) + sliding_ttl, ms(read_done) + sliding_ttl);
    let earliest = ms(sliding.sent) + 60_000;
    let latest = ms(sliding.received) + 66_000;
    assert!(
        expires.1 >= earliest && expires.0 <= latest,
        "sliding key expires in [{}, {}] ms after the hit, want [60000, 66000] (PTTL {sliding_ttl})",
        expires.0 - ms(sliding.received),
        expires.1 - ms(sliding.sent),
    );

    // Fixed window of one hour, aligned to the epoch: the key lives until the hour ends.
    let expires = (ms(read_at) + fixed_ttl, ms(read_done) + fixed_ttl);
    let window_end = ms(hour_ends);
    assert!(
        expires.1 >= window_end - 1_000 && expires.0 <= window_end + 1_000,
        "the fixed key expires {} ms from the end of the hour (PTTL {fixed_ttl})",
        expires.0 - window_end
    );
}
on_each_engine!(keys_carry_the_prefix_one_value_per_counter_and_a_window_ttl);

async fn a_value_the_layout_cannot_hold_reads_as_a_fresh_counter(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    // Answers come from the store: a failed script call would be an error.
    let server = single(&redis, &["--on-store-error", "error"]).await;
    let mut rls = server.client().await;

    // A sliding window's 89 bytes, as the layout holds them (newest sub-window, kept sum,
    // eleven sub-windows), the newest sub-window far past now: read as no state, not as a
    // window that denies until then ("ÿ" is 0xc3 0xbf).
    let odd = key("", "user", "odd");
    let ahead = format!("{}\u{7f}", "ÿ".repeat(44));
    assert_eq!(ahead.len(), 89);
    let () = redis.query(&["SET", &odd, &ahead]);
    // A value of another length, and one that is not MessagePack at all ("Ï" is 0xc3 0x8f).
    let short = key("", "user", "short");
    let () = redis.query(&["SET", &short, "not a counter"]);
    let cut = key("", "user", "cut");
    let () = redis.query(&["SET", &cut, "Ï"]);

    for value in ["odd", "short", "cut"] {
        let got = in_sequence(&mut rls, DOMAIN, &[("user", value)], USER_LIMIT + 1).await;
        assert_eq!(got, exactly(USER_LIMIT, 1), "{value}: counted afresh");
    }
    assert!(redis.ping());
}
on_each_engine!(a_value_the_layout_cannot_hold_reads_as_a_fresh_counter);

async fn a_flushed_script_cache_is_loaded_again(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = single(&redis, &[]).await;
    let mut rls = server.client().await;
    let status = rls.check(DOMAIN, &[("user", "flush")]).await;
    assert_eq!(code(&status), Code::Ok, "{status:?}");

    // As after a restart or a failover to a node that never saw the script.
    let () = redis.query(&["SCRIPT", "FLUSH"]);
    let before = redis.commandstats();
    let got = in_sequence(&mut rls, DOMAIN, &[("user", "flush")], USER_LIMIT).await;
    assert_eq!(
        got,
        exactly(USER_LIMIT - 1, 1),
        "counted on across the flush"
    );
    let calls = redis.commandstats().since(&before);
    assert_eq!(calls.get("script|load"), Some(&1), "{calls:?}");
}
on_each_engine!(a_flushed_script_cache_is_loaded_again);

#[tokio::test]
async fn environment_variables_select_redis_and_the_prefix() {
    let redis = RedisServer::start();
    let server = Serve::rules(RULES)
        .env("BACKEND_TYPE", "redis")
        .env("REDIS_TYPE", "single")
        .env("REDIS_URL", redis.host_port())
        .env("CACHE_KEY_PREFIX", "env:")
        .env("STORE_TIMEOUT", TIMEOUT)
        .env("ON_STORE_ERROR", "error")
        .start_connected()
        .await;
    let mut rls = server.client().await;
    let got = in_sequence(&mut rls, DOMAIN, &[("user", "env")], USER_LIMIT + 1).await;
    assert_eq!(got, exactly(USER_LIMIT, 1));
    assert_eq!(redis.keys("*"), [key("env:", "user", "env")]);
}

async fn url_forms_and_auth(engine: Engine) {
    let redis = RedisServer::start_on(engine, engine.name(), &["--requirepass", "secret"]);
    let () = redis.query(&["ACL", "SETUSER", "tg", "on", ">pw", "~*", "+@all"]);
    let refused = ::redis::cmd("PING").query::<String>(&mut redis.connection_as(None));
    assert!(
        refused.is_err(),
        "the server must require a password: {refused:?}"
    );

    // host:port with --redis-auth, and a URL with user and password: one shared counter.
    let by_flag = serve("single", &redis.host_port())
        .args(["--redis-auth", "secret", "--store-timeout", TIMEOUT])
        .start_connected()
        .await;
    let by_url = serve("single", &format!("redis://tg:pw@{}", redis.host_port()))
        .args(["--store-timeout", TIMEOUT])
        .start_connected()
        .await;
    let mut clients = [by_flag.client().await, by_url.client().await];
    let got = round_robin(&mut clients, DOMAIN, &[("user", "auth")], USER_LIMIT + 2).await;
    assert_eq!(got, exactly(USER_LIMIT, 2));
    assert_eq!(by_flag.store_health().await, 200);
    assert_eq!(by_url.store_health().await, 200);

    // A wrong password is a store failure.
    let wrong = serve("single", &redis.url())
        .args(["--redis-auth", "wrong", "--store-timeout", TIMEOUT])
        .args(["--on-store-error", "error"])
        .start_without_store();
    let mut rls = wrong.client().await;
    let answer = timed_check(&mut rls, DOMAIN, &[("user", "wrong")]).await;
    assert_eq!(answer.result, Err(tonic::Code::Unavailable), "{answer:?}");
    assert_eq!(wrong.store_health().await, 503);
}
on_each_engine!(url_forms_and_auth);

// ---------------------------------------------------------------------------
// Round trips
// ---------------------------------------------------------------------------

/// Each admission is one script call; a request the local view knows to be over the limit
/// reaches Redis not at all. Background activity that does not depend on requests (the
/// health probe, a TIME, the overrides' reread, the top-keys snapshot) is tolerated at its
/// rate; everything else must be unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admissions_cost_one_script_call_and_denials_none() {
    let redis = RedisServer::start();
    let server = single(&redis, &[]).await;
    let mut rls = server.client().await;

    // Load the script once, on another counter.
    let warm = timed_check(&mut rls, DOMAIN, &[("yearly", "warm-up")]).await;
    assert_eq!(warm.result, Ok(Code::Ok));

    let s0 = redis.commandstats();
    let got = in_sequence(&mut rls, DOMAIN, &[("yearly", "flood")], YEARLY_LIMIT).await;
    let s1 = redis.commandstats();
    assert_eq!(got, exactly(YEARLY_LIMIT, 0));
    assert_eq!(
        s1.scripts() - s0.scripts(),
        YEARLY_LIMIT as u64,
        "one EVALSHA/EVAL per admission: {:?}",
        s1.since(&s0)
    );

    const DENIALS: usize = 10_000;
    const TASKS: usize = 8;
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..TASKS {
        let mut rls = rls.clone();
        tasks.spawn(async move {
            let mut wrong = Vec::new();
            for _ in 0..DENIALS / TASKS {
                let answer = timed_check(&mut rls, DOMAIN, &[("yearly", "flood")]).await;
                if answer.result != Ok(Code::OverLimit) {
                    wrong.push(answer);
                }
            }
            wrong
        });
    }
    let wrong: Vec<_> = tasks.join_all().await.into_iter().flatten().collect();
    let elapsed = start.elapsed();
    let s2 = redis.commandstats();
    assert!(
        wrong.is_empty(),
        "{} of {DENIALS} answers were not OVER_LIMIT, e.g. {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(5)]
    );

    let changed = s2.since(&s1);
    // The overrides' change log is read every second (one script call, whose commands
    // read the log: HGET, ZRANGEBYSCORE, TIME), whatever the requests.
    let log_reads = s2.scripts() - s1.scripts();
    let allowed_reads = elapsed.as_secs() + 2;
    assert!(
        log_reads <= allowed_reads,
        "{DENIALS} denials made script calls: {log_reads} during {elapsed:?} (one overrides \
         log read a second allows {allowed_reads}): {changed:?}"
    );
    let probes = changed.get("time").copied().unwrap_or(0);
    let allowed_probes = 2 * elapsed.as_secs() + 2 + log_reads;
    assert!(
        probes <= allowed_probes,
        "{probes} TIMEs during {elapsed:?} of denials (background rate allows {allowed_probes})"
    );
    // Each instance publishes its top keys every 5 s, whatever the requests.
    let snapshots = changed.get("publish").copied().unwrap_or(0);
    assert!(
        snapshots <= elapsed.as_secs() / 5 + 1,
        "{snapshots} PUBLISHes during {elapsed:?} of denials (one top-keys snapshot in 5 s)"
    );
    // The connection that asks for these figures names its client library (LIB-NAME,
    // LIB-VER) to a server that knows CLIENT SETINFO: Valkey, Redis 7.2 and later.
    let handshakes = changed.get("client|setinfo").copied().unwrap_or(0);
    assert!(
        handshakes <= 2,
        "{handshakes} CLIENT SETINFOs: a new connection"
    );
    let others: Vec<_> = changed
        .iter()
        .filter(|(name, _)| {
            ![
                "info",
                "time",
                "evalsha",
                "hget",
                "zrangebyscore",
                "publish",
                "client|setinfo",
            ]
            .contains(&name.as_str())
        })
        .collect();
    assert!(
        others.is_empty(),
        "commands reached Redis during {DENIALS} locally known denials: {others:?}"
    );
    eprintln!("{DENIALS} denials in {elapsed:?}; Redis commands meanwhile: {changed:?}");
}

// ---------------------------------------------------------------------------
// Accuracy
// ---------------------------------------------------------------------------

/// Three instances on one Redis, a 3× overload spread round-robin over them at a steady
/// pace for three windows of 2 s (limit 200, sub-windows of 200 ms); see
/// [`assert_accurate_under_overload`] for what must hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_stay_accurate_under_steady_overload() {
    let _timing = serial::timing().await;
    let redis = RedisServer::start();
    let mut servers = Vec::new();
    for _ in 0..3 {
        servers.push(single(&redis, &["--on-store-error", "error"]).await);
    }
    assert_accurate_under_overload(&servers, "steady").await;
    assert!(
        redis.exists(&key("", "acc", "steady")),
        "the counter is in Redis"
    );
}

// ---------------------------------------------------------------------------
// Background reads
// ---------------------------------------------------------------------------

/// A counter an instance denies locally is read again once its sub-window has closed,
/// off the request path, so that the instance learns the other instances' hits.
#[tokio::test]
async fn locally_denied_counters_are_read_again_in_the_background() {
    const FAST: &str = "domain: rl\ndescriptors:\n  - {key: fast, rate_limit: {unit: second, unit_multiplier: 2, requests_per_unit: 3}}\n";
    let redis = RedisServer::start();
    let start = || {
        Serve::rules(FAST)
            .redis("single", &redis.url())
            .args(["--store-timeout", TIMEOUT])
            .start_connected()
    };
    let (a, b) = (start().await, start().await);
    let (mut ra, mut rb) = (a.client().await, b.client().await);
    // Hits count in full for a window less a sub-window (1.8 s): the sequence must be faster.
    let started = Instant::now();
    assert_eq!(code(&ra.check("rl", &[("fast", "x")]).await), Code::Ok);
    assert_eq!(code(&ra.check("rl", &[("fast", "x")]).await), Code::Ok);
    assert_eq!(code(&rb.check("rl", &[("fast", "x")]).await), Code::Ok);
    // A believes one unit is left; Redis says no and A's view learns B's hit.
    assert_eq!(
        code(&ra.check("rl", &[("fast", "x")]).await),
        Code::OverLimit
    );
    let trips = counter(&a, "tollgate_store_round_trips_total").await;
    // Now A knows: this denial is local, and queues a background read.
    assert_eq!(
        code(&ra.check("rl", &[("fast", "x")]).await),
        Code::OverLimit
    );
    assert!(
        started.elapsed() < Duration::from_millis(1_800),
        "the sequence took {:?}; the first hits may have aged out",
        started.elapsed()
    );
    assert_eq!(counter(&a, "tollgate_local_denials_total").await, 1.0);
    wait::until_async(
        "a background read",
        Duration::from_secs(10),
        async || match counter(&a, "tollgate_store_refreshes_total").await {
            0.0 => Err("no refresh yet".to_owned()),
            n => Ok(n),
        },
    )
    .await;
    assert_eq!(
        counter(&a, "tollgate_store_round_trips_total").await,
        trips,
        "the background read is not a request's round trip"
    );
}

/// A counter of `server`'s `/metrics`.
async fn counter(server: &Server, name: &str) -> f64 {
    server
        .metric(name)
        .await
        .unwrap_or_else(|| panic!("no {name} in /metrics"))
}

// ---------------------------------------------------------------------------
// All-or-nothing counting across keys
// ---------------------------------------------------------------------------

/// With STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT, a request over its limit on one
/// descriptor leaves its other descriptors' counters (other Redis keys) as they were: what
/// they counted is given back.
async fn a_request_over_on_one_descriptor_counts_nothing_on_the_others(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    let server = single(&redis, &["--stop-cache-key-increment-when-overlimit"]).await;
    let mut rls = server.client().await;
    // Fill yearly=full (5 a year).
    for _ in 0..YEARLY_LIMIT {
        let status = rls.check(DOMAIN, &[("yearly", "full")]).await;
        assert_eq!(code(&status), Code::Ok);
    }
    // Ten requests for [user=ann, yearly=full]: each is over on yearly, and user=ann (5 a
    // minute) would have been exhausted by the first five of them.
    let both =
        tollgate_testkit::grpc::request(DOMAIN, &[&[("user", "ann")], &[("yearly", "full")]]);
    for _ in 0..10 {
        let resp = rls.ok(both.clone()).await;
        assert_eq!(tollgate_testkit::grpc::overall(&resp), Code::OverLimit);
        assert_eq!(code(&resp.statuses[0]), Code::Ok);
    }
    let got = in_sequence(&mut rls, DOMAIN, &[("user", "ann")], USER_LIMIT + 1).await;
    assert_eq!(got, exactly(USER_LIMIT, 1), "user=ann was never charged");
}
on_each_engine!(a_request_over_on_one_descriptor_counts_nothing_on_the_others);

/// A refund through one instance is seen by the other before its next request, with and
/// without leases, on the default sliding window and on fixed windows: a settled budget
/// gets no false 429 anywhere.
async fn a_refund_on_one_instance_is_seen_by_the_other_at_once(engine: Engine) {
    let redis = RedisServer::start_engine(engine);
    for (i, (leases, algorithm)) in [("false", "fixed_window"), ("true", "sliding_window")]
        .into_iter()
        .enumerate()
    {
        let start = || {
            serve("single", &redis.url())
                .args(["--store-timeout", TIMEOUT])
                .env("LEASES", leases)
                .env("DEFAULT_ALGORITHM", algorithm)
                .start_connected()
        };
        let (a, b) = (start().await, start().await);
        let mut clients = vec![a.client().await, b.client().await];
        assert_refunds_seen_at_once(&mut clients, DOMAIN, &format!("budget-{i}")).await;
    }
}
on_each_engine!(a_refund_on_one_instance_is_seen_by_the_other_at_once);

/// Tollgate speaks RESP3 to a node that does (it learns at once of a connection Redis
/// closed) and RESP2 to one that refuses `HELLO` (an old Redis, a proxy), counting the
/// same on both.
async fn resp3_where_the_node_speaks_it_resp2_where_it_refuses_hello(engine: Engine) {
    for (extra, resp) in [(&[][..], 3), (&["--rename-command", "HELLO", ""][..], 2)] {
        let redis = RedisServer::start_on(engine, engine.name(), extra);
        let (servers, mut clients) =
            two_connected("single", &redis.url(), &["--store-timeout", TIMEOUT]).await;
        assert_instances_share_exactly(&mut clients, DOMAIN).await;
        let spoken: Vec<u8> = redis_clients(&redis).iter().map(|c| c.resp).collect();
        assert_eq!(spoken, [resp; 2], "{extra:?}");
        drop(servers);
    }
}
on_each_engine!(resp3_where_the_node_speaks_it_resp2_where_it_refuses_hello);
