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

/// With `server`'s store down, a `PUT /overrides` on `domain` is a 503 with a reason, and
/// nothing is set.
pub async fn assert_refused_while_the_store_is_down(server: &Listening, domain: &str) {
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
