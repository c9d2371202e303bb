//! `tollgate client`: send one ShouldRateLimit request and print the answer.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;

use anyhow::Context as _;

use crate::settings::ClientArgs;

/// Parses `k=v,k2=v2` into descriptor entries.
fn parse_descriptor(text: &str) -> anyhow::Result<RateLimitDescriptor> {
    let entries = text
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
        ..Default::default()
    })
}

/// Sends the request; returns whether it was over the limit.
pub(crate) async fn run(args: ClientArgs) -> anyhow::Result<bool> {
    let descriptors = args
        .descriptor
        .iter()
        .map(|d| parse_descriptor(d))
        .collect::<Result<Vec<_>, _>>()?;
    let endpoint = format!("http://{}", args.addr);
    let mut client = RateLimitServiceClient::connect(endpoint.clone())
        .await
        .with_context(|| format!("cannot connect to {endpoint}"))?;
    let request = RateLimitRequest {
        domain: args.domain,
        descriptors,
        hits_addend: args.hits,
    };
    let response = client
        .should_rate_limit(request)
        .await
        .map_err(|s| anyhow::anyhow!("{:?}: {}", s.code(), s.message()))?
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
            text.push_str(&format!(" name={}", limit.name));
        }
        text.push_str(&format!(" remaining={}", status.limit_remaining));
        if let Some(d) = &status.duration_until_reset {
            let seconds = d.seconds as f64 + f64::from(d.nanos) / 1e9;
            text.push_str(&format!(" reset={seconds:.3}s"));
        }
    } else if status.limit_remaining == u32::MAX {
        text.push_str(" unlimited");
    }
    text
}

#[cfg(test)]
mod tests {
    use super::parse_descriptor;

    #[test]
    fn descriptors_are_key_value_lists() {
        let d = parse_descriptor("a=1,b=x=y").expect("parses");
        let pairs: Vec<_> = d
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(pairs, [("a", "1"), ("b", "x=y")]);
        assert!(parse_descriptor("a=1,nope").is_err());
        assert!(parse_descriptor("=v").is_err());
    }
}
