//! The fleet's top keys: two instances on one Redis each publish their heaviest keys
//! through it, and `/top?scope=fleet` on either names a key whose traffic was split
//! between them with the summed count.

use std::time::Duration;

use serde_json::Value;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::tollgate::Server;
use tollgate_testkit::wait::until_async;

use crate::support::{DOMAIN, two_connected};

/// Publishing runs every 5 s; two periods and the time to start are plenty.
const FLEET_DEADLINE: Duration = Duration::from_secs(30);

/// `(descriptor, count)` of `/top`'s entries for `query`.
async fn top(server: &Server, query: &str) -> Result<Vec<(String, u64)>, String> {
    let answer = server.get(&format!("/top?{query}")).await;
    if answer.status != 200 {
        return Err(format!("{answer:?}"));
    }
    let top: Value = serde_json::from_str(&answer.body).map_err(|e| e.to_string())?;
    let entries = top["entries"].as_array().cloned().unwrap_or_default();
    Ok(entries
        .iter()
        .map(|e| {
            let descriptor = e["descriptor"].as_str().unwrap_or("").to_owned();
            (descriptor, e["count"].as_u64().unwrap_or(0))
        })
        .collect())
}

#[tokio::test]
async fn the_fleet_view_sums_a_key_split_between_two_instances() {
    let redis = RedisServer::start();
    let (servers, mut clients) = two_connected("single", &redis.url(), &[]).await;
    for (rls, times) in clients.iter_mut().zip([3, 4]) {
        for _ in 0..times {
            rls.check(DOMAIN, &[("user", "split")]).await;
        }
    }
    let query = format!("domain={DOMAIN}&by=hits&n=1");
    for (server, alone) in servers.iter().zip([3, 4]) {
        let instance = top(server, &query).await.expect("/top answers");
        assert_eq!(instance, [("user=split".to_owned(), alone)]);
        let fleet_query = format!("{query}&scope=fleet");
        until_async(
            "the fleet view sums both instances",
            FLEET_DEADLINE,
            async || match top(server, &fleet_query).await? {
                fleet if fleet == [("user=split".to_owned(), 7)] => Ok(()),
                other => Err(format!("fleet view: {other:?}")),
            },
        )
        .await;
    }
}
