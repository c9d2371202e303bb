//! What `deploy/` ships, checked against the real thing: the Helm chart rendered by a real
//! helm, its manifests run as a real Tollgate, and the Grafana dashboard's queries
//! against the `/metrics` of a real Tollgate that served real traffic.

mod chart_lint;
mod chart_manifests;
mod chart_probes;
mod chart_secrets;
mod dashboard;
mod image;
mod promql;
