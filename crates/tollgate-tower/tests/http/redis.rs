//! Two replicas of a service, each with its own limiter on `RedisStore::new(url)`, share
//! their limits through one real redis-server; a URL that is not Redis's is an error.

use std::net::SocketAddr;
use std::sync::Arc;

use tollgate_testkit::http;
use tollgate_testkit::redis::RedisServer;
use tollgate_tower::core::{Descriptor, Limiter, OnStoreError, Rules};
use tollgate_tower::{RateLimitLayer, RedisStore, extract};

use crate::{ok_app, serve};

/// A service replica limited per API key through the Redis at `url`.
async fn replica(url: &str) -> SocketAddr {
    let rules = Rules::from_yaml(
        "replica.yaml",
        "domain: svc\ndescriptors:\n  - key: x-api-key\n    rate_limit: {unit: minute, requests_per_unit: 5}\n",
    )
    .expect("valid rules");
    let store = RedisStore::new(url)
        .key_prefix("tower:")
        .on_error(OnStoreError::Error)
        .connect()
        .await
        .expect("a Redis URL");
    let limiter = Arc::new(Limiter::new(rules, store));
    let layer = RateLimitLayer::new(limiter, "svc", |req| {
        Ok(extract::header(req, "x-api-key")
            .map(|key| vec![Descriptor::from(vec![key])])
            .unwrap_or_default())
    })
    .deny_on_error(true);
    serve(ok_app().layer(layer)).await
}

#[tokio::test]
async fn replicas_share_their_limits_through_redis() {
    let redis = RedisServer::start();
    let replicas = [replica(&redis.url()).await, replica(&redis.url()).await];
    let mut statuses = Vec::new();
    for i in 0..8 {
        let response = http::get_with(replicas[i % 2], "/", &[("x-api-key", "k1")]).await;
        statuses.push(response.status);
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    // Counted in Redis under the prefix.
    let keys: Vec<String> = redis.query(&["KEYS", "tower:*"]);
    assert_eq!(keys.len(), 1, "{keys:?}");
    // Another key has its own limit, on either replica.
    let other = http::get_with(replicas[1], "/", &[("x-api-key", "k2")]).await;
    assert_eq!(other.status, 200);
    // Requests that name no key are not limited at all.
    assert_eq!(http::get(replicas[0], "/").await.status, 200);
}

#[tokio::test]
async fn a_url_that_is_not_redis_is_an_error() {
    let refused = RedisStore::new("http://cache.example:6379").connect().await;
    let why = refused.expect_err("not a Redis URL").to_string();
    assert!(why.contains("http://cache.example:6379"), "{why}");
}
