//! Announcements forged by whoever can publish on a shared store's channel (Redis
//! `PUBLISH`, PostgreSQL `NOTIFY`), and what Tollgate must make of them: nothing past what
//! an instance could have meant. The Redis and PostgreSQL suites run these checks, each
//! publishing its own way.

use std::time::Duration;

use serde_json::Value;

use crate::keys::{Shape, counter_key};
use crate::process::blocking;
use crate::shared_store::{YEARLY_LIMIT, admitted};
use crate::tollgate::Server;
use crate::wait::until_async;

/// The channel of a deployment with no `CACHE_KEY_PREFIX`, on Redis.
pub const REDIS_CHANNEL: &str = "tollgate-reset";
/// The same on PostgreSQL.
pub const POSTGRES_CHANNEL: &str = "tollgate_reset";
/// How long an announcement may take to be heard, and a fleet view to show it.
const HEARD: Duration = Duration::from_secs(10);
/// The year of the `yearly` rule, as its counter key names it.
const YEAR: Duration = Duration::from_secs(365 * 86_400);

/// `tollgate_store_announcements_ignored_total{reason="REASON"}` of `server`.
pub async fn ignored(server: &Server, reason: &str) -> Option<f64> {
    let series = format!("tollgate_store_announcements_ignored_total{{reason=\"{reason}\"}}");
    server.metric(&series).await
}

/// Publishes `text` through `publish` and waits until `server` heard it.
async fn publish_heard(server: &Server, publish: &dyn Fn(&str), text: &str) {
    const HEARD_TOTAL: &str = "tollgate_store_announcements_heard_total";
    let before = server.metric(HEARD_TOTAL).await.unwrap_or(0.0);
    blocking(|| publish(text));
    until_async("the announcement heard", HEARD, async || {
        match server.metric(HEARD_TOTAL).await {
            Some(n) if n > before => Ok(()),
            other => Err(format!("heard {other:?}, {before} before")),
        }
    })
    .await;
}

/// A decrease of a `yearly` counter of `domain` announced with the stamp 2^64 − 1 µs
/// (`MICROS#KEY`) is ignored and counted. Believed, it kept every answer for the counter
/// from being adopted, so with the store then stopped (`stop_store`), the instance's
/// empty view admitted the limit a second time.
pub async fn a_decrease_stamped_far_ahead_is_ignored(
    server: &Server,
    domain: &str,
    publish: &dyn Fn(&str),
    stop_store: &mut dyn FnMut(),
) {
    let value = "forged-stamp";
    let key = counter_key(domain, &[("yearly", value)], &[Shape::sliding(YEAR)]);
    publish_heard(server, publish, &format!("{}#{key}", u64::MAX)).await;
    let mut rls = server.client().await;
    let entry = ("yearly", value);
    assert_eq!(
        admitted(&mut rls, domain, entry, YEARLY_LIMIT + 2).await,
        YEARLY_LIMIT,
        "the store admits the limit"
    );
    blocking(stop_store);
    server.await_store_health(503, HEARD).await;
    assert_eq!(
        admitted(&mut rls, domain, entry, YEARLY_LIMIT).await,
        0,
        "with the store stopped, the view still holds the limit reached"
    );
    assert_eq!(ignored(server, "stamp").await, Some(1.0));
}

/// A top-keys snapshot of instance `instance` with `lines` (tab-separated, as instances
/// publish them).
pub fn top_snapshot(instance: &str, lines: &[String]) -> String {
    let mut text = format!("%top|{instance}");
    for line in lines {
        text.push('\n');
        text.push_str(line);
    }
    text
}

/// A plausible entry of `domain`'s `yearly` rule for the descriptor `yearly=VALUE`.
fn entry(domain: &str, value: &str, count: u64) -> String {
    format!("h\tm\t{domain}\tyearly\tyearly={value}\t{count}\t0")
}

/// A snapshot of a plausible entry (`yearly=oversized`) padded to a megabyte: no
/// instance sends one past 7,800 bytes.
pub fn oversized_by_size(domain: &str) -> String {
    let padding = format!("x{}", "y".repeat(1 << 20));
    top_snapshot("f1", &[entry(domain, "oversized", 3), padding])
}

/// A snapshot of a plausible entry (`yearly=oversized`) and 400 more lines, under 8,000
/// bytes: no instance sends more than 400 entries.
pub fn oversized_by_lines(domain: &str) -> String {
    let mut lines = vec![entry(domain, "oversized", 3)];
    lines.extend((0..400).map(|_| "x".to_owned()));
    top_snapshot("f1", &lines)
}

/// `(domain, descriptor, count)` of `/top?QUERY&scope=fleet` on `server`.
async fn fleet_top(server: &Server, query: &str) -> Result<Vec<(String, String, u64)>, String> {
    let answer = server.get(&format!("/top?{query}&scope=fleet")).await;
    if answer.status != 200 {
        return Err(format!("{answer:?}"));
    }
    let top: Value = serde_json::from_str(&answer.body).map_err(|e| e.to_string())?;
    let entries = top["entries"].as_array().cloned().unwrap_or_default();
    let text = |e: &Value, field: &str| e[field].as_str().unwrap_or("").to_owned();
    Ok(entries
        .iter()
        .map(|e| {
            let count = e["count"].as_u64().unwrap_or(0);
            (text(e, "domain"), text(e, "descriptor"), count)
        })
        .collect())
}

/// Forged top-keys snapshots show in `/top?scope=fleet` only as far as an instance could
/// have meant them. `oversized` (past what an instance sends: [`oversized_by_size`],
/// [`oversized_by_lines`]) is dropped whole. Of a snapshot of three entries, the one of a
/// rule `server` serves with a plausible count shows; a count of 2^64 − 1 and a domain no
/// rule has do not. What is dropped is counted.
pub async fn forged_top_keys_are_not_believed(
    server: &Server,
    domain: &str,
    publish: &dyn Fn(&str),
    oversized: &[String],
) {
    let forged = top_snapshot(
        "f0",
        &[
            entry(domain, "plausible", 7),
            entry(domain, "forged", u64::MAX),
            entry("nosuch", "nosuch", 9),
        ],
    );
    // Heard in the order published: once the second shows, the first was heard.
    for text in oversized {
        blocking(|| publish(text));
    }
    blocking(|| publish(&forged));
    let query = "by=hits&window=minute&n=100";
    let plausible = (domain.to_owned(), "yearly=plausible".to_owned(), 7);
    let (top, _) =
        until_async(
            "the forged snapshot in the fleet view",
            HEARD,
            async || match fleet_top(server, query).await? {
                top if top.contains(&plausible) => Ok(top),
                top => Err(format!("fleet view: {top:?}")),
            },
        )
        .await;
    let believed: Vec<_> = top
        .iter()
        .filter(|(d, descriptor, _)| {
            d == "nosuch" || ["yearly=forged", "yearly=oversized"].contains(&descriptor.as_str())
        })
        .collect();
    assert!(believed.is_empty(), "forged entries shown: {believed:?}");
    let dropped = Some(oversized.len() as f64);
    assert_eq!(ignored(server, "top_oversized").await, dropped);
    assert_eq!(ignored(server, "top_count").await, Some(1.0));
}
