//! The Rate Limit Quota Service.

use super::parse::parse_timeout;
use clap::builder::RangedU64ValueParser;
use clap::{Args, ValueEnum};
use std::time::Duration;

/// The Rate Limit Quota Service.
#[derive(Debug, Args)]
pub(crate) struct RlqsArgs {
    /// A bucket that reports no request for this long is abandoned (Envoy forgets it and
    /// subscribes again at its next request).
    #[arg(long, env = "RLQS_BUCKET_IDLE_TIMEOUT", default_value = "60s", value_parser = parse_timeout)]
    pub(crate) rlqs_bucket_idle_timeout: Duration,
    /// Buckets held at most over all RLQS streams, a bucket once per stream reporting it
    /// (about 1 KiB each); a report that would go past it ends its stream with
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "RLQS_MAX_BUCKETS", default_value_t = 100_000, value_parser = RangedU64ValueParser::<usize>::new().range(1..=10_000_000))]
    pub(crate) rlqs_max_buckets: usize,
    /// What a bucket that matches no rule gets: allow (all requests) or deny (all).
    #[arg(
        long,
        env = "RLQS_NO_RULE_ACTION",
        value_enum,
        ignore_case = true,
        default_value = "allow"
    )]
    pub(crate) rlqs_no_rule_action: NoRuleAction,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum NoRuleAction {
    Allow,
    Deny,
}
