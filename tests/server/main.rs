//! Tollgate over gRPC and HTTP: the API, matching, limits of every shape, configuration
//! errors, the command line and operations. The memory store throughout; the algorithm
//! suite runs on a real redis-server too. The answers, matching, explain and reset run
//! the server in this process (`in_process.rs`); the rest start it as a process.

mod admin_token;
mod algorithms;
mod cli;
mod client;
mod config_errors;
mod decision_logs;
mod explain;
mod grpc_api;
mod http_api;
mod in_flight;
mod in_process;
mod library;
mod limits;
mod matching;
mod operations;
mod override_targets;
mod overrides;
mod quota_groups;
mod reset;
mod rlqs;
mod secrets;
mod startup;
mod terminal;
mod tls;
mod top;
mod tracing;
mod xds;
