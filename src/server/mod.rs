//! `tollgate serve`: load rules, open the store, bind the ports, serve until a signal, then
//! drain: health checks fail first, in-flight calls finish.

mod health;
mod ports;
mod signals;
mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tollgate_core::{Rules, Store, SystemClock};

use crate::app::App;
use crate::config::reload::{self, Reload};
use crate::config::rules_status::Source;
use crate::config::settings::{ConfigType, NoRuleAction, ServeArgs};
use crate::config::xds::{self, XdsConfig};
use crate::config::{compat, env_typos};
use crate::net::tls::ServerTls;
use crate::ops::metrics::XdsStats;
use crate::ops::statsd;
use crate::rlqs::{Rlqs, RlqsConfig, Strategy};

use self::health::first_rules;
use self::ports::{Ports, Services, serve};
use self::signals::{handle_signals, stopped};
use self::store::connect_store;

/// Longest the drain waits for the store to take back the leased blocks.
const LEASE_GIVE_BACK: Duration = Duration::from_secs(1);

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
    let (store, store_name) = connect_store(&args).await?;
    // Unspent leased blocks go back at the drain, so that other instances may admit them.
    let leasing = match &store {
        Store::Shared(shared) if args.store.leases => Some(shared.clone()),
        _ => None,
    };
    let xds_stats = Arc::new(XdsStats::default());
    let watched_xds = matches!(origin, Origin::Xds(_)).then(|| xds_stats.clone());
    let app = Arc::new(App::new(&args, store, watched_xds));
    let (reload, xds_server) = start_rules(&args, &app, origin, xds_stats);
    let _watch = reload.clone().map(reload::watch).transpose()?;
    // The reference has no RLQS: in reference mode its calls get UNIMPLEMENTED, as there.
    let rlqs = (!args.rules.reference_mode)
        .then(|| Rlqs::start(app.clone(), Arc::new(SystemClock), rlqs_config(&args)));

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
            () = first_rules(app.status.subscribe(), &server) => {}
            () = stopped(stop_rx.clone()) => return Ok(()),
        }
    }

    let ports = Ports::bind(&args, &store_name).await?;
    if let Some(statsd) = statsd {
        tracing::info!(target = %statsd.target, dog = statsd.dog, "sending stats to statsd");
        statsd::spawn(statsd, app.metrics.clone());
    }
    let services = Services {
        app,
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
/// nothing here, and variables that look like a setting but are none, are warned about.
fn check_reference_settings() -> anyhow::Result<()> {
    let refused = compat::refusals(|name| std::env::var(name).ok());
    anyhow::ensure!(refused.is_empty(), "{}", refused.join("; "));
    for warning in compat::warnings(|name| std::env::var(name).ok()) {
        tracing::warn!("{warning}");
    }
    let names = std::env::vars_os().filter_map(|(name, _)| name.into_string().ok());
    for warning in env_typos::warnings(names) {
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
