//! `tollgate serve`: load rules, open the store, bind the ports, serve until a signal, then
//! drain: health checks fail first, in-flight calls finish.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use envoy_types::pb::envoy::service::rate_limit_quota::v3::rate_limit_quota_service_server::RateLimitQuotaServiceServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tollgate_core::headers::HeaderStyle;
use tollgate_core::store::postgres::{PgConfig, PgTarget};
use tollgate_core::store::redis::{
    RedisConfig, RedisTarget, RedisTls, ReferenceConfig, ReferenceStore,
};
use tollgate_core::store::{SharedBehaviour, SharedStore};
use tollgate_core::{
    Clock, Limiter, MemoryStore, OnStoreError, Options, Rules, Store, SystemClock,
};
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::admin::{self, Admin};
use crate::compat;
use crate::debug_port;
use crate::grpc::GrpcService;
use crate::listen::{self, Acceptor, MarkFirstRequestLayer, PortTls};
use crate::metrics::{Metrics, XdsStats};
use crate::proto::HeaderNames;
use crate::reload::{self, Reload};
use crate::rlqs::{Rlqs, RlqsConfig, RlqsService, Strategy};
use crate::rls::Rls;
use crate::rules_status::{Readiness, RulesStatus, Source};
use crate::settings::{
    Backend, ConfigType, ConnArgs, HeaderFormat, NoRuleAction, ServeArgs, StoreArgs,
};
use crate::statsd;
use crate::tls::{self, Port, ServerTls};
use crate::xds::{self, XdsConfig};

/// How often expired counters are dropped from memory.
const SWEEP_PERIOD: Duration = Duration::from_secs(1);
/// Request headers a gRPC client may send; Envoy's are a few hundred bytes.
const HEADER_LIST_BYTES: u32 = 16 << 10;
/// Flow-control windows: what a client may have in flight before Tollgate reads it.
const STREAM_WINDOW_BYTES: u32 = 64 << 10;
const CONNECTION_WINDOW_BYTES: u32 = 1 << 20;
/// How long calls in flight get to finish once the listeners are closed.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// Longest the drain waits for the store to take back the leased blocks.
const LEASE_GIVE_BACK: Duration = Duration::from_secs(1);
/// How often startup says it is still waiting for the first xDS rules.
const FIRST_RULES_NOTICE: Duration = Duration::from_secs(10);
/// The gRPC health names Envoy and Kubernetes probes use.
const HEALTH_NAMES: [&str; 2] = ["", "ratelimit"];

/// Where the rules come from, once the settings are checked.
enum Origin {
    /// Files, loaded already.
    Files { path: PathBuf, rules: Rules },
    /// An xDS management server, not contacted yet.
    Xds(Box<XdsConfig>),
}

/// Runs the server until a signal stops it: what it starts, in order.
pub(crate) async fn run(args: ServeArgs) -> anyhow::Result<()> {
    check_reference_settings()?;
    let statsd = args.ops.stats.statsd()?;
    let origin = rules_origin(&args).await?;
    // Before anything else starts: a bad certificate or key stops startup here.
    let server_tls = match args.tls.files()? {
        Some(files) => Some(ServerTls::load(files)?),
        None => None,
    };
    let _tls_watch = server_tls.as_ref().map(ServerTls::watch).transpose()?;
    let store = connect_store(&args).await?;
    // Unspent leased blocks go back at the drain, so that other instances may admit them.
    let leasing = match &store {
        Store::Shared(shared) if args.store.leases => Some(shared.clone()),
        _ => None,
    };
    let xds_stats = Arc::new(XdsStats::default());
    let watched_xds = matches!(origin, Origin::Xds(_)).then(|| xds_stats.clone());
    let rls = service(&args, store, watched_xds);
    let (reload, xds_server) = start_rules(&args, &rls, origin, xds_stats);
    let _watch = reload.clone().map(reload::watch).transpose()?;
    // The reference has no RLQS: in reference mode its calls get UNIMPLEMENTED, as there.
    let rlqs = (!args.rules.reference_mode)
        .then(|| Rlqs::start(rls.clone(), Arc::new(SystemClock), rlqs_config(&args)));

    let (draining_tx, draining) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(handle_signals(
        reload,
        draining_tx,
        args.ops.shutdown_delay,
        stop_tx,
    ));
    if let Some(server) = xds_server
        && !args.source.force_start_without_initial_config
    {
        // The reference's default: the ports open once there are rules to serve.
        tokio::select! {
            () = first_rules(rls.status.subscribe(), &server) => {}
            () = stopped(stop_rx.clone()) => return Ok(()),
        }
    }

    let ports = Ports::bind(&args).await?;
    if let Some(statsd) = statsd {
        tracing::info!(target = %statsd.target, dog = statsd.dog, "sending stats to statsd");
        statsd::spawn(statsd, rls.metrics.clone());
    }
    let services = Services {
        rls,
        rlqs,
        draining,
    };
    let served = serve(&args, ports, services, server_tls, stop_rx).await;
    if let Some(shared) = leasing {
        shared.give_back_leases(LEASE_GIVE_BACK).await;
    }
    served
}

