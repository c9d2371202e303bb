//! What answers say: shadow and quota modes, response headers, dynamic metadata.

use super::flag::Flag as _;
use super::parse::{parse_header_name, parse_ratio};
use clap::{Args, ValueEnum};

/// How answers are shaped beyond what the rules say.
#[derive(Debug, Args)]
pub(crate) struct AnswerArgs {
    /// Hits above this fraction of a limit are counted as near_limit in metrics.
    #[arg(long, env = "NEAR_LIMIT_RATIO", default_value_t = 0.8, value_parser = parse_ratio)]
    pub(crate) near_limit_ratio: f64,
    /// Never deny: the overall answer is OK while statuses still say OVER_LIMIT.
    #[arg(long, env = "SHADOW_MODE", default_value_t = false, flag())]
    pub(crate) shadow_mode: bool,
    /// Add rate-limit headers for Envoy to return to clients.
    #[arg(
        long,
        env = "LIMIT_RESPONSE_HEADERS_ENABLED",
        default_value_t = false,
        flag()
    )]
    pub(crate) limit_response_headers: bool,
    /// Name of the reference-style header of the limit.
    #[arg(long, env = "LIMIT_LIMIT_HEADER", default_value = "RateLimit-Limit", value_parser = parse_header_name)]
    pub(crate) limit_limit_header: String,
    /// Name of the reference-style header of what remains.
    #[arg(long, env = "LIMIT_REMAINING_HEADER", default_value = "RateLimit-Remaining", value_parser = parse_header_name)]
    pub(crate) limit_remaining_header: String,
    /// Name of the reference-style header of the seconds until the reset.
    #[arg(long, env = "LIMIT_RESET_HEADER", default_value = "RateLimit-Reset", value_parser = parse_header_name)]
    pub(crate) limit_reset_header: String,
    /// Header style: the reference's RateLimit-Limit/-Remaining/-Reset, or the IETF
    /// draft's RateLimit-Policy and RateLimit.
    #[arg(long, env = "RESPONSE_HEADERS_FORMAT", value_enum, default_value_t = HeaderFormat::Reference)]
    pub(crate) response_headers_format: HeaderFormat,
    /// Every descriptor is a budget (the reference's global quota mode): the request is
    /// denied only when all its descriptors are over, and consumption is charged.
    #[arg(long, env = "QUOTA_MODE", default_value_t = false, flag())]
    pub(crate) quota_mode: bool,
    /// Return the domain, the descriptors and the merged metadata of the descriptors that
    /// are not over in the response's dynamic metadata, for Envoy to route on.
    #[arg(
        long,
        env = "RESPONSE_DYNAMIC_METADATA",
        default_value_t = false,
        flag()
    )]
    pub(crate) response_dynamic_metadata: bool,
    /// A refused request is counted on none of its descriptors (what they counted is
    /// given back); false: each descriptor counts on its own. In REFERENCE_MODE, true is
    /// the reference's scheme (the descriptors that would go over are counted, the others
    /// not) [default: true; false in REFERENCE_MODE]
    #[arg(long, env = "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT", flag())]
    pub(crate) stop_cache_key_increment_when_overlimit: Option<bool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum HeaderFormat {
    Reference,
    Draft,
}
