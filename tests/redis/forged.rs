//! Announcements forged with `PUBLISH` on the channel of the instances sharing a Redis:
//! nothing is believed past what an instance could have meant
//! ([`tollgate_testkit::forged`]).

use tollgate_testkit::forged::{
    REDIS_CHANNEL, a_decrease_stamped_far_ahead_is_ignored, forged_top_keys_are_not_believed,
    oversized_by_lines, oversized_by_size,
};
use tollgate_testkit::redis::{Engine, RedisServer};

use crate::support::{DOMAIN, connected};

/// `PUBLISH` on the instances' channel of the Redis at `url`, on a connection of its own.
fn publisher(url: String) -> impl Fn(&str) {
    move |text| {
        let mut conn = redis::Client::open(url.as_str())
            .and_then(|client| client.get_connection())
            .expect("connect to Redis");
        let published: redis::RedisResult<i64> = redis::cmd("PUBLISH")
            .arg(REDIS_CHANNEL)
            .arg(text)
            .query(&mut conn);
        assert!(published.is_ok(), "PUBLISH: {published:?}");
    }
}

async fn a_decrease_stamped_far_ahead_of_redis_is_ignored(engine: Engine) {
    let mut redis = RedisServer::start_engine(engine);
    let server = connected("single", &redis.url(), &["--store-timeout", "1s"]).await;
    let publish = publisher(redis.url());
    a_decrease_stamped_far_ahead_is_ignored(&server, DOMAIN, &publish, &mut || redis.stop()).await;
}
on_each_engine!(
    a_decrease_stamped_far_ahead_of_redis_is_ignored,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_top_keys_on_redis_are_not_believed() {
    let redis = RedisServer::start();
    let server = connected("single", &redis.url(), &[]).await;
    let oversized = [oversized_by_size(DOMAIN), oversized_by_lines(DOMAIN)];
    forged_top_keys_are_not_believed(&server, DOMAIN, &publisher(redis.url()), &oversized).await;
}
