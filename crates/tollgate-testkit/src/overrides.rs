//! The scenario every shared store must pass with runtime overrides: set through one
//! instance, enforced by another within about a second, kept across a restart of both,
//! and deleted through one to give the rule back on the other; and a change refused
//! while the store is down.

use std::time::Duration;

use crate::admin::{self, TOKEN, override_body};
use crate::grpc::{Code, code};
use crate::http::Method;
use crate::tollgate::{Listening, Server};
use crate::wait;

/// How long an instance may take to apply another's change: a second promised, with
/// room for a loaded machine.
const SPREAD: Duration = Duration::from_secs(3);

/// With `start` starting one instance on a fresh shared store whose `domain` limits
/// `key` to `rule_limit` a minute: an override of `key=value` set on one is listed and
/// enforced on the other, survives a restart of both, and its delete restores the rule.
pub async fn assert_overrides_spread(
    start: impl AsyncFn() -> Server,
    domain: &str,
    (key, value): (&str, &str),
    rule_limit: u32,
) {
    let limit = rule_limit + 2;
    let (a, b) = (start().await, start().await);
    let body = override_body(domain, (key, value), &limit.to_string(), "minute");
    let set = admin::overrides(&a, Method::PUT, "/overrides", &body, Some(TOKEN)).await;
    assert_eq!(set.status, 200, "{set:?}");
    let took = await_listed(&b, value, true).await;
    eprintln!("the override reached the other instance in {took:?}");
    let mut on_b = b.client().await;
    for _ in 0..limit {
        let status = on_b.check(domain, &[(key, value)]).await;
        assert_eq!(code(&status), Code::Ok, "{status:?}");
        assert_eq!(
            status.current_limit.as_ref().map(|l| l.requests_per_unit),
            Some(limit)
        );
    }
    assert_eq!(
        code(&on_b.check(domain, &[(key, value)]).await),
        Code::OverLimit
    );

    drop((a.stop(), b.stop()));
    let (a, b) = (start().await, start().await);
    for (name, instance) in [("a", &a), ("b", &b)] {
        let status = instance.client().await.check(domain, &[(key, value)]).await;
        assert_eq!(
            status.current_limit.as_ref().map(|l| l.requests_per_unit),
            Some(limit),
            "{name} applies the stored override at start: {status:?}"
        );
    }

    let descriptor =
        format!(r#"{{"domain":"{domain}","entries":[{{"key":"{key}","value":"{value}"}}]}}"#);
    let deleted =
        admin::overrides(&b, Method::DELETE, "/overrides", &descriptor, Some(TOKEN)).await;
    assert_eq!(deleted.status, 200, "{deleted:?}");
    await_listed(&a, value, false).await;
    let status = a.client().await.check(domain, &[(key, value)]).await;
    assert_eq!(
        status.current_limit.as_ref().map(|l| l.requests_per_unit),
        Some(rule_limit),
        "the rule again: {status:?}"
    );
}

/// With `server`'s store down (and `server` knowing it: a change sent as the store went
/// down may have been made, and is answered 504), a `PUT /overrides` on `domain` is a
/// 503 with a reason, and nothing is set.
pub async fn assert_refused_while_the_store_is_down(server: &Listening, domain: &str) {
    wait::until_async(
        "the store known to be down",
        SPREAD * 10,
        async || match server.store_health().await {
            503 => Ok(()),
            other => Err(format!("/healthcheck/store answers {other}")),
        },
    )
    .await;
    let body = override_body(domain, ("user", "ann"), "9", "minute");
    let set = admin::overrides(server, Method::PUT, "/overrides", &body, Some(TOKEN)).await;
    assert_eq!(set.status, 503, "{set:?}");
    assert!(
        set.body
            .starts_with("cannot keep the overrides: counter store"),
        "{set:?}"
    );
    let listed = admin::overrides(server, Method::GET, "/overrides", "", Some(TOKEN)).await;
    assert!(listed.body.contains(r#""overrides":[]"#), "{listed:?}");
}

/// Waits until `server` lists an override of `value` (or none, when not `listed`); how
/// long that took.
pub async fn await_listed(server: &Listening, value: &str, listed: bool) -> Duration {
    let what = format!("an override of {value} listed: {listed}");
    let ((), took) = wait::until_async(&what, SPREAD, async || {
        let list = admin::overrides(server, Method::GET, "/overrides", "", Some(TOKEN)).await;
        match list.status == 200 && list.body.contains(&format!(r#""{value}""#)) == listed {
            true => Ok(()),
            false => Err(format!("{list:?}")),
        }
    })
    .await;
    took
}

/// Unix seconds now, for `expires_at`.
pub fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("a clock after 1970")
        .as_secs()
}

/// With `server` allowing one override (`OVERRIDES_MAX=1`): an override of `key=a`
/// expiring in two seconds holds the one place (`key=b` is refused); once it has expired
/// it is listed no more, the gauge no longer counts it, and `key=b` takes its place.
pub async fn assert_an_expired_override_frees_its_place(
    server: &Listening,
    domain: &str,
    key: &str,
) {
    let expiring = override_body(domain, (key, "a"), "9", "minute").replace(
        r#""limit""#,
        &format!(r#""expires_at":{},"limit""#, now_seconds() + 2),
    );
    let set = admin::overrides(server, Method::PUT, "/overrides", &expiring, Some(TOKEN)).await;
    assert_eq!(set.status, 200, "{set:?}");
    let other = override_body(domain, (key, "b"), "9", "minute");
    let full = admin::overrides(server, Method::PUT, "/overrides", &other, Some(TOKEN)).await;
    assert_eq!(full.status, 400, "the place is taken: {full:?}");
    await_listed(server, "a", false).await;
    wait::until_async("the gauge counts no expired override", SPREAD, async || {
        let metrics = crate::http::get(server.http_addr(), "/metrics").await;
        match metrics.body.contains("tollgate_overrides 0\n") {
            true => Ok(()),
            false => Err(metrics.body),
        }
    })
    .await;
    let freed = admin::overrides(server, Method::PUT, "/overrides", &other, Some(TOKEN)).await;
    assert_eq!(
        freed.status, 200,
        "the expired one's place is free: {freed:?}"
    );
}

/// Rounds in [`assert_the_maximum_holds_under_races`].
const RACE_ROUNDS: usize = 10;

/// `a` and `b` share one store and allow five overrides (`OVERRIDES_MAX=5`). With four
/// of `key` stored, a new one is sent to each at once: exactly one is set and the other
/// refused with 400, and both instances list the five; the one set is deleted through
/// both at once (one 200, one 404) and the next round races again.
pub async fn assert_the_maximum_holds_under_races(
    a: &Listening,
    b: &Listening,
    domain: &str,
    key: &str,
) {
    for i in 0..4 {
        let body = override_body(domain, (key, &format!("kept{i}")), "9", "minute");
        let set = admin::overrides(a, Method::PUT, "/overrides", &body, Some(TOKEN)).await;
        assert_eq!(set.status, 200, "{set:?}");
    }
    for round in 0..RACE_ROUNDS {
        let (on_a, on_b) = (format!("a{round}"), format!("b{round}"));
        let (body_a, body_b) = (
            override_body(domain, (key, &on_a), "9", "minute"),
            override_body(domain, (key, &on_b), "9", "minute"),
        );
        let (put_a, put_b) = tokio::join!(
            admin::overrides(a, Method::PUT, "/overrides", &body_a, Some(TOKEN)),
            admin::overrides(b, Method::PUT, "/overrides", &body_b, Some(TOKEN)),
        );
        let statuses = (put_a.status, put_b.status);
        let winner = match statuses {
            (200, 400) => on_a,
            (400, 200) => on_b,
            _ => panic!("round {round}: one of two set, not {statuses:?}: {put_a:?} {put_b:?}"),
        };
        let refused = if statuses.0 == 400 { &put_a } else { &put_b };
        assert!(refused.body.contains("at most 5"), "{refused:?}");
        for server in [a, b] {
            await_listed(server, &winner, true).await;
            let list = admin::overrides(server, Method::GET, "/overrides", "", Some(TOKEN)).await;
            let listed: serde_json::Value = serde_json::from_str(&list.body).expect("JSON");
            let count = listed["overrides"].as_array().map_or(0, Vec::len);
            assert_eq!(count, 5, "round {round}: {listed}");
        }
        let descriptor =
            format!(r#"{{"domain":"{domain}","entries":[{{"key":"{key}","value":"{winner}"}}]}}"#);
        let (on_a, on_b) = tokio::join!(
            admin::overrides(a, Method::DELETE, "/overrides", &descriptor, Some(TOKEN)),
            admin::overrides(b, Method::DELETE, "/overrides", &descriptor, Some(TOKEN)),
        );
        let mut statuses = [on_a.status, on_b.status];
        statuses.sort_unstable();
        assert_eq!(
            statuses,
            [200, 404],
            "round {round}: one delete: {on_a:?} {on_b:?}"
        );
        await_listed(a, &winner, false).await;
        await_listed(b, &winner, false).await;
    }
}
