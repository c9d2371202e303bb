//! The state every admin route shares, apart from the router that serves them (so that
//! the handlers and the router do not import each other).

use std::sync::Arc;

use axum::extract::FromRef;
use tokio::sync::watch;
use tollgate_core::LogLimit;

use crate::app::App;

/// What the admin routes share: the service, whether the server is draining, the
/// token that allows resets and overrides (none: they are off), and how often refused
/// admin calls are logged.
#[derive(Clone)]
pub(crate) struct Admin {
    pub(crate) app: Arc<App>,
    pub(crate) draining: watch::Receiver<bool>,
    pub(crate) admin_token: Option<Arc<str>>,
    pub(crate) refused_resets: Arc<LogLimit>,
}

impl FromRef<Admin> for Arc<App> {
    fn from_ref(admin: &Admin) -> Self {
        admin.app.clone()
    }
}
