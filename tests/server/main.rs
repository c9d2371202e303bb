//! Tollgate as a process, over gRPC and HTTP: the API, matching, limits of every shape,
//! configuration errors, the command line and operations. The memory store throughout;
//! the algorithm suite runs on a real redis-server too.

mod algorithms;
mod cli;
mod client;
mod config_errors;
mod decision_logs;
mod explain;
mod grpc_api;
mod http_api;
mod limits;
mod matching;
mod operations;
mod reset;
mod rlqs;
mod secrets;
mod startup;
mod tls;
mod tracing;
mod xds;
