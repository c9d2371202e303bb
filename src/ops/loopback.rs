//! Who asked, and whether the asker may be trusted as loopback: its TCP peer on loopback
//! and every host the request names (`Host`, HTTP/2's `:authority`, an absolute URI's)
//! a loopback name or address. The peer alone is not enough: a browser on the host
//! follows a name rebound to 127.0.0.1 (DNS rebinding) and names that name as the host.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use axum::extract::ConnectInfo;
use axum::http::header::HOST;
use axum::http::{Extensions, HeaderMap, Uri};

/// The connection's peer address as logs show it; `unknown` when it has none.
pub(crate) fn peer(extensions: &Extensions) -> String {
    extensions
        .get::<ConnectInfo<SocketAddr>>()
        .map_or_else(|| "unknown".to_owned(), |ConnectInfo(p)| p.to_string())
}

/// Why the request of `uri` and `headers` is not a loopback one; none when it is.
pub(crate) fn refusal(extensions: &Extensions, uri: &Uri, headers: &HeaderMap) -> Option<String> {
    let peer = extensions.get::<ConnectInfo<SocketAddr>>();
    if !peer.is_some_and(|ConnectInfo(p)| p.ip().to_canonical().is_loopback()) {
        return Some("ask from loopback".to_owned());
    }
    let named: Vec<&[u8]> = uri
        .authority()
        .map(|a| a.as_str().as_bytes())
        .into_iter()
        .chain(headers.get_all(HOST).iter().map(|v| v.as_bytes()))
        .collect();
    if named.is_empty() {
        return Some("a request from loopback names no Host".to_owned());
    }
    if !named.iter().all(|host| names_loopback(host)) {
        return Some(
            "from loopback, the Host must be localhost, 127.0.0.1 or [::1] (another name may \
             be one rebound to this host by a web page)"
                .to_owned(),
        );
    }
    None
}

/// Whether `host` (`name`, `name:port`, `[v6]:port`) is `localhost` or a loopback address.
fn names_loopback(host: &[u8]) -> bool {
    let Ok(host) = std::str::from_utf8(host) else {
        return false;
    };
    if let Some(bracketed) = host.strip_prefix('[') {
        let Some((ip, rest)) = bracketed.split_once(']') else {
            return false;
        };
        let port_ok = rest.is_empty() || rest.strip_prefix(':').is_some_and(is_port);
        return port_ok
            && ip
                .parse::<Ipv6Addr>()
                .is_ok_and(|ip| IpAddr::V6(ip).to_canonical().is_loopback());
    }
    let (name, port_ok) = match host.split_once(':') {
        Some((name, port)) => (name, is_port(port)),
        None => (host, true),
    };
    port_ok
        && (name.eq_ignore_ascii_case("localhost")
            || name.parse::<Ipv4Addr>().is_ok_and(|ip| ip.is_loopback()))
}

/// A port as a URI writes it: digits, possibly none.
fn is_port(text: &str) -> bool {
    text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use axum::http::HeaderValue;

    use super::*;

    #[test]
    fn loopback_names_and_addresses_with_or_without_a_port() {
        for host in [
            "localhost",
            "LOCALHOST:8080",
            "localhost:",
            "127.0.0.1",
            "127.1.2.3:80",
            "[::1]",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:1",
        ] {
            assert!(names_loopback(host.as_bytes()), "{host}");
        }
        for host in [
            "",
            "localhost.evil.example",
            "127.0.0.1.nip.io",
            "evil.localhost",
            "localhost.",
            "2130706433",
            "0x7f.0.0.1",
            "0177.0.0.1",
            "::1",
            "[::1",
            "[::1]x",
            "[::1]:port",
            "[::2]",
            "[::1%lo]",
            "evil@127.0.0.1",
            "127.0.0.1:8080:80",
            "127.0.0.1:123456",
            "10.0.0.1",
        ] {
            assert!(!names_loopback(host.as_bytes()), "{host}");
        }
        assert!(!names_loopback(b"localhost\xff"));
    }

    fn from(peer: &str, uri: &str, hosts: &[&str]) -> Option<String> {
        let mut extensions = Extensions::new();
        extensions.insert(ConnectInfo(peer.parse::<SocketAddr>().expect("an address")));
        let mut headers = HeaderMap::new();
        for host in hosts {
            headers.append(HOST, HeaderValue::from_str(host).expect("a header"));
        }
        refusal(&extensions, &uri.parse().expect("a URI"), &headers)
    }

    #[test]
    fn the_peer_and_every_host_named_must_be_loopback() {
        assert_eq!(from("127.0.0.1:5000", "/top", &["localhost:8080"]), None);
        assert_eq!(from("[::1]:5000", "http://[::1]:8080/top", &[]), None);
        let far = from("192.0.2.1:5000", "/top", &["localhost"]);
        assert_eq!(far.as_deref(), Some("ask from loopback"));
        let none = from("127.0.0.1:5000", "/top", &[]);
        assert_eq!(
            none.as_deref(),
            Some("a request from loopback names no Host")
        );
        for (uri, hosts) in [
            ("/top", &["rebound.example:8080"][..]),
            ("/top", &["localhost", "rebound.example"]),
            ("http://rebound.example/top", &["127.0.0.1"]),
        ] {
            let refused = from("127.0.0.1:5000", uri, hosts);
            assert!(
                refused.is_some_and(|r| r.contains("the Host must be localhost")),
                "{uri} {hosts:?}"
            );
        }
    }
}
