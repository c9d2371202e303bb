//! Rules over xDS (`CONFIG_TYPE=GRPC_XDS_SOTW`): a State-of-the-World ADS client that
//! subscribes to every `RateLimitConfig` of a management server (Envoy Gateway's, say) and
//! serves each response as the whole rule set.
//!
//! - [`convert`]: resources → rules, through the same validation as YAML files.
//! - [`ack`]: what to send on a new stream and in answer to each response.
//! - [`backoff`]: the waits between streams.
//! - [`client`]: the stream loop.
//! - [`problem`]: why a response is refused.
//!
//! This module turns the settings into an [`XdsConfig`], checking everything that can be
//! checked before the first connection (URL, headers, TLS files).

mod ack;
mod backoff;
mod client;
mod convert;
mod problem;

use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::config::core::v3::node::UserAgentVersionType;
use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Struct, Value};
use tollgate_core::redact;
use tonic::metadata::{AsciiMetadataKey, AsciiMetadataValue, MetadataMap};
use tonic::transport::{ClientTlsConfig, Endpoint};

pub(crate) use backoff::BackoffPolicy;
pub(crate) use client::run;

use crate::config::settings::{HeaderMap, RuleArgs, XdsArgs};
use crate::net::tls::{self, TlsError};

/// The longest a connection attempt to the management server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Why the xDS settings cannot work.
#[derive(Debug, thiserror::Error)]
pub(crate) enum XdsSetupError {
    #[error("CONFIG_GRPC_XDS_SERVER_URL '{url}': {reason}")]
    Url { url: String, reason: String },
    #[error("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: '{name}' {reason}")]
    Header { name: String, reason: String },
    #[error(
        "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS: entries not like key:value: {0} (not \
         shown: they may hold a credential)"
    )]
    MalformedHeaders(usize),
    #[error(
        "CONFIG_GRPC_XDS_CLIENT_TLS_CERT and CONFIG_GRPC_XDS_CLIENT_TLS_KEY go together; only one is set"
    )]
    HalfKeyPair,
    #[error("xDS TLS: {0}")]
    Tls(#[from] TlsError),
    #[error("xDS TLS: {0}")]
    TlsConfig(String),
}

/// Everything the xDS client needs, checked.
#[derive(Debug, Clone)]
pub(crate) struct XdsConfig {
    /// The management server, as the user named it (for logs and `/rlconfig`).
    pub(crate) server: String,
    endpoint: Endpoint,
    node: Node,
    headers: MetadataMap,
    max_message_bytes: Option<usize>,
    connect_retry: Duration,
    backoff: BackoffPolicy,
    /// How pushed rules compile (defaults, merging, budget domains), as files do.
    pub(crate) rules: RuleArgs,
}

