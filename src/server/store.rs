//! The counter store the settings ask for: memory, a shared store (Redis, PostgreSQL)
//! or the reference's Redis keys, given a first chance to answer.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tollgate_core::store::postgres::{PgConfig, PgTarget};
use tollgate_core::store::redis::{
    RedisConfig, RedisTarget, RedisTls, ReferenceConfig, ReferenceStore,
};
use tollgate_core::store::{SharedBehaviour, SharedStore};
use tollgate_core::{Clock, MemoryStore, OnStoreError, Store, SystemClock};

use crate::config::settings::{Backend, ServeArgs, StoreArgs};
use crate::net::tls;

/// How often expired counters are dropped from memory.
const SWEEP_PERIOD: Duration = Duration::from_secs(1);

/// The counter store, given `STORE_STARTUP_WAIT` to answer a first time, and what it
/// is and where, its password hidden (`redis 127.0.0.1:6379 (single)`), for the logs.
pub(super) async fn connect_store(args: &ServeArgs) -> anyhow::Result<(Store, String)> {
    let (store, name) = open_store(args)?;
    let first_connect = args.store.store_startup_wait;
    let unreachable = match &store {
        Store::Shared(shared) if !shared.wait_up(first_connect).await => Some(shared.last_error()),
        Store::Reference(reference) if !reference.wait_up(first_connect).await => {
            Some(reference.last_error())
        }
        _ => None,
    };
    if let Some(why) = unreachable {
        let why = why.unwrap_or_else(|| "no answer".into());
        tracing::warn!(
            "{name} not reachable after {first_connect:?} ({why}); serving per --on-store-error until it is"
        );
    }
    Ok((store, name))
}

/// The counter store the settings ask for, and its name for the logs.
fn open_store(args: &ServeArgs) -> anyhow::Result<(Store, String)> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let capacity = args.capacity();
    let settings = &args.store;
    let reference = args.rules.reference_mode;
    let shared = SharedBehaviour {
        leases: tollgate_core::store::LeasePolicy {
            enabled: settings.leases,
            max_fraction: settings.lease_max_fraction,
        },
        timeout: settings.timeout(reference),
        on_error: settings.on_error(reference),
        local_capacity: capacity,
    };
    if reference {
        if args.rules.calendar_time_zone.is_some() {
            anyhow::bail!(
                "CALENDAR_TIME_ZONE makes calendar windows, which are Tollgate's: REFERENCE_MODE \
                 counts the reference's epoch-aligned windows"
            );
        }
        if !args.rules.budget_domains.is_empty() {
            anyhow::bail!(
                "BUDGET_DOMAINS makes budgets, which are Tollgate's: REFERENCE_MODE counts every \
                 hit as the reference does"
            );
        }
        return open_reference_store(settings, clock);
    }
    match settings.backend() {
        Backend::Memory => {
            let memory = MemoryStore::new(capacity, clock);
            memory.spawn_sweeper(SWEEP_PERIOD);
            Ok((Store::Memory(memory), "memory".to_owned()))
        }
        Backend::Redis => {
            let (target, tls) = redis_target(settings, "BACKEND_TYPE=redis")?;
            let name = format!("redis {target}");
            let config = RedisConfig {
                target,
                tls,
                key_prefix: settings.cache_key_prefix.clone(),
                behaviour: shared,
            };
            let store = SharedStore::redis(config, clock, SWEEP_PERIOD);
            Ok((Store::Shared(store), name))
        }
        Backend::Postgres => {
            let postgres = &settings.postgres;
            let url = postgres
                .postgres_url
                .as_deref()
                .context("BACKEND_TYPE=postgres needs POSTGRES_URL (--postgres-url)")?;
            let target = PgTarget::parse(url).map_err(anyhow::Error::msg)?;
            let name = format!("postgres {target}");
            let config = PgConfig {
                target,
                pool_size: usize::from(postgres.postgres_pool_size),
                statement_timeout: postgres.postgres_statement_timeout,
                unlogged: postgres.postgres_unlogged,
                sweep_interval: postgres.postgres_sweep_interval,
                key_prefix: settings.cache_key_prefix.clone(),
                behaviour: shared,
            };
            let store =
                SharedStore::postgres(config, clock, SWEEP_PERIOD).map_err(anyhow::Error::msg)?;
            Ok((Store::Shared(store), name))
        }
    }
}