/// Settings of the reference's that cannot be honoured stop startup; those that change
/// nothing here are warned about.
fn check_reference_settings() -> anyhow::Result<()> {
    let refused = compat::refusals(|name| std::env::var(name).ok());
    anyhow::ensure!(refused.is_empty(), "{}", refused.join("; "));
    for warning in compat::warnings(|name| std::env::var(name).ok()) {
        tracing::warn!("{warning}");
    }
    Ok(())
}

/// Where the rules come from: files, loaded now, or an xDS server, contacted later.
async fn rules_origin(args: &ServeArgs) -> anyhow::Result<Origin> {
    match args.source.config_type {
        ConfigType::File => {
            let path = args.config_path();
            let rules = reload::load(&path, args.rules.builder()).await?;
            tracing::info!(path = %path.display(), domains = rules.domains().count(), "rules loaded");
            Ok(Origin::Files { path, rules })
        }
        ConfigType::GrpcXdsSotw => {
            anyhow::ensure!(
                args.config.is_none(),
                "--config (TOLLGATE_CONFIG) names rules files, but CONFIG_TYPE=GRPC_XDS_SOTW \
                 takes rules from the xDS server only; unset one of them"
            );
            let (config, warnings) = XdsConfig::new(&args.source.xds, &args.rules)?;
            for warning in warnings {
                tracing::warn!("{warning}");
            }
            Ok(Origin::Xds(Box::new(config)))
        }
    }
}

/// The counter store, given `STORE_STARTUP_WAIT` to answer a first time.
async fn connect_store(args: &ServeArgs) -> anyhow::Result<Store> {
    let store = open_store(args)?;
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
            "{} not reachable after {first_connect:?} ({why}); serving per --on-store-error until it is",
            args.store.backend().name()
        );
    }
    Ok(store)
}

/// The rate-limit service on `store`, with its metrics (and the xDS stream's, if any).
fn service(args: &ServeArgs, store: Store, xds: Option<Arc<XdsStats>>) -> Arc<Rls> {
    let (mut metrics, rule_metrics) = Metrics::new(
        args.answers.near_limit_ratio,
        args.ops.detailed_metric_limit,
    );
    metrics.watch_store(store.clone());
    if let Some(stats) = xds {
        metrics.watch_xds(stats);
    }
    let options = Options {
        defaults: args.rules.defaults(),
        global_shadow_mode: args.answers.shadow_mode,
        quota_mode: args.answers.quota_mode,
        all_or_nothing: args.answers.stop_cache_key_increment_when_overlimit,
    };
    Arc::new(Rls {
        limiter: Limiter::with_recorder(Rules::default(), store, options, rule_metrics),
        metrics: Arc::new(metrics),
        headers: header_style(args),
        header_names: HeaderNames {
            limit: args.answers.limit_limit_header.clone(),
            remaining: args.answers.limit_remaining_header.clone(),
            reset: args.answers.limit_reset_header.clone(),
        },
        dynamic_metadata: args.answers.response_dynamic_metadata,
        status: RulesStatus::new(args.source.healthy_with_at_least_one_config_loaded),
    })
}

