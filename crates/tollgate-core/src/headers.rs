//! Response headers telling clients their quota, built from a [`Decision`]: the limit of
//! the counted descriptor with the fewest units left. Names and values only, so that every
//! adapter (gRPC, the tower middleware) sends the same headers.

use crate::decision::Decision;

/// Which headers, if any, a response carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeaderStyle {
    /// None.
    #[default]
    Off,
    /// The reference's `RateLimit-Limit`, `RateLimit-Remaining`, `RateLimit-Reset`.
    Reference,
    /// The IETF draft's `RateLimit-Policy: "name";q=100;w=60` and `RateLimit: "name";r=0;t=12`.
    Draft,
}

/// The headers for `decision` in `style`, as (name, value) pairs.
pub fn headers(style: HeaderStyle, decision: &Decision) -> Vec<(&'static str, String)> {
    let Some((index, tightest)) = decision.tightest() else {
        return Vec::new();
    };
    let limit = &tightest.limit;
    let remaining = tightest.remaining.min(u64::from(u32::MAX));
    let reset = tightest.reset_seconds();
    match style {
        HeaderStyle::Off => Vec::new(),
        HeaderStyle::Reference => vec![
            ("RateLimit-Limit", limit.requests_per_unit().to_string()),
            ("RateLimit-Remaining", remaining.to_string()),
            ("RateLimit-Reset", reset.to_string()),
        ],
        HeaderStyle::Draft => {
            let name = match limit.name() {
                Some(name) if !name.is_empty() => name.replace(['"', '\\'], ""),
                _ => format!("descriptor-{index}"),
            };
            // The real window: a limit per 30 s is w=30, whatever unit Envoy is told.
            let window = limit.window().as_secs();
            vec![
                (
                    "RateLimit-Policy",
                    format!("\"{name}\";q={};w={window}", limit.requests_per_unit()),
                ),
                ("RateLimit", format!("\"{name}\";r={remaining};t={reset}")),
            ]
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::decision::{Limited, Outcome};
    use crate::limit::Limit;
    use crate::unit::Unit;

    fn limited(limit: Limit, remaining: u64, reset: Duration) -> Outcome {
        Outcome::Limited(Limited {
            limit,
            admitted: remaining > 0,
            shadow: false,
            quota: false,
            remaining,
            reset,
            hits: 1,
            metadata: None,
            group_over: false,
            in_flight: None,
        })
    }

    fn decision(descriptors: Vec<Outcome>) -> Decision {
        Decision {
            over_limit: false,
            descriptors,
        }
    }

    #[test]
    fn reference_headers_describe_the_fewest_remaining() {
        let d = decision(vec![
            limited(Limit::new(100, Unit::Minute), 40, Duration::from_secs(30)),
            Outcome::NoLimit,
            limited(
                Limit::new(10, Unit::Minute),
                0,
                Duration::from_millis(57_500),
            ),
        ]);
        assert_eq!(
            headers(HeaderStyle::Reference, &d),
            [
                ("RateLimit-Limit", "10".to_owned()),
                ("RateLimit-Remaining", "0".to_owned()),
                ("RateLimit-Reset", "58".to_owned()),
            ]
        );
    }

    #[test]
    fn draft_headers_name_the_policy_and_its_real_window() {
        let per_user = Limit::new(100, Unit::Minute).with_name("per-user");
        let d = decision(vec![limited(per_user, 7, Duration::from_secs(12))]);
        assert_eq!(
            headers(HeaderStyle::Draft, &d),
            [
                ("RateLimit-Policy", "\"per-user\";q=100;w=60".to_owned()),
                ("RateLimit", "\"per-user\";r=7;t=12".to_owned()),
            ]
        );
        let per_30s = Limit::new(5, Unit::Second)
            .with_multiplier(30)
            .expect("valid window");
        let d = decision(vec![limited(per_30s, 1, Duration::from_secs(3))]);
        assert_eq!(
            headers(HeaderStyle::Draft, &d)[0],
            ("RateLimit-Policy", "\"descriptor-0\";q=5;w=30".to_owned())
        );
    }

    #[test]
    fn no_limited_status_means_no_headers() {
        assert!(headers(HeaderStyle::Reference, &decision(vec![Outcome::NoLimit])).is_empty());
        let d = decision(vec![limited(
            Limit::new(1, Unit::Second),
            0,
            Duration::from_secs(1),
        )]);
        assert!(headers(HeaderStyle::Off, &d).is_empty());
    }
}
