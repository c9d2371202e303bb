//! Ready-made descriptor entries from an HTTP request, under the keys Envoy's own actions
//! use (`remote_address`, `path`, a header's name), so rules written for Envoy read the
//! same here.

use std::net::{IpAddr, SocketAddr};

use http::Request;
use tollgate_core::{Descriptor, Entry};

use crate::DescribeError;

/// Why [`client_ip`] finds no address, for the log.
const NO_PEER: &str = "the request carries no client address, so limits per client IP \
    can never apply: serve an axum app with \
    `app.into_make_service_with_connect_info::<SocketAddr>()` (and tollgate-tower's `axum` \
    feature on), or put the peer's `SocketAddr` into the request's extensions; behind a \
    proxy, use `extract::forwarded_for` instead";

/// The client's address: the connection's peer, as the server recorded it in the
/// request's extensions (`SocketAddr`, or axum's `ConnectInfo<SocketAddr>` with the `axum`
/// feature). A request without one is an error (the layer answers 500 and logs why):
/// the server is not set up to record peers, and no request would ever be limited.
pub fn client_ip<B>(req: &Request<B>) -> Result<Entry<'static>, DescribeError> {
    let peer = req.extensions().get::<SocketAddr>().copied();
    #[cfg(feature = "axum")]
    let peer = peer.or_else(|| {
        req.extensions()
            .get::<axum::extract::ConnectInfo<SocketAddr>>()
            .map(|info| info.0)
    });
    peer.map(|addr| ip_entry(addr.ip()))
        .ok_or(DescribeError::new(NO_PEER))
}

/// The client's address as the nearest proxy reported it: the last address of
/// `X-Forwarded-For` (the one the proxy itself appended; earlier ones are the client's
/// word and can be forged).
pub fn forwarded_for<B>(req: &Request<B>) -> Option<Entry<'static>> {
    let header = req.headers().get("x-forwarded-for")?.to_str().ok()?;
    let last = header.rsplit(',').next()?.trim();
    last.parse::<IpAddr>().ok().map(ip_entry)
}

fn ip_entry(ip: IpAddr) -> Entry<'static> {
    Entry {
        key: "remote_address".into(),
        value: ip.to_string().into(),
    }
}

/// The request path (without the query).
pub fn path<B>(req: &Request<B>) -> Entry<'static> {
    Entry {
        key: "path".into(),
        value: req.uri().path().to_owned().into(),
    }
}

/// A header's value, under the header's name; none if absent or not text.
pub fn header<B>(req: &Request<B>, name: &str) -> Option<Entry<'static>> {
    let value = req.headers().get(name)?.to_str().ok()?;
    Some(Entry {
        key: name.to_ascii_lowercase().into(),
        value: value.to_owned().into(),
    })
}

/// One descriptor `[remote_address, path]`: a limit per client and path; an error when
/// the server records no client address (see [`client_ip`]).
pub fn client_ip_and_path<B>(req: &Request<B>) -> Result<Vec<Descriptor<'static>>, DescribeError> {
    Ok(vec![Descriptor::from(vec![client_ip(req)?, path(req)])])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(e: &Entry<'_>) -> (String, String) {
        (e.key.to_string(), e.value.to_string())
    }

    #[test]
    fn entries_use_envoys_keys() {
        let mut req = Request::get("/api/users?page=2")
            .header("X-Api-Key", "k1")
            .header("x-forwarded-for", "203.0.113.9, 10.0.0.7")
            .body(())
            .expect("a request");
        req.extensions_mut()
            .insert(SocketAddr::from(([192, 0, 2, 1], 4711)));
        let got = |e: Option<Entry<'_>>| e.map(|e| pair(&e));
        assert_eq!(
            got(client_ip(&req).ok()),
            Some(("remote_address".into(), "192.0.2.1".into()))
        );
        assert_eq!(
            got(forwarded_for(&req)),
            Some(("remote_address".into(), "10.0.0.7".into()))
        );
        assert_eq!(pair(&path(&req)), ("path".into(), "/api/users".into()));
        assert_eq!(
            got(header(&req, "X-Api-Key")),
            Some(("x-api-key".into(), "k1".into()))
        );
        assert_eq!(got(header(&req, "missing")), None);
        let both = client_ip_and_path(&req).expect("a client address");
        let pairs: Vec<_> = both[0].entries.iter().map(pair).collect();
        assert_eq!(
            pairs,
            [
                ("remote_address".to_owned(), "192.0.2.1".to_owned()),
                ("path".to_owned(), "/api/users".to_owned())
            ]
        );
    }

    #[test]
    fn a_request_without_a_client_address_cannot_be_described_by_it() {
        let req = Request::get("/").body(()).expect("a request");
        let why = client_ip(&req).expect_err("no peer address").to_string();
        assert!(why.contains("into_make_service_with_connect_info"), "{why}");
        assert!(client_ip_and_path(&req).is_err());
        let forged = Request::get("/")
            .header("x-forwarded-for", "not an address")
            .body(())
            .expect("a request");
        assert!(forwarded_for(&forged).is_none());
    }
}
