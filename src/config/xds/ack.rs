//! The client's half of the State-of-the-World handshake: what to send when a stream
//! opens, and the ACK or NACK that answers each response. Pure bookkeeping, no I/O.

use envoy_types::pb::envoy::config::core::v3::Node;
use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};
use envoy_types::pb::google::rpc::Status;
use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitConfig;
use prost::Name;

/// gRPC's INTERNAL, the code Envoy puts in the `error_detail` of its NACKs.
const NACK_CODE: i32 = 13;

/// A wildcard subscription to `RateLimitConfig` and the last version accepted.
#[derive(Debug, Clone)]
pub(crate) struct Subscription {
    node: Node,
    type_url: String,
    acked_version: String,
}

impl Subscription {
    pub(crate) fn new(node: Node) -> Self {
        Self {
            node,
            type_url: RateLimitConfig::type_url(),
            acked_version: String::new(),
        }
    }

    /// The type subscribed to.
    pub(crate) fn type_url(&self) -> &str {
        &self.type_url
    }

    /// The first request of a stream: all resources of the type (no names), with the
    /// version already in force so that a server that still has it need not send it
    /// again. Nonces belong to one stream, so a new stream starts without one.
    pub(crate) fn initial(&self) -> DiscoveryRequest {
        self.request(self.acked_version.clone(), String::new(), None)
    }

    /// Accepts `response`: its version is the one in force from now on.
    pub(crate) fn ack(&mut self, response: &DiscoveryResponse) -> DiscoveryRequest {
        self.acked_version = response.version_info.clone();
        self.request(self.acked_version.clone(), response.nonce.clone(), None)
    }

    /// Rejects `response`: the version in force stays the last accepted one, and the
    /// error names every problem, one per line.
    pub(crate) fn nack(
        &self,
        response: &DiscoveryResponse,
        problems: &[impl std::fmt::Display],
    ) -> DiscoveryRequest {
        let detail = Status {
            code: NACK_CODE,
            message: problems
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("\n"),
            details: Vec::new(),
        };
        let mut request = self.request(
            self.acked_version.clone(),
            response.nonce.clone(),
            Some(detail),
        );
        // An answer is about the type the response carried.
        request.type_url = response.type_url.clone();
        request
    }

    fn request(
        &self,
        version_info: String,
        response_nonce: String,
        error_detail: Option<Status>,
    ) -> DiscoveryRequest {
        DiscoveryRequest {
            version_info,
            // Sent on every request, as the reference does: servers that key snapshots by
            // node may look at any of them.
            node: Some(self.node.clone()),
            resource_names: Vec::new(),
            resource_locators: Vec::new(),
            type_url: self.type_url.clone(),
            response_nonce,
            error_detail,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(version: &str, nonce: &str) -> DiscoveryResponse {
        DiscoveryResponse {
            version_info: version.into(),
            nonce: nonce.into(),
            type_url: RateLimitConfig::type_url(),
            ..Default::default()
        }
    }

    fn node() -> Node {
        Node {
            id: "envoy-ratelimit".into(),
            ..Default::default()
        }
    }

    #[test]
    fn a_fresh_stream_asks_for_everything() {
        let sub = Subscription::new(node());
        let first = sub.initial();
        assert_eq!(
            first.type_url,
            "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
        );
        assert!(first.resource_names.is_empty(), "wildcard");
        assert_eq!(first.version_info, "");
        assert_eq!(first.response_nonce, "");
        assert_eq!(first.node.map(|n| n.id).as_deref(), Some("envoy-ratelimit"));
    }

    #[test]
    fn ack_takes_the_version_and_nack_keeps_the_last_good_one() {
        let mut sub = Subscription::new(node());
        let ack = sub.ack(&response("1", "n1"));
        assert_eq!(
            (ack.version_info.as_str(), ack.response_nonce.as_str()),
            ("1", "n1")
        );
        assert_eq!(ack.error_detail, None);

        let problems = ["a: bad".to_owned(), "b: worse".to_owned()];
        let nack = sub.nack(&response("2", "n2"), &problems);
        assert_eq!(nack.version_info, "1", "the last accepted version");
        assert_eq!(nack.response_nonce, "n2", "the nonce received");
        let detail = nack.error_detail.expect("error detail");
        assert_eq!(detail.message, "a: bad\nb: worse");
        assert_eq!(detail.code, NACK_CODE);

        // A reconnect resumes from the accepted version, without the old stream's nonce.
        let again = sub.initial();
        assert_eq!(
            (again.version_info.as_str(), again.response_nonce.as_str()),
            ("1", "")
        );
        let ack = sub.ack(&response("3", "n3"));
        assert_eq!(ack.version_info, "3");
        assert_eq!(sub.initial().version_info, "3");
    }
}
