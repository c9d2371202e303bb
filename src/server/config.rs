//! The settings of `tollgate serve`, checked once before anything starts: the reference's
//! settings that cannot be honoured refused, the admin token checked, statsd's target
//! read, the rules loaded (or the xDS client's settings checked) and the server's TLS
//! material read.

use std::path::PathBuf;
use std::sync::Arc;

use tollgate_core::Rules;

use crate::config::reload;
use crate::config::settings::{self, ConfigType, ServeArgs};
use crate::config::xds::XdsConfig;
use crate::config::{compat, env_typos};
use crate::net::tls::ServerTls;
use crate::ops::statsd::StatsdConfig;
use crate::ops::token;

/// `tollgate serve`'s settings, checked: what [`run`](super::run) starts from.
pub struct Config {
    pub(super) args: ServeArgs,
    pub(super) statsd: Option<StatsdConfig>,
    pub(super) origin: Origin,
    pub(super) server_tls: Option<Arc<ServerTls>>,
}

/// Where the rules come from, once the settings are checked.
pub(super) enum Origin {
    /// Files, loaded already.
    Files { path: PathBuf, rules: Rules },
    /// An xDS management server, not contacted yet.
    Xds(Box<XdsConfig>),
}

impl Config {
    /// The settings `tollgate serve ARGS` takes with `env` as its whole environment (no
    /// variable of this process is read), checked.
    pub async fn from_command_line(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Self> {
        // As `tollgate serve` does: rustls's one crypto provider, installed once.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let owned: Vec<(String, String)> = env
            .iter()
            .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
            .collect();
        let args = settings::serve_args(args, &owned).map_err(|e| anyhow::anyhow!("{e}"))?;
        Self::load(args, &owned).await
    }

    /// `args` checked, under the environment `env` (variables of the reference's that
    /// Tollgate refuses or warns about, and names that look like a setting but are none).
    pub(crate) async fn load(args: ServeArgs, env: &[(String, String)]) -> anyhow::Result<Self> {
        check_reference_settings(env)?;
        if let Some(admin_token) = &args.ops.admin_token {
            token::check("ADMIN_TOKEN (--admin-token)", admin_token)?;
        }
        let statsd = args.ops.stats.statsd()?;
        let origin = rules_origin(&args).await?;
        // Before anything else starts: a bad certificate or key stops startup here.
        let server_tls = match args.tls.files()? {
            Some(files) => Some(ServerTls::load(files)?),
            None => None,
        };
        Ok(Self {
            args,
            statsd,
            origin,
            server_tls,
        })
    }
}

/// Settings of the reference's that cannot be honoured stop startup; those that change
/// nothing here, and variables that look like a setting but are none, are warned about.
fn check_reference_settings(env: &[(String, String)]) -> anyhow::Result<()> {
    let lookup = |name: &str| {
        env.iter()
            .find(|(n, _)| n == name)
            .map(|(_, value)| value.clone())
    };
    let refused = compat::refusals(lookup);
    anyhow::ensure!(refused.is_empty(), "{}", refused.join("; "));
    for warning in compat::warnings(lookup) {
        tracing::warn!("{warning}");
    }
    for warning in env_typos::warnings(env.iter().map(|(name, _)| name.clone())) {
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
