//! Several instances on one real store, each a `SharedStore` of its own in this process:
//! what one instance does to a counter, the others must see.

mod exactness;
mod model;
mod settling;

use std::sync::Arc;
use std::time::Duration;

use tollgate_testkit::postgres::PostgresServer;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::redis::cluster::RedisCluster;
use tollgate_testkit::wait::until_async;

use super::lease::LeasePolicy;
use super::{SharedBehaviour, SharedStore};
use crate::algo::Hits;
use crate::clock::SystemClock;
use crate::limit::{Algorithm, Limit};
use crate::store::postgres::{PgConfig, PgTarget};
use crate::store::redis::{RedisConfig, RedisTarget, RedisTls};
use crate::store::{Capacity, OnStoreError};
use crate::unit::Unit;

/// The store every instance of a test shares.
enum Shared<'a> {
    Redis(&'a RedisServer),
    Cluster(&'a RedisCluster),
    Postgres(&'a PostgresServer),
}

impl Shared<'_> {
    /// Where an instance connects to reach the store directly.
    fn url(&self) -> String {
        match self {
            Self::Redis(redis) => redis.url(),
            Self::Cluster(cluster) => cluster.url(),
            Self::Postgres(pg) => pg.url(),
        }
    }
}

fn behaviour(leases: bool, timeout: Duration) -> SharedBehaviour {
    SharedBehaviour {
        timeout,
        on_error: OnStoreError::Local,
        local_capacity: Capacity::default(),
        leases: LeasePolicy {
            enabled: leases,
            ..LeasePolicy::default()
        },
    }
}

/// One instance on `shared`, reached at `url` (the store's own, or a proxy's), once up.
async fn connect(shared: &Shared<'_>, url: &str, behaviour: SharedBehaviour) -> Arc<SharedStore> {
    let clock = Arc::new(SystemClock);
    let store = match shared {
        Shared::Redis(_) | Shared::Cluster(_) => {
            let target = match shared {
                Shared::Cluster(_) => RedisTarget::Cluster {
                    nodes: url
                        .split(',')
                        .map(|node| format!("redis://{node}"))
                        .collect(),
                },
                _ => RedisTarget::Single {
                    url: url.to_owned(),
                },
            };
            let config = RedisConfig {
                target,
                tls: RedisTls::default(),
                key_prefix: String::new(),
                behaviour,
            };
            SharedStore::redis(config, clock, Duration::from_secs(60))
        }
        Shared::Postgres(_) => {
            let config = PgConfig {
                target: PgTarget::parse(url).expect("the test server's URL"),
                pool_size: 2,
                statement_timeout: Duration::from_secs(5),
                unlogged: true,
                sweep_interval: Duration::from_secs(60),
                key_prefix: String::new(),
                behaviour,
            };
            SharedStore::postgres(config, clock, Duration::from_secs(60))
                .expect("no TLS files to read")
        }
    };
    assert!(
        store.wait_up(Duration::from_secs(10)).await,
        "the store answers"
    );
    store
}

/// `n` instances on `shared`, each up and listening to the others' announcements.
async fn instances(
    shared: &Shared<'_>,
    n: usize,
    behaviour: SharedBehaviour,
) -> Vec<Arc<SharedStore>> {
    let mut stores = Vec::new();
    for _ in 0..n {
        stores.push(connect(shared, &shared.url(), behaviour).await);
    }
    subscribed(&stores).await;
    stores
}

/// Waits until every subscription of `stores` is open: an announcement of each instance
/// is heard by all.
async fn subscribed(stores: &[Arc<SharedStore>]) {
    let probe = "fleet|subscribed=yes#probe";
    let before: Vec<u64> = stores.iter().map(|s| heard(s)).collect();
    until_async(
        "every instance subscribed",
        Duration::from_secs(10),
        async || {
            for store in stores {
                store.reset(probe).await.map_err(|e| e.to_string())?;
            }
            let heard: Vec<u64> = stores.iter().map(|s| heard(s)).collect();
            let all = (heard.iter().zip(&before)).all(|(h, b)| h - b >= stores.len() as u64);
            match all {
                true => Ok(()),
                false => Err(format!("heard {heard:?}")),
            }
        },
    )
    .await;
}

/// Seeds 1 to `default`, or to `FLEET_MODEL_SEEDS` for a longer search by hand.
pub(super) fn seeds(default: u64) -> std::ops::Range<u64> {
    let count = std::env::var("FLEET_MODEL_SEEDS").map_or(default, |n| {
        n.parse()
            .unwrap_or_else(|_| panic!("FLEET_MODEL_SEEDS={n}: not a number of seeds"))
    });
    1..count + 1
}

/// Announcements `store` has heard.
fn heard(store: &SharedStore) -> u64 {
    store.stats().shared.map_or(0, |s| s.announcements_heard)
}

/// A budget of 1000 units an hour.
fn budget(algorithm: Algorithm) -> Vec<Limit> {
    let limit = Limit::new(1000, Unit::Hour).with_algorithm(algorithm);
    vec![limit.expect("an hourly limit")]
}

/// Whether `store` admits `n` units of `key`.
async fn admits(store: &Arc<SharedStore>, key: &str, limits: &[Limit], n: u64) -> bool {
    let (verdict, _) = store
        .apply(key, limits, Hits::Consume(n))
        .await
        .expect("the store answers");
    verdict.decision.admitted
}

/// A budget used up, its denial seen by instance B (whose view now denies locally), then
/// refunds on instance A: after each, B's next request is decided on the refunded count.
async fn refunds_on_one_instance_are_seen_by_the_others(shared: Shared<'_>, algorithm: Algorithm) {
    let fleet = instances(&shared, 2, behaviour(false, Duration::from_secs(2))).await;
    let (a, b) = (&fleet[0], &fleet[1]);
    let key = format!("budget|user=ann#{algorithm:?}");
    let limits = budget(algorithm);
    assert!(admits(a, &key, &limits, 1000).await);
    assert!(!admits(b, &key, &limits, 40).await, "the budget is used up");
    for round in 0..5 {
        a.apply(&key, &limits, Hits::Refund(100))
            .await
            .expect("the store answers");
        // The refund is answered once announced; B hears it in its own time, within the
        // wait, or its view keeps denying what the store admits.
        until_async(
            "B's view no longer denies",
            Duration::from_secs(2),
            async || match b
                .local
                .deny(&key, &limits, Hits::Consume(40), b.now(), || false)
            {
                None => Ok(()),
                Some(denied) => Err(format!("B's view denies: {denied:?}")),
            },
        )
        .await;
        assert!(
            admits(b, &key, &limits, 40).await,
            "round {round}: 40 of the 100 refunded"
        );
        assert!(
            admits(b, &key, &limits, 60).await,
            "round {round}: the other 60"
        );
        assert!(
            !admits(b, &key, &limits, 1).await,
            "round {round}: used up again"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_are_seen_by_every_instance_on_redis() {
    let redis = RedisServer::start();
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow { precision: 10 },
    ] {
        refunds_on_one_instance_are_seen_by_the_others(Shared::Redis(&redis), algorithm).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refunds_are_seen_by_every_instance_on_postgres() {
    let pg = PostgresServer::start();
    for algorithm in [
        Algorithm::FixedWindow,
        Algorithm::SlidingWindow { precision: 10 },
    ] {
        refunds_on_one_instance_are_seen_by_the_others(Shared::Postgres(&pg), algorithm).await;
    }
}
