//! What the server is told: settings from the command line and environment, and the rules
//! from files or xDS, kept current.

pub(crate) mod compat;
pub(crate) mod env_typos;
pub(crate) mod log_level;
pub(crate) mod reload;
pub(crate) mod rules_status;
pub(crate) mod settings;
pub(crate) mod watch;
pub(crate) mod xds;
