//! The rate-limit API as Envoy calls it: request builders, a client with
//! assertion-friendly helpers, and checks of descriptor statuses.

use std::time::Duration;

use envoy_types::pb::google::protobuf::UInt64Value;
use tonic::transport::Channel;

pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
pub use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code, DescriptorStatus, RateLimit,
};
pub use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
pub use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};

/// Per-call timeout, so that a hung server fails the test instead of hanging it.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// A descriptor of `(key, value)` entries.
pub fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: (*key).to_owned(),
                value: (*value).to_owned(),
            })
            .collect(),
        ..Default::default()
    }
}

/// A request for `domain` with one descriptor per entry list.
pub fn request(domain: &str, descriptors: &[&[(&str, &str)]]) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors.iter().map(|d| descriptor(d)).collect(),
        hits_addend: 0,
    }
}

/// A rate-limit client. Clones share one HTTP/2 connection.
#[derive(Clone)]
pub struct Rls {
    pub inner: RateLimitServiceClient<Channel>,
}

impl Rls {
    pub fn new(channel: Channel) -> Self {
        Self {
            inner: RateLimitServiceClient::new(channel),
        }
    }

    pub async fn call(
        &mut self,
        req: RateLimitRequest,
    ) -> Result<RateLimitResponse, tonic::Status> {
        self.inner
            .should_rate_limit(req)
            .await
            .map(tonic::Response::into_inner)
    }

    /// A request that must succeed, with one status per descriptor.
    pub async fn ok(&mut self, req: RateLimitRequest) -> RateLimitResponse {
        let (domain, descriptors) = (req.domain.clone(), req.descriptors.len());
        let resp = self.call(req).await.unwrap_or_else(|status| {
            panic!(
                "ShouldRateLimit(domain {domain:?}, {descriptors} descriptors) failed: {status:?}"
            )
        });
        assert_eq!(
            resp.statuses.len(),
            descriptors,
            "one status per descriptor: {resp:?}"
        );
        resp
    }

    /// A request that must fail with INVALID_ARGUMENT; returns the message.
    pub async fn invalid(&mut self, req: RateLimitRequest) -> String {
        match self.call(req).await {
            Ok(resp) => panic!("expected INVALID_ARGUMENT, got {resp:?}"),
            Err(status) => {
                assert_eq!(
                    status.code(),
                    tonic::Code::InvalidArgument,
                    "wrong gRPC code: {status:?}"
                );
                status.message().to_owned()
            }
        }
    }

    /// One descriptor, default hits; returns its status.
    pub async fn check(&mut self, domain: &str, entries: &[(&str, &str)]) -> DescriptorStatus {
        self.check_hits(domain, entries, 0).await
    }

    /// One descriptor with its own `hits_addend` of `n`, given back when `negative`
    /// (`is_negative_hits`); returns its status.
    pub async fn check_own_hits(
        &mut self,
        domain: &str,
        entries: &[(&str, &str)],
        n: u64,
        negative: bool,
    ) -> DescriptorStatus {
        let mut req = request(domain, &[entries]);
        req.descriptors[0].hits_addend = Some(UInt64Value { value: n });
        req.descriptors[0].is_negative_hits = negative;
        self.ok(req).await.statuses.remove(0)
    }

    /// One descriptor with a request-level `hits_addend`; returns its status.
    pub async fn check_hits(
        &mut self,
        domain: &str,
        entries: &[(&str, &str)],
        hits_addend: u32,
    ) -> DescriptorStatus {
        let mut req = request(domain, &[entries]);
        req.hits_addend = hits_addend;
        let resp = self.ok(req).await;
        let status = resp.statuses[0].clone();
        assert_eq!(
            resp.overall_code, status.code,
            "overall code of a single-descriptor response: {resp:?}"
        );
        status
    }
}

pub fn code(status: &DescriptorStatus) -> Code {
    Code::try_from(status.code).unwrap_or_else(|_| panic!("unknown code in {status:?}"))
}

pub fn overall(resp: &RateLimitResponse) -> Code {
    Code::try_from(resp.overall_code).unwrap_or_else(|_| panic!("unknown code in {resp:?}"))
}

/// The limit a status reports.
pub fn limit(requests_per_unit: u32, unit: Unit, name: &str) -> RateLimit {
    RateLimit {
        name: name.to_owned(),
        requests_per_unit,
        unit: unit as i32,
    }
}

/// The status of a descriptor that matched no limit (or an unknown domain).
pub fn assert_unlimited(status: &DescriptorStatus) {
    assert_eq!(code(status), Code::Ok, "{status:?}");
    assert_eq!(status.current_limit, None, "no limit expected: {status:?}");
}

/// The status of a descriptor that matched `expected` with `remaining` left.
pub fn assert_limited(status: &DescriptorStatus, want: Code, expected: &RateLimit, remaining: u32) {
    assert_eq!(code(status), want, "{status:?}");
    assert_eq!(status.current_limit.as_ref(), Some(expected), "{status:?}");
    assert_eq!(status.limit_remaining, remaining, "{status:?}");
}

/// `duration_until_reset` (panics if absent or negative).
pub fn until_reset(status: &DescriptorStatus) -> Duration {
    let d = status
        .duration_until_reset
        .as_ref()
        .unwrap_or_else(|| panic!("duration_until_reset missing: {status:?}"));
    let seconds = u64::try_from(d.seconds).expect("non-negative seconds");
    let nanos = u32::try_from(d.nanos).expect("non-negative nanos");
    Duration::new(seconds, nanos)
}