/// Rules in force: files installed now and reloaded on change, or the xDS client
/// started; the reload handle and the xDS server, whichever applies.
fn start_rules(
    args: &ServeArgs,
    rls: &Arc<Rls>,
    origin: Origin,
    xds_stats: Arc<XdsStats>,
) -> (Option<Reload>, Option<String>) {
    match origin {
        Origin::Files { path, rules } => {
            rls.install(rules, Source::Files { path: path.clone() });
            let settings = Arc::new(args.rules.clone());
            (Some(Reload::new(rls.clone(), path, settings)), None)
        }
        Origin::Xds(config) => {
            let server = config.server.clone();
            tokio::spawn(xds::run(*config, rls.clone(), xds_stats));
            (None, Some(server))
        }
    }
}

/// The listeners, bound.
struct Ports {
    grpc: TcpListener,
    http: TcpListener,
    prometheus: Option<TcpListener>,
    debug: Option<TcpListener>,
}

impl Ports {
    /// Binds every port the settings ask for and prints the line tests and scripts wait
    /// for (with port 0 it is how they learn the ports).
    async fn bind(args: &ServeArgs) -> anyhow::Result<Self> {
        let grpc = bind(args.grpc_addr(), "gRPC").await?;
        let http = bind(args.http_addr(), "HTTP").await?;
        let prometheus = match args.ops.use_prometheus {
            true => Some(bind(args.ops.prometheus_addr, "Prometheus").await?),
            false => None,
        };
        let debug = match args.ops.debug_port.0 {
            Some(port) => bind_debug(SocketAddr::new(args.ops.debug_host, port)).await,
            None => None,
        };
        let grpc_addr = grpc.local_addr()?;
        let http_addr = http.local_addr()?;
        println!("tollgate listening grpc={grpc_addr} http={http_addr}");
        tracing::info!(%grpc_addr, %http_addr, "listening");
        Ok(Self {
            grpc,
            http,
            prometheus,
            debug,
        })
    }
}

/// What the ports serve, and whether the server is draining (health fails meanwhile).
struct Services {
    rls: Arc<Rls>,
    rlqs: Option<Arc<Rlqs>>,
    draining: watch::Receiver<bool>,
}

/// Serves every port until `stop` says so, then gives calls in flight a grace period.
async fn serve(
    args: &ServeArgs,
    ports: Ports,
    services: Services,
    server_tls: Option<Arc<ServerTls>>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let Services {
        rls,
        rlqs,
        draining,
    } = services;
    let (health, health_service) = tonic_health::server::health_reporter();
    // Health is answered from the first connection on: set it before anything is served.
    set_health(&health, serving_status(rls.status.readiness(), false)).await;
    tokio::spawn(report_health(
        health,
        rls.status.subscribe(),
        draining.clone(),
    ));
    let admin = Admin {
        rls: rls.clone(),
        draining,
        admin_token: args.ops.admin_token.clone().map(Arc::from),
    };
    let limits = args.conn.limits();
    let grpc_tls = server_tls.clone().map(|tls| PortTls {
        tls,
        port: Port::Grpc,
    });
    let http_tls = server_tls
        .filter(|_| args.tls.http_server_use_tls)
        .map(|tls| PortTls {
            tls,
            port: Port::Http,
        });
    let grpc_server = grpc_builder(&args.conn)
        .layer(MarkFirstRequestLayer)
        .add_service(health_service)
        .add_service(GrpcService::new(
            rls.clone(),
            args.conn.grpc_max_message_bytes,
            args.tracing.tracing_enabled,
        ))
        .add_optional_service(rlqs.map(|rlqs| {
            RateLimitQuotaServiceServer::new(RlqsService(rlqs))
                .max_decoding_message_size(args.conn.grpc_max_message_bytes)
        }))
        .serve_with_incoming_shutdown(
            Acceptor::new(ports.grpc, args.conn.grpc_limits(), grpc_tls).incoming(),
            stopped(stop.clone()),
        );
    let http_acceptor = Acceptor::new(ports.http, limits, http_tls.clone());
    let http_server =
        listen::serve_http(http_acceptor, admin::router(admin), stopped(stop.clone()));
    let debug_server = async {
        if let Some(listener) = ports.debug {
            let acceptor = Acceptor::new(listener, limits, None);
            let router = debug_port::router(rls.clone());
            listen::serve_http(acceptor, router, stopped(stop.clone())).await;
        }
    };
    let prometheus_server = async {
        if let Some(listener) = ports.prometheus {
            let router = axum::Router::new()
                .route(
                    &args.ops.prometheus_path,
                    axum::routing::get(admin::metrics),
                )
                .with_state(rls.clone());
            let acceptor = Acceptor::new(listener, limits, http_tls);
            listen::serve_http(acceptor, router, stopped(stop.clone())).await;
        }
    };
    let servers = async {
        let (grpc, (), (), ()) =
            tokio::join!(grpc_server, http_server, prometheus_server, debug_server);
        grpc
    };
    // Envoy keeps its HTTP/2 connections open for good: once the listeners are closed, give
    // calls in flight a grace period, then stop whatever is still connected.
    let grace_over = async {
        stopped(stop.clone()).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        grpc_result = servers => grpc_result.context("gRPC server failed"),
        () = grace_over => {
            tracing::info!("closing connections still open after {SHUTDOWN_GRACE:?}");
            Ok(())
        }
    }
}

