//! `tollgate explain` (and the other admin commands): a request for the HTTP port built
//! from the command line, sent over HTTP/1.1 (over TLS with `--tls`), and the answer
//! printed for a person.

use std::borrow::Cow;
use std::time::Duration;

use anyhow::Context as _;
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::api::json::request_body;
use crate::cli::admin_tls;
use crate::cli::client::request;
use crate::cli::visible::{shown, visible};
use crate::config::settings::{AdminArgs, ClientTlsArgs, TopArgs};
use crate::ops::token;

/// How long connecting and the whole exchange may take.
const TIMEOUT: Duration = Duration::from_secs(10);
/// The largest answer read.
const MAX_ANSWER_BYTES: u64 = 4 << 20;

/// An HTTP answer: status and body.
struct Answer {
    status: u16,
    body: String,
}

/// Writes `request` on `stream` and reads until the server closes it.
async fn exchange(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    request: &str,
) -> std::io::Result<Vec<u8>> {
    stream.write_all(request.as_bytes()).await?;
    let mut raw = Vec::new();
    match stream.take(MAX_ANSWER_BYTES).read_to_end(&mut raw).await {
        // A TLS server may close without its close_notify: the answer is whole all the
        // same, as `Connection: close` ends it.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => Ok(raw),
        read => read.map(|_| raw),
    }
}

