//! `tollgate client`: send one ShouldRateLimit request and print the answer.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use anyhow::Context as _;

use crate::cli::visible::visible;
use crate::config::settings::{ClientArgs, ClientTlsArgs, RequestArgs};
use crate::net::tls;

/// What a descriptor's text ends with to carry its own hits_addend.
const HITS_SUFFIX: &str = ";hits=";

/// Parses `k=v,k2=v2[;hits=N]` into descriptor entries and their own hits_addend.
pub(crate) fn parse_descriptor(text: &str) -> anyhow::Result<RateLimitDescriptor> {
    let (pairs, hits_addend) = match text.rsplit_once(HITS_SUFFIX) {
        Some((pairs, hits)) => {
            let hits = hits.parse::<u64>().with_context(|| {
                format!("descriptor '{text}': hits '{hits}' is not a whole number")
            })?;
            (pairs, Some(UInt64Value { value: hits }))
        }
        None => (text, None),
    };
    let entries = pairs
        .split(',')
        .map(|pair| match pair.split_once('=') {
            Some((key, value)) if !key.is_empty() => Ok(Entry {
                key: key.to_owned(),
                value: value.to_owned(),
            }),
            _ => Err(anyhow::anyhow!(
                "descriptor entry '{pair}' is not key=value"
            )),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RateLimitDescriptor {
        entries,
        hits_addend,
        ..Default::default()
    })
}

/// TLS as the arguments ask: the CA file alone, or the system's roots; the client
/// certificate; the name the server's certificate must carry.
fn client_tls(args: &ClientTlsArgs) -> anyhow::Result<ClientTlsConfig> {
    let roots = match &args.tls_ca {
        Some(ca) => tls::ca_only(ca)?,
        None => tls::roots(None, "--tls-ca")?,
    };
    let mut config = ClientTlsConfig::new().trust_anchors(roots.roots);
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config = config.identity(tls::KeyPair::load(cert, key)?.identity());
    }
    if let Some(name) = &args.tls_server_name {
        config = config.domain_name(name);
    }
    Ok(config)
}

/// A connection to `args.addr`, over TLS if asked.
async fn connect(args: &ClientArgs) -> anyhow::Result<Channel> {
    let scheme = if args.tls.enabled() { "https" } else { "http" };
    let uri = format!("{scheme}://{}", args.addr);
    let mut endpoint = Endpoint::from_shared(uri.clone())
        .with_context(|| format!("--addr '{}' is not host:port", args.addr))?;
    if args.tls.enabled() {
        endpoint = endpoint.tls_config(client_tls(&args.tls)?)?;
    }
    endpoint
        .connect()
        .await
        .with_context(|| format!("cannot connect to {uri}{}", transport_hint(args)))
}

/// What to try when the connection fails: the server may want TLS, or a client
/// certificate (whose refusal TLS 1.3 reports only once the call is under way).
fn transport_hint(args: &ClientArgs) -> &'static str {
    if !args.tls.enabled() {
        " (if the server serves TLS, add --tls or --tls-ca)"
    } else if args.tls.tls_cert.is_none() {
        " (if the server asks for a client certificate, add --tls-cert and --tls-key)"
    } else {
        ""
    }
}

/// The request `args` describe, with the request-level `hits_addend`.
pub(crate) fn request(args: &RequestArgs, hits_addend: u32) -> anyhow::Result<RateLimitRequest> {
    let descriptors = args
        .descriptor
        .iter()
        .map(|d| parse_descriptor(d))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(RateLimitRequest {
        domain: args.domain.clone(),
        descriptors,
        hits_addend,
    })
}

/// Sends the request; returns whether it was over the limit.
pub(crate) async fn run(args: ClientArgs) -> anyhow::Result<bool> {
    let request = request(&args.request, args.hits)?;
    let mut client = RateLimitServiceClient::new(connect(&args).await?);
    let response = client
        .should_rate_limit(request)
        .await
        .map_err(|s| {
            let transport = matches!(
                s.code(),
                tonic::Code::Internal
                    | tonic::Code::Unavailable
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
            );
            let hint = if transport { transport_hint(&args) } else { "" };
            anyhow::anyhow!("{:?}: {}{hint}", s.code(), visible(s.message()))
        })?
        .into_inner();
    let overall = code_name(response.overall_code);
    println!("overall: {overall}");
    for (i, status) in response.statuses.iter().enumerate() {
        println!("descriptor {i}: {}", describe(status));
    }
    Ok(response.overall_code == i32::from(Code::OverLimit))
}

fn code_name(code: i32) -> &'static str {
    Code::try_from(code).map_or("UNKNOWN", |c| c.as_str_name())
}

fn describe(status: &DescriptorStatus) -> String {
    let mut text = code_name(status.code).to_owned();
    if let Some(limit) = &status.current_limit {
        let unit = envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit::try_from(limit.unit)
            .map_or("UNKNOWN", |u| u.as_str_name());
        text.push_str(&format!(" limit={}/{unit}", limit.requests_per_unit));
        if !limit.name.is_empty() {
            text.push_str(&format!(" name={}", visible(&limit.name)));
        }
        text.push_str(&format!(" remaining={}", status.limit_remaining));
        if let Some(d) = &status.duration_until_reset {
            let seconds = d.seconds as f64 + f64::from(d.nanos) / 1e9;
            text.push_str(&format!(" reset={seconds:.3}s"));
        }
    } else if status.limit_remaining == u32::MAX {
        text.push_str(" unlimited");
    } else {
        // The reference's answer for a descriptor no rule limits: OK, no limit, nothing left.
        text.push_str(" no rule matched (not limited; `tollgate explain` says why)");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::parse_descriptor;

    #[test]
    fn descriptors_are_key_value_lists_with_their_own_hits() {
        let d = parse_descriptor("a=1,b=x=y").expect("parses");
        let pairs: Vec<_> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(pairs, [("a", "1"), ("b", "x=y")]);
        assert_eq!(d.hits_addend, None);
        let with_hits = parse_descriptor("a=1;x,b=2;hits=5").expect("parses");
        assert_eq!(with_hits.hits_addend.map(|h| h.value), Some(5));
        assert_eq!(with_hits.entries[0].value, "1;x");
        assert_eq!(
            parse_descriptor("a=1;hits=0")
                .map(|d| d.hits_addend.map(|h| h.value))
                .ok(),
            Some(Some(0))
        );
        assert!(parse_descriptor("a=1,nope").is_err());
        assert!(parse_descriptor("=v").is_err());
        let bad = parse_descriptor("a=1;hits=lots").expect_err("not a number");
        assert!(
            format!("{bad:#}").contains("hits 'lots' is not a whole number"),
            "{bad:#}"
        );
    }
}