/// Reference mode's store: Redis in the reference's keys, and its name for the logs.
fn open_reference_store(
    settings: &StoreArgs,
    clock: Arc<dyn Clock>,
) -> anyhow::Result<(Store, String)> {
    if settings.backend() != Backend::Redis {
        anyhow::bail!(
            "REFERENCE_MODE counts in the reference's Redis keys: it needs BACKEND_TYPE=redis \
             and REDIS_URL"
        );
    }
    let on_error = settings.on_error(true);
    if on_error == OnStoreError::Local {
        anyhow::bail!(
            "ON_STORE_ERROR=local needs a local view, which REFERENCE_MODE has not: use error \
             (the reference's), allow or deny"
        );
    }
    let (target, tls) = redis_target(settings, "REFERENCE_MODE")?;
    let name = format!("redis {target} in the reference's keys");
    let config = ReferenceConfig {
        target,
        tls,
        key_prefix: settings.cache_key_prefix.clone(),
        timeout: settings.timeout(true),
        on_error,
        expiration_jitter: Duration::from_secs(settings.expiration_jitter_max_seconds),
        local_cache_bytes: settings.local_cache_size_in_bytes,
    };
    Ok((Store::Reference(ReferenceStore::start(config, clock)), name))
}

/// Where Redis is and how to reach it, from REDIS_URL and the Redis settings; `needs`
/// says what asked for Redis when REDIS_URL is missing.
fn redis_target(settings: &StoreArgs, needs: &str) -> anyhow::Result<(RedisTarget, RedisTls)> {
    let url = settings
        .redis_url
        .as_deref()
        .with_context(|| format!("{needs} needs REDIS_URL (--redis-url)"))?;
    let target = RedisTarget::parse(
        url,
        settings.redis_type,
        settings.redis_auth.as_deref(),
        settings.redis_tls,
    )?;
    let tls = redis_tls(settings, &target)?;
    Ok((target, tls))
}

/// The Redis TLS settings, read and checked; settings that would be silently unused are
/// errors.
fn redis_tls(settings: &StoreArgs, target: &RedisTarget) -> anyhow::Result<RedisTls> {
    let client = match (
        &settings.redis_tls_client_cert,
        &settings.redis_tls_client_key,
    ) {
        (Some(cert), Some(key)) => Some(tls::KeyPair::load(cert, key)?.into_pem()),
        (None, None) => None,
        _ => anyhow::bail!("REDIS_TLS_CLIENT_CERT and REDIS_TLS_CLIENT_KEY go together; give both"),
    };
    let ca = settings
        .redis_tls_cacert
        .as_deref()
        .map(tls::ca_pem)
        .transpose()?;
    let skip = settings.redis_tls_skip_hostname_verification;
    let custom = client.is_some() || ca.is_some() || skip;
    anyhow::ensure!(
        !custom || target.uses_tls(),
        "REDIS_TLS_CLIENT_CERT, REDIS_TLS_CACERT and REDIS_TLS_SKIP_HOSTNAME_VERIFICATION \
         apply to TLS connections: set REDIS_TLS=true or use rediss:// addresses"
    );
    anyhow::ensure!(
        !(skip && matches!(target, RedisTarget::Sentinel { .. })),
        "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION is not available with REDIS_TYPE=sentinel (the \
         Redis client cannot turn it off for the master it discovers); give the servers \
         certificates that name the addresses Sentinel announces"
    );
    Ok(RedisTls {
        client,
        ca,
        skip_hostname_verification: skip,
    })
}