impl XdsConfig {
    /// Checks the settings and reads the TLS files. Returns the config and warnings about
    /// settings that are accepted but partly ignored.
    pub(crate) fn new(
        args: &XdsArgs,
        rules: &RuleArgs,
    ) -> Result<(Self, Vec<String>), XdsSetupError> {
        let (uri, tls) = endpoint_uri(&args.xds_server_url, args.xds_use_tls)?;
        let url_error = |reason: String| XdsSetupError::Url {
            url: redact::url(&args.xds_server_url),
            reason,
        };
        let mut endpoint = Endpoint::from_shared(uri)
            .map_err(|e| url_error(e.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT)
            // The stream is long-lived; keepalive notices a management server that is gone
            // without closing the connection.
            .http2_keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        if tls {
            endpoint = endpoint
                .tls_config(client_tls(args)?)
                .map_err(|e| XdsSetupError::TlsConfig(e.to_string()))?;
        }
        let (metadata, ignored) = node_metadata(&args.xds_node_metadata);
        let mut warnings: Vec<String> = ignored
            .into_iter()
            .map(|entry| {
                format!("CONFIG_GRPC_XDS_NODE_METADATA: '{entry}' is not key=value; ignored")
            })
            .collect();
        let tls_files = [
            args.xds_client_tls_cert.is_some(),
            args.xds_client_tls_key.is_some(),
            args.xds_server_tls_cacert.is_some(),
        ];
        if !tls && tls_files.contains(&true) {
            warnings.push(
                "CONFIG_GRPC_XDS_* TLS files are set but CONFIG_GRPC_XDS_SERVER_USE_TLS is not \
                 true: the connection to the xDS server is plaintext and they are not read"
                    .into(),
            );
        }
        let node = Node {
            id: args.xds_node_id.clone(),
            metadata: Some(metadata),
            user_agent_name: env!("CARGO_PKG_NAME").into(),
            user_agent_version_type: Some(UserAgentVersionType::UserAgentVersion(
                env!("CARGO_PKG_VERSION").into(),
            )),
            ..Node::default()
        };
        let config = Self {
            // Logs and `/rlconfig` name it: never with its password.
            server: redact::url(&args.xds_server_url),
            endpoint,
            node,
            headers: headers(&args.xds_additional_headers)?,
            max_message_bytes: (args.xds_max_msg_size > 0).then_some(args.xds_max_msg_size),
            connect_retry: args.xds_connect_retry_interval,
            backoff: BackoffPolicy {
                initial: args.xds_backoff_initial_interval,
                max: args
                    .xds_backoff_max_interval
                    .max(args.xds_backoff_initial_interval),
                random_factor: args.xds_backoff_random_factor,
                jitter: args.xds_backoff_jitter,
            },
            rules: rules.clone(),
        };
        Ok((config, warnings))
    }
}

/// The URI to dial and whether it is TLS. Accepts the reference's `host:port` (and gRPC's
/// `dns:///host:port`), or an `http://` / `https://` URL.
fn endpoint_uri(url: &str, use_tls: bool) -> Result<(String, bool), XdsSetupError> {
    let trimmed = url.trim();
    let bare = trimmed.strip_prefix("dns:///").unwrap_or(trimmed);
    let error = |reason: &str| XdsSetupError::Url {
        url: redact::url(url),
        reason: reason.to_owned(),
    };
    match bare.split_once("://") {
        None if bare.is_empty() => Err(error("empty")),
        None => {
            let scheme = if use_tls { "https" } else { "http" };
            Ok((format!("{scheme}://{bare}"), use_tls))
        }
        Some(("https", _)) => Ok((bare.to_owned(), true)),
        Some(("http", _)) if use_tls => Err(error(
            "an http:// URL with CONFIG_GRPC_XDS_SERVER_USE_TLS=true; use https:// or host:port",
        )),
        Some(("http", _)) => Ok((bare.to_owned(), false)),
        Some(_) => Err(error(
            "use host:port, http://host:port or https://host:port",
        )),
    }
}

/// TLS to the management server: system roots plus the CA file, the client certificate
/// if given, and the name to verify (the SAN setting, else the URL's host).
fn client_tls(args: &XdsArgs) -> Result<ClientTlsConfig, XdsSetupError> {
    let roots = tls::roots(
        args.xds_server_tls_cacert.as_deref(),
        "CONFIG_GRPC_XDS_SERVER_TLS_CACERT",
    )?;
    let mut config = ClientTlsConfig::new().trust_anchors(roots.roots);
    match (&args.xds_client_tls_cert, &args.xds_client_tls_key) {
        (Some(cert), Some(key)) => {
            config = config.identity(tls::KeyPair::load(cert, key)?.identity());
        }
        (None, None) => {}
        _ => return Err(XdsSetupError::HalfKeyPair),
    }
    if let Some(san) = args.xds_server_tls_san.as_deref().filter(|s| !s.is_empty()) {
        config = config.domain_name(san);
    }
    Ok(config)
}

/// `key=value[,key=value…]` as Node metadata string fields, as the reference reads it;
/// also the entries that are not `key=value`, which it drops.
fn node_metadata(text: &str) -> (Struct, Vec<String>) {
    let mut fields = std::collections::HashMap::new();
    let mut ignored = Vec::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        match entry.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                let value = Value {
                    kind: Some(Kind::StringValue(value.trim().to_owned())),
                };
                fields.insert(key.trim().to_owned(), value);
            }
            _ => ignored.push(entry.to_owned()),
        }
    }
    (Struct { fields }, ignored)
}

