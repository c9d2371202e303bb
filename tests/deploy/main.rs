//! What `deploy/` ships, checked against the real thing: the Helm chart rendered by a real
//! helm and its manifests run as a real Tollgate.

mod chart_lint;
mod chart_manifests;
mod chart_probes;
mod image;
