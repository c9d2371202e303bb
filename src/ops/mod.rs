//! What operators see and do: the HTTP admin port, metrics, statsd, logs, traces, explain,
//! reset, runtime overrides, the top keys and the /ui page.

pub(crate) mod admin;
pub(crate) mod admin_state;
pub(crate) mod debug_port;
pub(crate) mod explain;
pub(crate) mod log_format;
pub(crate) mod loopback;
pub(crate) mod metrics;
pub(crate) mod overrides;
pub(crate) mod reference_stats;
pub(crate) mod reset;
pub(crate) mod statsd;
pub(crate) mod token;
pub(crate) mod top;
pub(crate) mod trace;
pub(crate) mod trim;
pub(crate) mod ui;
pub(crate) mod unmatched;