/// The status and body of an HTTP/1.1 answer whose connection closed after it.
fn parse_answer(raw: &[u8]) -> anyhow::Result<Answer> {
    let text = String::from_utf8_lossy(raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("the answer is not HTTP: {text:.200}"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("the answer has no status: {head:.200}"))?;
    Ok(Answer {
        status,
        body: body.to_owned(),
    })
}

/// Sends the arguments' request as `method path` and reads the JSON answer of a 200.
async fn ask(
    args: &AdminArgs,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> anyhow::Result<Value> {
    let body = request_body(&request(&args.request, 0)?);
    call_json(&args.http_addr, &args.tls, method, path, &body, token).await
}

/// Sends `method path` with a JSON `body` (and a bearer token) to `addr`, over TLS if
/// `tls` asks, and reads the JSON answer of a 200; any other status is the error, with
/// the server's words.
pub(super) async fn call_json(
    addr: &str,
    tls: &ClientTlsArgs,
    method: &str,
    path: &str,
    body: &str,
    token: Option<&str>,
) -> anyhow::Result<Value> {
    if let Some(token) = token {
        token::check("ADMIN_TOKEN (--admin-token)", token)?;
    }
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{auth}Connection: close\r\n\r\n{body}",
        body.len()
    );
    let answer = async {
        let tcp = TcpStream::connect(addr)
            .await
            .with_context(|| format!("cannot connect to {addr}"))?;
        let raw = if tls.enabled() {
            let mut stream = admin_tls::connect(tcp, addr, tls).await?;
            exchange(&mut stream, &request).await
        } else {
            exchange(&mut { tcp }, &request).await
        };
        parse_answer(&raw.with_context(|| format!("reading the answer of {addr}"))?)
    };
    let answer = tokio::time::timeout(TIMEOUT, answer)
        .await
        .map_err(|_| anyhow::anyhow!("{addr} did not answer within {TIMEOUT:?}"))??;
    if answer.status != 200 {
        let said = visible(answer.body.trim());
        anyhow::bail!("{addr} answered {}: {said}", answer.status);
    }
    serde_json::from_str(&answer.body)
        .with_context(|| format!("the answer is not JSON: {:.200}", answer.body))
}

/// `tollgate explain`: prints what the server says of each descriptor (and who set an
/// override, when `token` is the server's).
pub(crate) async fn explain(args: AdminArgs, token: Option<&str>) -> anyhow::Result<()> {
    print!("{}", render(&ask(&args, "POST", "/explain", token).await?));
    Ok(())
}

/// `tollgate reset`: prints the keys of the counters set back to empty.
pub(crate) async fn reset(args: AdminArgs, token: &str) -> anyhow::Result<()> {
    let reset = ask(&args, "DELETE", "/counters", Some(token)).await?;
    let empty = Vec::new();
    let keys = reset["reset"].as_array().unwrap_or(&empty);
    if keys.is_empty() {
        println!("no counter: no descriptor is limited by a rule");
    }
    for key in keys {
        println!("reset {}", shown(key));
    }
    Ok(())
}

/// `tollgate top`: prints the heaviest keys, one line each: count, error, rule, descriptor.
pub(crate) async fn top(args: TopArgs) -> anyhow::Result<()> {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for (name, value) in [("domain", &args.domain), ("rule", &args.rule)] {
        if let Some(value) = value {
            query.append_pair(name, value);
        }
    }
    query
        .append_pair("by", &args.by)
        .append_pair("window", &args.window)
        .append_pair("n", &args.n.to_string())
        .append_pair("scope", &args.scope);
    let path = format!("/top?{}", query.finish());
    let token = args.admin_token.as_deref();
    let top = call_json(&args.http_addr, &args.tls, "GET", &path, "", token).await?;
    print!("{}", render_top(&top));
    Ok(())
}

/// The top keys for a person: a heading, then `count ±error domain.rule descriptor`.
fn render_top(top: &Value) -> String {
    let by = shown(&top["by"]);
    let mut out = format!("top keys by {by} in the last {}\n", shown(&top["window"]));
    let empty = Vec::new();
    let entries = top["entries"].as_array().unwrap_or(&empty);
    if entries.is_empty() {
        out.push_str("none\n");
    }
    for e in entries {
        out.push_str(&format!(
            "{:>10} ±{:<6} {}.{} {}\n",
            e["count"],
            e["error"],
            shown(&e["domain"]),
            shown(&e["rule"]),
            shown(&e["descriptor"]),
        ));
    }
    out
}

/// The explanation for a person, one block per descriptor.
fn render(explained: &Value) -> String {
    let mut out = format!("overall: {}", shown(&explained["overallCode"]));
    match explained["error"].as_str() {
        // What the gRPC status says: `UNKNOWN: no rate limit configuration loaded`.
        Some(error) => out.push_str(&format!(
            ": {} (every call gets this error)\n",
            visible(error)
        )),
        None => out.push('\n'),
    }
    let empty = Vec::new();
    let descriptors = explained["descriptors"].as_array().unwrap_or(&empty);
    for (i, d) in descriptors.iter().enumerate() {
        let entries = shown(&d["descriptor"]);
        let matched = match (&d["rule"], &d["noRule"]) {
            (_, Value::String(why)) => format!("no rule matched ({})", visible(why)),
            (rule, _) if rule["override"] == true => "the request's own limit".to_owned(),
            (rule, _) => {
                let mut text = format!("rule {}.{}", shown(&rule["domain"]), shown(&rule["path"]));
                if let Some(names) = rule["names"].as_array().filter(|n| !n.is_empty()) {
                    let names: Vec<Cow<'_, str>> = names.iter().map(shown).collect();
                    text.push_str(&format!(" ({})", names.join(", ")));
                }
                if let Some(origins) = rule["origins"].as_array() {
                    let origins: Vec<Cow<'_, str>> = origins.iter().map(shown).collect();
                    text.push_str(&format!(" from {}", origins.join(", ")));
                }
                let by = &d["override"];
                if let Some(limit) = by["override"]["limit"].as_object() {
                    text.push_str(&format!(
                        ", overridden: {} per {} ({})",
                        limit.get("requests_per_unit").unwrap_or(&Value::Null),
                        shown(limit.get("unit").unwrap_or(&Value::Null)).to_lowercase(),
                        shown(&by["source"])
                    ));
                }
                if d["replaced"] == true {
                    text.push_str(", replaced by another matched rule");
                }
                text
            }
        };
        out.push_str(&format!("descriptor {i}: {entries}: {matched}\n"));
        if let Some(key) = d["key"].as_str() {
            out.push_str(&format!("  key: {}\n", visible(key)));
        }
        let shared = !d["store"].is_null() || !d["storeError"].is_null();
        let local = if shared { "local view" } else { "counter" };
        for (label, view) in [(local, &d["local"]), ("store", &d["store"])] {
            for limit in view["limits"].as_array().unwrap_or(&empty) {
                out.push_str(&format!(
                    "  {label}: count {} of {} (window {}), remaining {}, reset {}\n",
                    limit["count"],
                    shown(&limit["limit"]),
                    shown(&limit["window"]),
                    limit["remaining"],
                    shown(&limit["reset"]),
                ));
            }
        }
        if let Some(why) = d["storeError"].as_str() {
            out.push_str(&format!("  store: unreadable ({})\n", visible(why)));
        }
        let lease = &d["lease"];
        if !lease.is_null() {
            let ends = match lease["ends"].as_str() {
                Some(ends) => format!(" until its window ends in {}", visible(ends)),
                None => String::new(),
            };
            out.push_str(&format!(
                "  lease: {} units left, {} spendable now{ends}\n",
                lease["left"], lease["spendable"]
            ));
        }
        out.push_str(&format!("  decision: {}\n", shown(&d["decision"])));
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_override_is_shown_with_its_source() {
        let explained = json!({"descriptors": [{
            "descriptor": "tenant=acme",
            "rule": {"domain": "api", "path": "tenant"},
            "override": {
                "override": {"limit": {"requests_per_unit": 5, "unit": "MINUTE"}},
                "source": "set over HTTP by 127.0.0.1:5000",
            },
            "decision": "OK",
        }]});
        let text = render(&explained);
        assert!(
            text.contains(
                "rule api.tenant, overridden: 5 per minute (set over HTTP by 127.0.0.1:5000)\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_lease_is_shown_under_its_counter() {
        let explained = json!({"descriptors": [{
            "descriptor": "hot=one",
            "rule": {"domain": "rl", "path": "hot"},
            "key": "rl|hot",
            "lease": {"left": 30, "spendable": 12, "ends": "59.940s"},
            "decision": "OK",
        }]});
        let text = render(&explained);
        assert!(
            text.contains(
                "  lease: 30 units left, 12 spendable now until its window ends in 59.940s\n"
            ),
            "{text}"
        );
    }
}