/// The extra headers as gRPC metadata; an entry that is not `key:value`, and a name or
/// value gRPC cannot carry, are errors (that never quote a value).
fn headers(headers: &HeaderMap) -> Result<MetadataMap, XdsSetupError> {
    if headers.malformed > 0 {
        return Err(XdsSetupError::MalformedHeaders(headers.malformed));
    }
    let mut map = MetadataMap::new();
    for (name, value) in &headers.pairs {
        let error = |reason: &str| XdsSetupError::Header {
            name: name.clone(),
            reason: reason.to_owned(),
        };
        let key: AsciiMetadataKey = name
            .parse()
            .map_err(|_| error("is not a valid gRPC metadata name"))?;
        if name.ends_with("-bin") {
            return Err(error("is a binary header; only text headers are supported"));
        }
        let value: AsciiMetadataValue = value
            .parse()
            .map_err(|_| error("has a value gRPC metadata cannot carry"))?;
        map.insert(key, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_urls_in_the_forms_the_reference_takes() {
        let ok = |url: &str, tls: bool| endpoint_uri(url, tls).expect("valid");
        assert_eq!(
            ok("localhost:18000", false),
            ("http://localhost:18000".into(), false)
        );
        assert_eq!(
            ok("envoy-gateway:18001", true),
            ("https://envoy-gateway:18001".into(), true)
        );
        assert_eq!(
            ok("dns:///eg:18001", true),
            ("https://eg:18001".into(), true)
        );
        assert_eq!(ok("https://eg:1", false), ("https://eg:1".into(), true));
        for (url, tls) in [("", false), ("http://eg:1", true), ("unix:///x", false)] {
            let e = endpoint_uri(url, tls).expect_err(url);
            assert!(
                e.to_string().starts_with("CONFIG_GRPC_XDS_SERVER_URL"),
                "{e}"
            );
        }
    }

    #[test]
    fn node_metadata_takes_key_value_pairs_only() {
        let (meta, ignored) = node_metadata("cluster=eg, zone = a ,bad:form,,=x");
        let text = |k: &str| match meta.fields.get(k).and_then(|v| v.kind.clone()) {
            Some(Kind::StringValue(s)) => s,
            other => panic!("{k}: {other:?}"),
        };
        assert_eq!(text("cluster"), "eg");
        assert_eq!(text("zone"), "a");
        assert_eq!(meta.fields.len(), 2);
        assert_eq!(ignored, ["bad:form", "=x"]);
    }

    #[test]
    fn headers_must_be_valid_grpc_metadata() {
        let pairs = |n: &str, v: &str| HeaderMap {
            pairs: vec![(n.to_owned(), v.to_owned())],
            malformed: 0,
        };
        let map = headers(&pairs("x-tenant", "blue")).expect("valid");
        assert_eq!(
            map.get("x-tenant").and_then(|v| v.to_str().ok()),
            Some("blue")
        );
        for (name, value) in [
            ("bad name", "v"),
            ("x-data-bin", "v"),
            ("x-ok", "line\nbreak"),
        ] {
            let e = headers(&pairs(name, value)).expect_err(name);
            assert!(e.to_string().contains(&format!("'{name}'")), "{e}");
        }
        let malformed = HeaderMap {
            pairs: Vec::new(),
            malformed: 1,
        };
        let e = headers(&malformed).expect_err("not key:value");
        assert!(e.to_string().contains("not like key:value: 1"), "{e}");
    }
}
