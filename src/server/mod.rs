//! `tollgate serve`: settings checked into a [`Config`], then [`run`]: open the store, bind
//! the ports, serve until the shutdown, then drain: health checks fail first, in-flight
//! calls finish.

mod config;
mod health;
mod ports;
mod signals;
mod store;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tollgate_core::{Store, SystemClock};

use crate::app::App;
use crate::config::reload::{self, Reload};
use crate::config::rules_status::Source;
use crate::config::settings::{NoRuleAction, ServeArgs};
use crate::config::xds;
use crate::net::tls::ServerTls;
use crate::ops::metrics::XdsStats;
use crate::ops::overrides;
use crate::ops::{statsd, top};
use crate::rlqs::{Rlqs, RlqsConfig, Strategy};

pub use self::config::Config;
use self::config::Origin;
use self::health::first_rules;
pub use self::ports::Listeners;
use self::ports::{Ports, Services, serve};
pub use self::signals::terminated;
use self::signals::{drain_on, hangups, reload_on_hangup, stopped};
use self::store::connect_store;

/// Longest the drain waits for the store to take back the leased blocks and what this
/// instance owes it or gave back without it.
const STORE_DRAIN: Duration = Duration::from_secs(2);

/// Runs the server from `config` on `listeners` until `shutdown` completes, then drains:
/// what it starts, in order.
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let Config {
        args,
        statsd,
        origin,
        server_tls,
    } = config;
    // Heard from the start: a SIGHUP's default would end the process while it starts.
    let hangups = hangups();
    let _tls_watch = server_tls.as_ref().map(ServerTls::watch).transpose()?;
    let (store, store_name) = connect_store(&args).await?;
    // Unspent leased blocks go back at the drain, so that other instances may admit them,
    // and what is owed or credited reaches the store.
    let shared = match &store {
        Store::Shared(shared) => Some(shared.clone()),
        _ => None,
    };
    let xds_stats = Arc::new(XdsStats::default());
    let watched_xds = matches!(origin, Origin::Xds(_)).then(|| xds_stats.clone());
    let app = Arc::new(App::new(&args, store, watched_xds));
    app.overrides.load(&app.limiter).await?;
    overrides::refresh::spawn(Arc::downgrade(&app));
    let (reload, xds_server) = start_rules(&args, &app, origin, xds_stats);
    let _watch = reload.clone().map(reload::watch).transpose()?;
    // The reference has no RLQS: in reference mode its calls get UNIMPLEMENTED, as there.
    let rlqs = (!args.rules.reference_mode)
        .then(|| Rlqs::start(app.clone(), Arc::new(SystemClock), rlqs_config(&args)));

    let (draining_tx, draining) = watch::channel(false);
    let (stop_tx, stop_rx) = watch::channel(false);
    let hangup = AbortOnDrop(tokio::spawn(reload_on_hangup(hangups, reload)));
    tokio::spawn(drain_on(
        shutdown,
        draining_tx,
        args.ops.shutdown_delay,
        stop_tx,
    ));
    if let Some(server) = xds_server
        && !args.source.force_start_without_initial_config
    {
        // The reference's default: the ports open once there are rules to serve.
        tokio::select! {
            () = first_rules(app.status.subscribe(), &server) => {}
            () = stopped(stop_rx.clone()) => return Ok(()),
        }
    }

    let ports = Ports::bind(&args, listeners, &store_name).await?;
    if let Some(statsd) = statsd {
        tracing::info!(target = %statsd.target, dog = statsd.dog, "sending stats to statsd");
        statsd::spawn(statsd, app.metrics.clone());
    }
    if matches!(app.limiter.store(), Store::Shared(_)) {
        top::spawn_publisher(&app);
    }
    let services = Services {
        app,
        rlqs,
        draining,
    };
    let served = serve(&args, ports, services, server_tls, stop_rx).await;
    if let Some(shared) = shared {
        shared.drain(STORE_DRAIN).await;
    }
    drop(hangup);
    served
}

/// A task that ends with the server, not with the runtime.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Rules in force: files installed now and reloaded on change, or the xDS client
/// started; the reload handle and the xDS server, whichever applies.
fn start_rules(
    args: &ServeArgs,
    app: &Arc<App>,
    origin: Origin,
    xds_stats: Arc<XdsStats>,
) -> (Option<Reload>, Option<String>) {
    match origin {
        Origin::Files { path, rules } => {
            app.install(rules, Source::Files { path: path.clone() });
            let settings = Arc::new(args.rules.clone());
            (Some(Reload::new(app.clone(), path, settings)), None)
        }
        Origin::Xds(config) => {
            let server = config.server.clone();
            tokio::spawn(xds::run(*config, app.clone(), xds_stats));
            (None, Some(server))
        }
    }
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
