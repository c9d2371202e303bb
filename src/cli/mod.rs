//! The commands that ask a running server: `client`, `explain`, `reset`.

pub(crate) mod admin_client;
pub(crate) mod client;
