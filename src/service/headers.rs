//! Response headers telling clients their quota, from the tightest descriptor status.

use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::DescriptorStatus;

/// Which headers, if any, a response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeaderStyle {
    Off,
    /// The reference's `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    Reference,
    /// The IETF draft's `RateLimit-Policy: "name";q=100;w=60` and `RateLimit: "name";r=0;t=12`.
    Draft,
}

/// The headers for `statuses`, describing the limited status with the fewest units left.
pub fn headers(style: HeaderStyle, statuses: &[DescriptorStatus]) -> Vec<HeaderValue> {
    let tightest = statuses
        .iter()
        .enumerate()
        .filter(|(_, s)| s.current_limit.is_some())
        .min_by_key(|(_, s)| s.limit_remaining);
    let Some((index, status)) = tightest else {
        return Vec::new();
    };
    let Some(limit) = &status.current_limit else {
        return Vec::new();
    };
    // Whole seconds, rounded up: waiting the advertised time must be enough.
    let reset = status
        .duration_until_reset
        .as_ref()
        .map_or(0, |d| d.seconds.max(0) + i64::from(d.nanos > 0));
    let header = |key: &str, value: String| HeaderValue {
        key: key.to_owned(),
        value,
        ..Default::default()
    };
    match style {
        HeaderStyle::Off => Vec::new(),
        HeaderStyle::Reference => vec![
            header("RateLimit-Limit", limit.requests_per_unit.to_string()),
            header("RateLimit-Remaining", status.limit_remaining.to_string()),
            header("RateLimit-Reset", reset.to_string()),
        ],
        HeaderStyle::Draft => {
            let name = if limit.name.is_empty() {
                format!("descriptor-{index}")
            } else {
                limit.name.replace(['"', '\\'], "")
            };
            let window = unit_seconds(limit.unit);
            vec![
                header(
                    "RateLimit-Policy",
                    format!("\"{name}\";q={};w={window}", limit.requests_per_unit),
                ),
                header(
                    "RateLimit",
                    format!("\"{name}\";r={};t={reset}", status.limit_remaining),
                ),
            ]
        }
    }
}

fn unit_seconds(unit: i32) -> u64 {
    use crate::limiter::Unit;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit as P;
    let unit = match P::try_from(unit) {
        Ok(P::Minute) => Unit::Minute,
        Ok(P::Hour) => Unit::Hour,
        Ok(P::Day) => Unit::Day,
        Ok(P::Week) => Unit::Week,
        Ok(P::Month) => Unit::Month,
        Ok(P::Year) => Unit::Year,
        _ => Unit::Second,
    };
    unit.seconds()
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::RateLimit;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    use envoy_types::pb::google::protobuf::Duration;

    fn status(name: &str, limit: u32, remaining: u32, reset: (i64, i32)) -> DescriptorStatus {
        DescriptorStatus {
            current_limit: Some(RateLimit {
                name: name.into(),
                requests_per_unit: limit,
                unit: Unit::Minute.into(),
            }),
            limit_remaining: remaining,
            duration_until_reset: Some(Duration {
                seconds: reset.0,
                nanos: reset.1,
            }),
            ..Default::default()
        }
    }

    fn pairs(h: Vec<HeaderValue>) -> Vec<(String, String)> {
        h.into_iter().map(|h| (h.key, h.value)).collect()
    }

    #[test]
    fn reference_headers_describe_the_fewest_remaining() {
        let statuses = [
            status("a", 100, 40, (30, 0)),
            DescriptorStatus::default(),
            status("b", 10, 0, (57, 500)),
        ];
        assert_eq!(
            pairs(headers(HeaderStyle::Reference, &statuses)),
            [
                ("RateLimit-Limit".to_owned(), "10".to_owned()),
                ("RateLimit-Remaining".to_owned(), "0".to_owned()),
                ("RateLimit-Reset".to_owned(), "58".to_owned()),
            ]
        );
    }

    #[test]
    fn draft_headers_name_the_policy() {
        let statuses = [status("per-user", 100, 7, (12, 0))];
        assert_eq!(
            pairs(headers(HeaderStyle::Draft, &statuses)),
            [
                (
                    "RateLimit-Policy".to_owned(),
                    "\"per-user\";q=100;w=60".to_owned()
                ),
                ("RateLimit".to_owned(), "\"per-user\";r=7;t=12".to_owned()),
            ]
        );
    }

    #[test]
    fn no_limited_status_means_no_headers() {
        assert!(headers(HeaderStyle::Reference, &[DescriptorStatus::default()]).is_empty());
        assert!(headers(HeaderStyle::Off, &[status("a", 1, 0, (1, 0))]).is_empty());
    }
}