/// The debug port's listener; a debug port that cannot be bound is logged, not fatal (the
/// reference's instances share theirs with SO_REUSEPORT, so manifests may start several).
async fn bind_debug(addr: SocketAddr) -> Option<TcpListener> {
    match TcpListener::bind(addr).await {
        Ok(listener) => {
            if let Ok(local) = listener.local_addr() {
                tracing::info!(%local, "debug port: /rlconfig, /stats");
            }
            Some(listener)
        }
        Err(e) => {
            tracing::warn!("debug port {addr} not served: {e}");
            None
        }
    }
}

/// The gRPC server with its per-connection limits (streams, header size, buffered bytes)
/// and lifetime (age, keepalive).
fn grpc_builder(conn: &ConnArgs) -> tonic::transport::Server {
    tonic::transport::Server::builder()
        .max_concurrent_streams(conn.grpc_max_concurrent_streams)
        .http2_max_header_list_size(HEADER_LIST_BYTES)
        .initial_stream_window_size(STREAM_WINDOW_BYTES)
        .initial_connection_window_size(CONNECTION_WINDOW_BYTES)
        // Only the age: tonic 0.14 with a grace set skips the polite GOAWAY and cuts the
        // connection at age + grace. The cut is the acceptor's (`ConnArgs::grpc_limits`).
        .max_connection_age(conn.grpc_max_connection_age)
        .http2_keepalive_interval(Some(conn.grpc_keepalive_time))
        .http2_keepalive_timeout(Some(conn.grpc_keepalive_timeout))
}

fn rlqs_config(args: &ServeArgs) -> RlqsConfig {
    RlqsConfig {
        idle: args.rlqs.rlqs_bucket_idle_timeout,
        no_rule: match args.rlqs.rlqs_no_rule_action {
            NoRuleAction::Allow => Strategy::AllowAll,
            NoRuleAction::Deny => Strategy::DenyAll,
        },
        shadow: args.answers.shadow_mode,
        max_message_bytes: args.conn.grpc_max_message_bytes,
        max_buckets: args.rlqs.rlqs_max_buckets,
    }
}

fn header_style(args: &ServeArgs) -> HeaderStyle {
    let answers = &args.answers;
    match (
        answers.limit_response_headers,
        answers.response_headers_format,
    ) {
        (false, _) => HeaderStyle::Off,
        (true, HeaderFormat::Reference) => HeaderStyle::Reference,
        (true, HeaderFormat::Draft) => HeaderStyle::Draft,
    }
}

/// The counter store the settings ask for.
fn open_store(args: &ServeArgs) -> anyhow::Result<Store> {
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
            Ok(Store::Memory(memory))
        }
        Backend::Redis => {
            let (target, tls) = redis_target(settings, "BACKEND_TYPE=redis")?;
            let config = RedisConfig {
                target,
                tls,
                key_prefix: settings.cache_key_prefix.clone(),
                behaviour: shared,
            };
            Ok(Store::Shared(SharedStore::redis(
                config,
                clock,
                SWEEP_PERIOD,
            )))
        }
        Backend::Postgres => {
            let postgres = &settings.postgres;
            let url = postgres
                .postgres_url
                .as_deref()
                .context("BACKEND_TYPE=postgres needs POSTGRES_URL (--postgres-url)")?;
            let config = PgConfig {
                target: PgTarget::parse(url).map_err(anyhow::Error::msg)?,
                pool_size: usize::from(postgres.postgres_pool_size),
                statement_timeout: postgres.postgres_statement_timeout,
                unlogged: postgres.postgres_unlogged,
                sweep_interval: postgres.postgres_sweep_interval,
                key_prefix: settings.cache_key_prefix.clone(),
                behaviour: shared,
            };
            let store =
                SharedStore::postgres(config, clock, SWEEP_PERIOD).map_err(anyhow::Error::msg)?;
            Ok(Store::Shared(store))
        }
    }
}

