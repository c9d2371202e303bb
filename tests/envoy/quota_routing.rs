//! Routing to the model that has quota, through a real Envoy
//! (`examples/envoy/quota-routing/`): two upstream models behind subset load balancing,
//! Tollgate's answer naming the models whose quota groups are not over, Envoy routing on
//! it, and the usage charged at stream end to the model that served. The three scenarios
//! of Envoy AI Gateway's issue 2460, in turn.

use std::time::Duration;

use tollgate_testkit::envoy::{Envoy, Upstream, render_models, upstream};
use tollgate_testkit::grpc::Rls;
use tollgate_testkit::tollgate::{Serve, Server};
use tollgate_testkit::wait;

const ENVOY_YAML: &str = include_str!("../../examples/envoy/quota-routing/envoy.yaml");
const RULES: &str = include_str!("../../examples/envoy/quota-routing/rules.yaml");

/// How long a charge sent at stream end (fire and forget) may take to be counted.
const CHARGED: Duration = Duration::from_secs(10);

/// The two models, Envoy in front of them, and Tollgate answering it.
struct Edge {
    models: [Upstream; 2],
    envoy: Envoy,
    _tollgate: Server,
    rls: Rls,
}

impl Edge {
    async fn start() -> Self {
        Self::start_with(true).await
    }

    /// [`Edge::start`], Tollgate returning dynamic metadata or not (`metadata`).
    async fn start_with(metadata: bool) -> Self {
        let tollgate = Serve::rules(RULES)
            .env("RESPONSE_DYNAMIC_METADATA", metadata.to_string())
            .start();
        let models = [Upstream::start().await, Upstream::start().await];
        let yaml = render_models(
            ENVOY_YAML,
            [models[0].addr, models[1].addr],
            tollgate.grpc_addr(),
        );
        let envoy = Envoy::start(&yaml).await;
        let rls = tollgate.client().await;
        Self {
            models,
            envoy,
            _tollgate: tollgate,
            rls,
        }
    }

    /// A request of `tenant`, the model reporting `tokens`: its status, and the requests
    /// each model has served since the start.
    async fn ask(&self, tenant: &str, tokens: u64) -> (u16, [usize; 2]) {
        let tokens = tokens.to_string();
        let headers = [
            ("x-tenant", tenant),
            (upstream::REPORT_USAGE, tokens.as_str()),
            // A client naming a model is not heard: Tollgate's answer decides.
            ("x-model", "a"),
        ];
        let status = self.envoy.get("/v1/chat", &headers).await.status;
        (status, [self.models[0].hits(), self.models[1].hits()])
    }

    /// Waits until `model`'s bucket for `tenant` (or its default bucket, without one)
    /// has `left` tokens.
    async fn await_left(&mut self, model: &str, tenant: Option<&str>, left: u32) {
        let mut entries = vec![("model", model)];
        entries.extend(tenant.map(|t| ("tenant", t)));
        let rls = &mut self.rls;
        wait::until_async(
            &format!("{entries:?} has {left} left"),
            CHARGED,
            async || {
                let status = rls.check_own_hits("llm", &entries, 0, false).await;
                match status.limit_remaining {
                    n if n == left => Ok(()),
                    n => Err(format!("{n} left")),
                }
            },
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_to_the_model_whose_group_has_quota() {
    let mut edge = Edge::start().await;
    // Both have quota: a, the first candidate.
    assert_eq!(edge.ask("t", 1_001).await, (200, [1, 0]));
    edge.await_left("a", Some("t"), 0).await;
    // Scenario: the tenant spent its bucket of model a; a still has room for others.
    assert_eq!(
        edge.ask("t", 1).await,
        (200, [1, 1]),
        "the tenant goes to b"
    );
    edge.await_left("b", Some("t"), 999).await;
    assert_eq!(edge.ask("u", 1).await, (200, [2, 1]), "another tenant to a");
    edge.await_left("a", Some("u"), 999).await;
    // Scenario: model a's default bucket spent (by tenant `v`): everyone goes to b.
    assert_eq!(edge.ask("v", 10_000).await, (200, [3, 1]));
    edge.await_left("a", None, 0).await;
    assert_eq!(edge.ask("u", 1).await, (200, [3, 2]), "a is out of quota");
    edge.await_left("b", Some("u"), 999).await;
    // Scenario: the tenant spends its bucket of b too; b's default bucket has room.
    assert_eq!(edge.ask("t", 1_000).await, (200, [3, 3]));
    edge.await_left("b", Some("t"), 0).await;
    assert_eq!(
        edge.ask("t", 1).await,
        (429, [3, 3]),
        "no model has quota for t"
    );
    assert_eq!(edge.ask("u", 1).await, (200, [3, 4]), "b still serves u");
}

/// Without Tollgate's answer naming a model, no subset matches: the client's own
/// `x-model` is dropped, never routed on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cannot_choose_the_model() {
    let edge = Edge::start_with(false).await;
    assert_eq!(edge.ask("t", 1).await, (503, [0, 0]));
}
