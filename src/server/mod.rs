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
use tollgate_core::headers::HeaderStyle;
use tollgate_core::{Limiter, Options, Rules, Store, SystemClock};

use crate::metrics::{Metrics, XdsStats};
use crate::proto::HeaderNames;
use crate::reload::{self, Reload};
use crate::rlqs::{Rlqs, RlqsConfig, Strategy};
use crate::rls::Rls;
use crate::rules_status::{RulesStatus, Source};
use crate::settings::{ConfigType, HeaderFormat, NoRuleAction, ServeArgs};
use crate::statsd;
use crate::tls::ServerTls;
use crate::xds::{self, XdsConfig};
use crate::{compat, env_typos};

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

    let ports = Ports::bind(&args, &store_name).await?;
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
