//! Leases against one real redis-server (the testkit's [`leases`] run): two leasing
//! Tollgates call Redis far less often than they admit, never admit past the limit when
//! pushed into overload, and give what they hold back when they drain. Redis counts the
//! script calls itself.

use tollgate_testkit::leases::{self, Store};
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::serial;
use tollgate_testkit::tollgate::Serve;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leasing_instances_call_redis_rarely_and_never_admit_past_the_limit() {
    let _timing = serial::timing().await;
    let redis = RedisServer::start();
    let serve = |rules: &str| Serve::rules(rules).redis("single", &redis.url());
    let calls = || redis.commandstats().scripts();
    leases::call_rarely_and_never_admit_past_the_limit(Store {
        serve: &serve,
        calls: &calls,
    })
    .await;
}
