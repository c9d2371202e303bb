//! Building the descriptor statuses of a response.

use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit, rate_limit::Unit as ProtoUnit,
};
use envoy_types::pb::google::protobuf::Duration as ProtoDuration;

use crate::limiter::{Limit, Outcome, Unit};

/// OK, with no limit: nothing matched.
pub fn no_limit() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok.into(),
        ..Default::default()
    }
}

/// OK, unlimited: the reference reports the largest remaining count.
pub fn unlimited() -> DescriptorStatus {
    DescriptorStatus {
        code: Code::Ok.into(),
        limit_remaining: u32::MAX,
        ..Default::default()
    }
}

/// The status of a counted descriptor; shadow mode never denies.
pub fn limited(limits: &[Limit], outcome: Outcome, shadow_mode: bool) -> DescriptorStatus {
    let Some(limit) = limits.get(outcome.limit_index) else {
        return no_limit();
    };
    let d = outcome.decision;
    DescriptorStatus {
        code: if d.admitted || shadow_mode {
            Code::Ok
        } else {
            Code::OverLimit
        }
        .into(),
        current_limit: Some(RateLimit {
            name: limit.name.clone().unwrap_or_default(),
            requests_per_unit: limit.requests_per_unit,
            unit: proto_unit(limit.unit).into(),
        }),
        limit_remaining: u32::try_from(d.remaining).unwrap_or(u32::MAX),
        duration_until_reset: Some(duration(d.reset_ns)),
        ..Default::default()
    }
}

pub fn is_over(status: &DescriptorStatus) -> bool {
    status.code == i32::from(Code::OverLimit)
}

fn proto_unit(unit: Unit) -> ProtoUnit {
    match unit {
        Unit::Second => ProtoUnit::Second,
        Unit::Minute => ProtoUnit::Minute,
        Unit::Hour => ProtoUnit::Hour,
        Unit::Day => ProtoUnit::Day,
        Unit::Week => ProtoUnit::Week,
        Unit::Month => ProtoUnit::Month,
        Unit::Year => ProtoUnit::Year,
    }
}

/// Whole seconds, rounded up: Envoy's `x-ratelimit-reset` keeps only the seconds, and a
/// client that waits the advertised time must then be admitted.
fn duration(ns: u64) -> ProtoDuration {
    ProtoDuration {
        seconds: i64::try_from(ns.div_ceil(1_000_000_000)).unwrap_or(i64::MAX),
        nanos: 0,
    }
}
