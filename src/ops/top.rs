//! `GET /top`: the heaviest keys of the rules, as JSON, of this instance or (`scope=fleet`)
//! of every instance sharing the store. Keys name clients (addresses, users), which is
//! personal data: answered to loopback requests (peer and Host), and to others only with
//! `Authorization: Bearer <ADMIN_TOKEN>` (compared in constant time).
//!
//! With a shared store, every instance publishes its heaviest keys through it every
//! [`PUBLISH_PERIOD`] ([`spawn_publisher`]).

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{RawQuery, State};
use axum::http::{Extensions, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tollgate_core::TopQuery;
use tollgate_core::top::{TopBy, TopEntry, TopWindow};

use crate::api::json::text;
use crate::app::App;
use crate::ops::admin_state::Admin;
use crate::ops::loopback;
use crate::ops::token::{Credentials, credentials, holds, refuse};

/// The most entries one answer holds.
pub(crate) const MAX_ENTRIES: usize = 1_000;
/// How often an instance publishes its heaviest keys through a shared store.
pub(crate) const PUBLISH_PERIOD: Duration = Duration::from_secs(5);

/// Publishes this instance's heaviest keys every [`PUBLISH_PERIOD`] while the server runs.
pub(crate) fn spawn_publisher(app: &Arc<App>) {
    let app = Arc::downgrade(app);
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(PUBLISH_PERIOD);
        loop {
            ticks.tick().await;
            let Some(app) = app.upgrade() else {
                return;
            };
            app.limiter.publish_top().await;
        }
    });
}

/// `GET /top?domain=web&rule=ip&by=denied&window=minute&n=10&scope=fleet`: 200 with the entries,
/// heaviest first; 400 for a bad parameter; 403 to a request that is neither a loopback
/// one ([`loopback`]) nor holding the admin token, and to a wrong token from afar.
pub(crate) async fn handler(
    State(admin): State<Admin>,
    extensions: Extensions,
    uri: Uri,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
) -> Response {
    if !holds(admin.admin_token.as_deref(), &headers)
        && let Some(why) = loopback::refusal(&extensions, &uri, &headers)
    {
        let why = match credentials(&headers) {
            Credentials::Bearer(_) => "wrong admin token\n".to_owned(),
            _ => format!(
                "top keys name clients: {why}; or ask with Authorization: Bearer <ADMIN_TOKEN>\n"
            ),
        };
        let peer = loopback::peer(&extensions);
        return refuse(&admin.refused_resets, &peer, StatusCode::FORBIDDEN, why);
    }
    let params = match Params::parse(query.as_deref().unwrap_or("")) {
        Ok(params) => params,
        Err(why) => return text(StatusCode::BAD_REQUEST, why.to_string()),
    };
    let entries = admin.app.limiter.top(&params.query());
    Json(answer(&params, &entries)).into_response()
}

/// `/top`'s parameters.
#[derive(Debug)]
pub(crate) struct Params {
    domain: Option<String>,
    rule: Option<String>,
    by: TopBy,
    window: TopWindow,
    n: usize,
    fleet: bool,
}

/// A `/top` parameter refused: its name or its value, and what is expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BadParam {
    #[error("parameter {0} is given twice")]
    Twice(String),
    #[error("unknown parameter {0}: /top takes domain, rule, by, window, n and scope")]
    Unknown(String),
    #[error("by={0}: expected hits, denied or shadow")]
    By(String),
    #[error("window={0}: expected minute or hour")]
    Window(String),
    #[error("n={0}: expected a number from 1 to {max}", max = MAX_ENTRIES)]
    N(String),
    #[error("scope={0}: expected instance or fleet")]
    Scope(String),
}

impl Params {
    /// The parameters of `query` (`a=b&c=d`); unknown or repeated names and bad values are
    /// refused with what is wrong.
    pub(crate) fn parse(query: &str) -> Result<Self, BadParam> {
        let mut params = Params {
            domain: None,
            rule: None,
            by: TopBy::Denied,
            window: TopWindow::Minute,
            n: 10,
            fleet: false,
        };
        let mut seen = Vec::new();
        for (name, value) in form_urlencoded::parse(query.as_bytes()) {
            if seen.contains(&name) {
                return Err(BadParam::Twice(name.into_owned()));
            }
            match &*name {
                "domain" => params.domain = Some(value.to_string()),
                "rule" => params.rule = Some(value.to_string()),
                "by" => params.by = by(&value)?,
                "window" => params.window = window(&value)?,
                "n" => params.n = n(&value)?,
                "scope" => params.fleet = fleet(&value)?,
                _ => return Err(BadParam::Unknown(name.into_owned())),
            }
            seen.push(name);
        }
        Ok(params)
    }

    fn query(&self) -> TopQuery<'_> {
        TopQuery {
            domain: self.domain.as_deref(),
            rule: self.rule.as_deref(),
            by: self.by,
            window: self.window,
            n: self.n,
            fleet: self.fleet,
        }
    }
}

fn by(value: &str) -> Result<TopBy, BadParam> {
    match value {
        "hits" => Ok(TopBy::Hits),
        "denied" => Ok(TopBy::Denied),
        "shadow" => Ok(TopBy::Shadow),
        _ => Err(BadParam::By(value.to_owned())),
    }
}

fn window(value: &str) -> Result<TopWindow, BadParam> {
    match value {
        "minute" => Ok(TopWindow::Minute),
        "hour" => Ok(TopWindow::Hour),
        _ => Err(BadParam::Window(value.to_owned())),
    }
}

fn n(value: &str) -> Result<usize, BadParam> {
    match value.parse::<usize>() {
        Ok(n @ 1..=MAX_ENTRIES) => Ok(n),
        _ => Err(BadParam::N(value.to_owned())),
    }
}

fn fleet(value: &str) -> Result<bool, BadParam> {
    match value {
        "instance" => Ok(false),
        "fleet" => Ok(true),
        _ => Err(BadParam::Scope(value.to_owned())),
    }
}

fn by_name(by: TopBy) -> &'static str {
    match by {
        TopBy::Hits => "hits",
        TopBy::Denied => "denied",
        TopBy::Shadow => "shadow",
    }
}

fn window_name(window: TopWindow) -> &'static str {
    match window {
        TopWindow::Minute => "minute",
        TopWindow::Hour => "hour",
    }
}

/// The JSON answer.
fn answer(params: &Params, entries: &[TopEntry]) -> Value {
    let entries: Vec<Value> = entries
        .iter()
        .map(|e| {
            json!({
                "domain": e.domain,
                "rule": e.rule,
                "descriptor": e.descriptor,
                "count": e.count,
                "error": e.error,
            })
        })
        .collect();
    json!({
        "by": by_name(params.by),
        "window": window_name(params.window),
        "scope": if params.fleet { "fleet" } else { "instance" },
        "entries": entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_are_read_and_bad_ones_named() {
        let p = Params::parse("domain=web&by=shadow&window=hour&n=3&rule=ip").expect("parses");
        assert_eq!(p.domain.as_deref(), Some("web"));
        assert_eq!((p.by, p.window, p.n), (TopBy::Shadow, TopWindow::Hour, 3));
        let err = |q| Params::parse(q).expect_err(q).to_string();
        assert_eq!(err("by=who"), "by=who: expected hits, denied or shadow");
        assert_eq!(err("n=0"), "n=0: expected a number from 1 to 1000");
        assert_eq!(err("n=x"), "n=x: expected a number from 1 to 1000");
        assert_eq!(err("n=1&n=2"), "parameter n is given twice");
        assert!(err("color=red").starts_with("unknown parameter color"));
    }
}
