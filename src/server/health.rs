//! gRPC health, kept in step with the rules and the drain, and the wait for the first
//! rules.

use std::time::Duration;

use tokio::sync::watch;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::api::grpc::GrpcService;
use crate::config::rules_status::Readiness;

/// How often startup says it is still waiting for the first xDS rules.
const FIRST_RULES_NOTICE: Duration = Duration::from_secs(10);
/// The gRPC health names Envoy and Kubernetes probes use.
const HEALTH_NAMES: [&str; 2] = ["", "ratelimit"];

pub(super) async fn set_health(health: &HealthReporter, status: ServingStatus) {
    health
        .set_service_status(<GrpcService as tonic::server::NamedService>::NAME, status)
        .await;
    for name in HEALTH_NAMES {
        health.set_service_status(name, status).await;
    }
}

/// Waits until the first rules are in force, saying so in the log now and then.
pub(super) async fn first_rules(mut readiness: watch::Receiver<Readiness>, server: &str) {
    tracing::info!(%server, "waiting for the first rules from the xDS server before serving");
    loop {
        match tokio::time::timeout(FIRST_RULES_NOTICE, readiness.wait_for(|r| r.loaded)).await {
            // A closed channel cannot happen while the service lives; either way, go on.
            Ok(_) => return,
            Err(_) => tracing::warn!(
                %server,
                "still no rules from the xDS server; not serving until some arrive \
                 (FORCE_START_WITHOUT_INITIAL_CONFIG=true serves without them)"
            ),
        }
    }
}

/// Keeps gRPC health in step with the rules (HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED) and
/// the drain: serving while the rules are healthy and the server is not draining.
pub(super) async fn report_health(
    health: HealthReporter,
    mut rules: watch::Receiver<Readiness>,
    mut draining: watch::Receiver<bool>,
) {
    loop {
        let status = serving_status(*rules.borrow_and_update(), *draining.borrow_and_update());
        set_health(&health, status).await;
        tokio::select! {
            changed = rules.changed() => if changed.is_err() { return },
            changed = draining.changed() => if changed.is_err() { return },
        }
    }
}

pub(super) fn serving_status(rules: Readiness, draining: bool) -> ServingStatus {
    match rules.healthy && !draining {
        true => ServingStatus::Serving,
        false => ServingStatus::NotServing,
    }
}
