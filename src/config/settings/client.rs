//! Settings of the command-line clients: `tollgate client`, `explain`, `reset`, `top` and
//! `override`.

use super::flag::Flag as _;
use clap::{Args, Subcommand};
use std::path::PathBuf;

/// Settings of `tollgate client`.
#[derive(Debug, Args)]
pub(crate) struct ClientArgs {
    /// Tollgate's gRPC address.
    #[arg(long, env = "TOLLGATE_ADDR", default_value = "127.0.0.1:8081")]
    pub(crate) addr: String,
    #[command(flatten)]
    pub(crate) request: RequestArgs,
    /// Hits to count (request-level hits_addend), for descriptors without ;hits=N.
    #[arg(long, default_value_t = 1)]
    pub(crate) hits: u32,
    #[command(flatten)]
    pub(crate) tls: ClientTlsArgs,
}

/// Settings of `tollgate explain` and `tollgate reset`: a request for the HTTP port.
#[derive(Debug, Args)]
pub(crate) struct AdminArgs {
    /// Tollgate's HTTP address (HTTP, or HTTPS with the --tls options).
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) http_addr: String,
    #[command(flatten)]
    pub(crate) tls: ClientTlsArgs,
    #[command(flatten)]
    pub(crate) request: RequestArgs,
}

/// Settings of `tollgate top`: which heavy keys to ask the HTTP port for.
#[derive(Debug, Args)]
pub(crate) struct TopArgs {
    /// Tollgate's HTTP address (HTTP, or HTTPS with the --tls options).
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) http_addr: String,
    #[command(flatten)]
    pub(crate) tls: ClientTlsArgs,
    /// Only this domain's rules.
    #[arg(long)]
    pub(crate) domain: Option<String>,
    /// Only the rule at this place: its levels joined with dots (`key_value.key`).
    #[arg(long)]
    pub(crate) rule: Option<String>,
    /// Rank by hits, denied or shadow (would-be denials).
    #[arg(long, default_value = "denied")]
    pub(crate) by: String,
    /// Over the last minute or hour.
    #[arg(long, default_value = "minute")]
    pub(crate) window: String,
    /// How many keys.
    #[arg(short, long, default_value_t = 10)]
    pub(crate) n: usize,
    /// This instance, or the fleet sharing its store (instance or fleet).
    #[arg(long, default_value = "instance")]
    pub(crate) scope: String,
    /// The server's ADMIN_TOKEN, needed unless asking over loopback.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) admin_token: Option<String>,
}

/// The request the client commands send: a domain and its descriptors.
#[derive(Debug, Args)]
pub(crate) struct RequestArgs {
    /// Rate-limit domain.
    #[arg(long)]
    pub(crate) domain: String,
    /// A descriptor as key=value[,key2=value2…], ending in ;hits=N for its own
    /// hits_addend (0: check without counting); repeat for several.
    #[arg(long, required = true)]
    pub(crate) descriptor: Vec<String>,
}

/// TLS of `tollgate client`: on when any of these is given.
#[derive(Debug, Args)]
pub(crate) struct ClientTlsArgs {
    /// Connect over TLS, trusting the system's root certificates (or --tls-ca); a switch
    /// (`--tls`, or `--tls=false`).
    #[arg(long, env = "TOLLGATE_TLS", default_value_t = false, switch())]
    pub(crate) tls: bool,
    /// TLS, trusting only this CA (PEM) for the server's certificate.
    #[arg(long, env = "TOLLGATE_TLS_CA")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// TLS, presenting this client certificate chain (PEM) for mutual TLS; with --tls-key.
    #[arg(long, env = "TOLLGATE_TLS_CERT", requires = "tls_key")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM); with --tls-cert.
    #[arg(long, env = "TOLLGATE_TLS_KEY", requires = "tls_cert")]
    pub(crate) tls_key: Option<PathBuf>,
    /// TLS, checking that the server's certificate carries this name [default: the host
    /// of --addr].
    #[arg(long, env = "TOLLGATE_TLS_SERVER_NAME")]
    pub(crate) tls_server_name: Option<String>,
}

impl ClientTlsArgs {
    /// Whether the client connects over TLS.
    pub(crate) fn enabled(&self) -> bool {
        self.tls
            || self.tls_ca.is_some()
            || self.tls_cert.is_some()
            || self.tls_server_name.is_some()
    }
}

/// `tollgate override`: runtime overrides on a running Tollgate (`/overrides` on its HTTP
/// port).
#[derive(Debug, Args)]
pub(crate) struct OverrideArgs {
    /// Tollgate's HTTP address (HTTP, or HTTPS with the --tls options).
    #[arg(long, env = "TOLLGATE_HTTP_ADDR", default_value = "127.0.0.1:8080")]
    pub(crate) http_addr: String,
    #[command(flatten)]
    pub(crate) tls: ClientTlsArgs,
    /// The server's ADMIN_TOKEN.
    #[arg(long, env = "ADMIN_TOKEN", hide_env_values = true)]
    pub(crate) admin_token: String,
    #[command(subcommand)]
    pub(crate) action: OverrideAction,
}

/// What `tollgate override` does.
#[derive(Debug, Subcommand)]
pub(crate) enum OverrideAction {
    /// Set the limit of one descriptor (PUT /overrides).
    Set {
        #[command(flatten)]
        descriptor: OverriddenArgs,
        /// Units per window.
        #[arg(long)]
        requests_per_unit: u32,
        /// second, minute, hour, day, week, month or year.
        #[arg(long)]
        unit: String,
        /// The window is this many units long.
        #[arg(long)]
        unit_multiplier: Option<u32>,
        /// sliding_window, fixed_window, token_bucket or leaky_bucket.
        #[arg(long)]
        algorithm: Option<String>,
        /// The name answers carry.
        #[arg(long)]
        name: Option<String>,
        /// Unix seconds from which the override no longer applies.
        #[arg(long)]
        expires_at: Option<u64>,
    },
    /// List the overrides, of one domain if given (GET /overrides).
    List {
        /// Only this domain's.
        #[arg(long)]
        domain: Option<String>,
    },
    /// Remove the override of one descriptor (DELETE /overrides).
    Delete {
        #[command(flatten)]
        descriptor: OverriddenArgs,
    },
}

/// The descriptor an override is for.
#[derive(Debug, Args)]
pub(crate) struct OverriddenArgs {
    /// Rate-limit domain.
    #[arg(long)]
    pub(crate) domain: String,
    /// The descriptor as key=value[,key2=value2…].
    #[arg(long)]
    pub(crate) descriptor: String,
}