/// Reference mode's store: Redis in the reference's keys.
fn open_reference_store(settings: &StoreArgs, clock: Arc<dyn Clock>) -> anyhow::Result<Store> {
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
    let config = ReferenceConfig {
        target,
        tls,
        key_prefix: settings.cache_key_prefix.clone(),
        timeout: settings.timeout(true),
        on_error,
        expiration_jitter: Duration::from_secs(settings.expiration_jitter_max_seconds),
        local_cache_bytes: settings.local_cache_size_in_bytes,
    };
    Ok(Store::Reference(ReferenceStore::start(config, clock)))
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

async fn bind(addr: std::net::SocketAddr, what: &str) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen for {what} on {addr}"))
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|stop| *stop).await;
}

async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health
        .set_service_status(<GrpcService as tonic::server::NamedService>::NAME, status)
        .await;
    for name in HEALTH_NAMES {
        health.set_service_status(name, status).await;
    }
}

/// Waits until the first rules are in force, saying so in the log now and then.
async fn first_rules(mut readiness: watch::Receiver<Readiness>, server: &str) {
    tracing::info!(%server, "waiting for the first rules from the xDS server before serving");
    loop {
        match tokio::time::timeout(FIRST_RULES_NOTICE, readiness.wait_for(|r| r.loaded)).await {
            // A closed channel cannot happen while the service lives; either way, go on.
            Ok(_) => return,
            Err(_) => tracing::warn!(
                %server,
                "still no rules from the xDS server; not serving until some arrive \
                 (FORCE_START_WITHOUT_INITIAL_CONFIG=true serves without them)"
            ),
        }
    }
}

/// Keeps gRPC health in step with the rules (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) and
/// the drain: serving while the rules are healthy and the server is not draining.
async fn report_health(
    health: HealthReporter,
    mut rules: watch::Receiver<Readiness>,
    mut draining: watch::Receiver<bool>,
) {
    loop {
        let status = serving_status(*rules.borrow_and_update(), *draining.borrow_and_update());
        set_health(&health, status).await;
        tokio::select! {
            changed = rules.changed() => if changed.is_err() { return },
            changed = draining.changed() => if changed.is_err() { return },
        }
    }
}

fn serving_status(rules: Readiness, draining: bool) -> ServingStatus {
    match rules.healthy && !draining {
        true => ServingStatus::Serving,
        false => ServingStatus::NotServing,
    }
}

/// SIGHUP reloads file rules; SIGTERM or Ctrl-C drains and stops.
async fn handle_signals(
    reload: Option<Reload>,
    draining: watch::Sender<bool>,
    delay: Duration,
    stop: watch::Sender<bool>,
) {
    wait_for_stop(reload.as_ref()).await;
    tracing::info!(delay = ?delay, "draining: health checks fail, then listeners close");
    draining.send_replace(true);
    tokio::time::sleep(delay).await;
    let _ = stop.send(true);
}

#[cfg(unix)]
async fn wait_for_stop(reload: Option<&Reload>) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => return,
            _ = term.recv() => return,
            _ = hup.recv() => match reload {
                // Off this loop, so that SIGTERM is heard while rules load.
                Some(reload) => {
                    let reload = reload.clone();
                    tokio::spawn(async move { reload.run().await });
                }
                None => tracing::info!("SIGHUP: rules come from xDS; nothing to reload"),
            },
        }
    }
}

#[cfg(not(unix))]
async fn wait_for_stop(_reload: Option<&Reload>) {
    let _ = tokio::signal::ctrl_c().await;
}
