//! Request-carried limits with a cost through a real Envoy, as Envoy Gateway's
//! `limit.fromMetadata` sends them: each tenant's plan comes from request metadata as the
//! descriptor's `limit`, the request's cost as its `hits_addend`, and Tollgate counts the
//! cost against the plan, per tenant (config in `configs/limit_from_metadata.yaml`).

use tollgate_testkit::envoy::{Envoy, Upstream};
use tollgate_testkit::tollgate::Serve;

use crate::budgets::ports;

/// The domain must exist for a request's own limit to be counted; the rule's limit is
/// what a tenant without a plan gets.
const RULES: &str = "domain: plans\ndescriptors:\n  - key: tenant\n    rate_limit: {unit: minute, requests_per_unit: 1}\n";

const YAML: &str = include_str!("configs/limit_from_metadata.yaml");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_tenant_s_plan_and_each_request_s_cost_are_honoured() {
    let tollgate = Serve::rules(RULES).start();
    let upstream = Upstream::start().await;
    let yaml = ports(YAML, &[(5678, upstream.addr), (8081, tollgate.grpc_addr())]);
    let envoy = Envoy::start(&yaml).await;
    let call = async |tenant: &str, plan: &str, cost: &str| {
        let headers = [
            ("x-tenant", tenant),
            ("x-plan-limit", plan),
            ("x-cost", cost),
        ];
        envoy.get("/", &headers).await
    };

    // Acme's plan is 5 a minute and each call costs 2: 2, 4, then 6 is over.
    for remaining in [3, 1] {
        let answer = call("acme", "5", "2").await;
        assert_eq!(answer.status, 200, "{answer:?}");
        assert_eq!(
            answer
                .header("x-ratelimit-limit")
                .map(|l| l.split(',').next()),
            Some(Some("5")),
            "{answer:?}"
        );
        assert_eq!(
            answer.header_u64("x-ratelimit-remaining"),
            remaining,
            "{answer:?}"
        );
    }
    assert_eq!(call("acme", "5", "2").await.status, 429);
    // Globex's plan is 10 with a cost of 3: three fit, the fourth does not.
    for _ in 0..3 {
        assert_eq!(call("globex", "10", "3").await.status, 200);
    }
    assert_eq!(call("globex", "10", "3").await.status, 429);
    assert_eq!(
        upstream.hits(),
        5,
        "denied requests never reached the upstream"
    );
}
