//! A rolling migration: a reference instance and a Tollgate with `REFERENCE_MODE=true` on
//! one redis-server, with load round-robin over both on the same keys. In reference mode
//! Tollgate counts in the reference's keys with its commands, so the two share every
//! counter: together they admit no more than the limit in any fixed window, as one
//! reference does (never twice the limit, as two fleets counting apart would).

use std::time::Duration;

use tollgate_testkit::accuracy::steady_overload;
use tollgate_testkit::grpc::{Code, Rls, request};
use tollgate_testkit::load::burst;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::reference::{self, Reference, RuntimeRoot, plain_env};
use tollgate_testkit::tollgate::Server;
use tollgate_testkit::{serial, wait};

use crate::support::{reference_mode_note, tollgate_with_env, vars, work_dir};

const RULES: &str = "\
domain: fleet
descriptors:
  - key: per_second
    rate_limit: {unit: second, requests_per_unit: 50}
  - key: per_minute
    rate_limit: {unit: minute, requests_per_unit: 300}
";

/// The fleet: both servers, kept running, and a client of each.
struct Fleet {
    clients: Vec<Rls>,
    _servers: (Reference, Server, RuntimeRoot, RedisServer),
    _alone: tokio::sync::MutexGuard<'static, ()>,
}

async fn fleet(test: &str) -> Option<Fleet> {
    let installed = reference::or_skip(test)?;
    // The load is timed; the suite's other timed tests wait.
    let alone = serial::timing().await;
    let redis = RedisServer::start();
    let root = RuntimeRoot::new_in(&work_dir("mixed_fleet"));
    root.write("fleet.yaml", RULES);
    let mut env = plain_env(&redis.host_port(), &root);
    let reference = Reference::start(installed, &env).await;
    env.extend(vars(&[("REFERENCE_MODE", "true")]));
    let tollgate = tollgate_with_env(&env).start_connected().await;
    Some(Fleet {
        clients: vec![reference.client().await, tollgate.client().await],
        _servers: (reference, tollgate, root, redis),
        _alone: alone,
    })
}

/// 50 a second, a steady 3× overload for three epoch-aligned seconds, every other request
/// to each server: each second admits at most 50.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_second_limits_are_shared() {
    let Some(fleet) = fleet("mixed_fleet::per_second_limits_are_shared").await else {
        return;
    };
    let run = steady_overload(
        &fleet.clients,
        "fleet",
        &[("per_second", "tenant")],
        50,
        Duration::from_secs(1),
        3,
        3,
    )
    .await;
    let summary = run.summary(Duration::from_millis(100));
    let failures = run.failures();
    assert!(
        failures.is_empty(),
        "{} answers were not OK or OVER_LIMIT, e.g. {:?}; {summary}{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        reference_mode_note()
    );
    for (w, count) in run.per_window().iter().enumerate() {
        assert!(
            count.certain <= 50,
            "second {w} admitted {} > 50 across the reference and Tollgate; {summary}{}",
            count.certain,
            reference_mode_note()
        );
    }
}

/// 300 a minute, 900 requests at once through both servers within one minute: 300
/// admitted in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_minute_limits_are_shared() {
    let Some(fleet) = fleet("mixed_fleet::per_minute_limits_are_shared").await else {
        return;
    };
    let req = request("fleet", &[&[("per_minute", "tenant")]]);
    let end = wait::room_in_window(Duration::from_secs(60), Duration::from_secs(10)).await;
    let answers = burst(&fleet.clients, 900, &req).await;
    assert!(
        answers.iter().all(|a| a.received < end),
        "the burst outlasted its minute"
    );
    let failed: Vec<_> = answers
        .iter()
        .filter(|a| !matches!(a.result, Ok(Code::Ok | Code::OverLimit)))
        .collect();
    assert!(
        failed.is_empty(),
        "{} answers neither OK nor OVER_LIMIT, e.g. {:?}{}",
        failed.len(),
        &failed[..failed.len().min(5)],
        reference_mode_note()
    );
    let admitted = answers.iter().filter(|a| a.result == Ok(Code::Ok)).count();
    assert!(
        admitted <= 300,
        "{admitted} of 900 admitted in one minute across the reference and Tollgate, for a \
         limit of 300{}",
        reference_mode_note()
    );
}
