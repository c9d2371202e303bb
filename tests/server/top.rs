//! `GET /top` and `tollgate top`: the heaviest keys of each rule by hits, denials and
//! shadow mode's would-be denials, after known traffic.

use serde_json::Value;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;
use tollgate_testkit::admin::TOKEN;
use tollgate_testkit::chromium;
use tollgate_testkit::http::{self, Method, get, get_with};
use tollgate_testkit::process;
use tollgate_testkit::tollgate::{self, COMMAND_TIMEOUT, Listening};
use tollgate_testkit::{h2_frames, http2};

use crate::in_process::InProcess;

const RULES: &str = r#"
domain: web
descriptors:
  - key: ip
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: trial
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
"#;

/// `ip=a` five times, `ip=b` three times, `ip=c` once; `trial=t` twice.
async fn known_traffic(server: &Listening) {
    let mut rls = server.client().await;
    for (value, times) in [("a", 5), ("b", 3), ("c", 1)] {
        for _ in 0..times {
            rls.check("web", &[("ip", value)]).await;
        }
    }
    for _ in 0..2 {
        rls.check("web", &[("trial", "t")]).await;
    }
}

async fn top(server: &Listening, query: &str) -> Value {
    let answer = get(server.http_addr(), &format!("/top?{query}")).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    serde_json::from_str(&answer.body).expect("JSON")
}

/// `(descriptor, count, error)` of each entry.
fn entries(top: &Value) -> Vec<(String, u64, u64)> {
    let entries = top["entries"].as_array().expect("entries");
    entries
        .iter()
        .map(|e| {
            let descriptor = e["descriptor"].as_str().expect("descriptor").to_owned();
            let count = e["count"].as_u64().expect("count");
            (descriptor, count, e["error"].as_u64().expect("error"))
        })
        .collect()
}

fn named(list: &[(&str, u64)]) -> Vec<(String, u64, u64)> {
    list.iter().map(|(d, c)| ((*d).to_owned(), *c, 0)).collect()
}

#[tokio::test]
async fn top_names_the_heaviest_keys_by_hits_denials_and_shadow() {
    let server = InProcess::rules(RULES).start();
    known_traffic(&server).await;

    let denied = top(&server, "domain=web&by=denied&n=10").await;
    assert_eq!(
        (&denied["by"], &denied["window"]),
        (&"denied".into(), &"minute".into())
    );
    assert_eq!(entries(&denied), named(&[("ip=a", 3), ("ip=b", 1)]));
    assert_eq!(denied["entries"][0]["rule"], "ip", "{denied}");
    assert_eq!(denied["entries"][0]["domain"], "web", "{denied}");

    let hits = top(&server, "domain=web&rule=ip&by=hits&window=hour&n=2").await;
    assert_eq!(entries(&hits), named(&[("ip=a", 5), ("ip=b", 3)]));

    let shadow = top(&server, "by=shadow").await;
    assert_eq!(entries(&shadow), named(&[("trial=t", 1)]));

    let bad = get(server.http_addr(), "/top?by=who").await;
    assert_eq!(bad.status, 400, "{bad:?}");
    assert_eq!(bad.body.trim(), "by=who: expected hits, denied or shadow");
}

#[tokio::test]
async fn tollgate_top_prints_them_for_a_person() {
    let server = InProcess::rules(RULES).start();
    known_traffic(&server).await;
    let mut cmd = tollgate::command();
    cmd.args(["top", "--http-addr", &server.http_addr().to_string()])
        .args(["--domain", "web", "--by", "denied", "-n", "1"]);
    let out = process::run("tollgate top", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(lines[0], "top keys by denied in the last minute", "{out:?}");
    assert_eq!(
        lines[1].split_whitespace().collect::<Vec<_>>(),
        ["3", "±0", "web.ip", "ip=a"]
    );
    assert_eq!(lines.len(), 2, "{out:?}");

    let mut cmd = tollgate::command();
    cmd.args([
        "top",
        "--http-addr",
        &server.http_addr().to_string(),
        "--window",
        "day",
    ]);
    let out = process::run("tollgate top", cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    assert!(!out.status.success(), "{out:?}");
    assert!(
        out.stderr.contains("window=day: expected minute or hour"),
        "{out:?}"
    );
}

/// `/metrics` needs no token: it carried each rule's heaviest client keys to anyone who
/// could scrape it. They are there only when the operator turns them on.
#[tokio::test]
async fn metrics_show_the_heaviest_keys_only_when_the_setting_says_so() {
    let server = InProcess::rules(RULES).start();
    known_traffic(&server).await;
    let page = get(server.http_addr(), "/metrics").await.body;
    assert!(page.contains("tollgate_counters"), "{page}");
    for key in ["tollgate_top_key_requests", "ip=a", "trial=t"] {
        assert!(!page.contains(key), "{key} in\n{page}");
    }

    let server = InProcess::rules(RULES)
        .env("METRICS_TOP_KEYS", "true")
        .start();
    known_traffic(&server).await;
    let page = get(server.http_addr(), "/metrics").await.body;
    for line in [
        r#"tollgate_top_key_requests{domain="web",rule="ip",by="denied",descriptor="ip=a"} 3"#,
        r#"tollgate_top_key_requests{domain="web",rule="ip",by="hits",descriptor="ip=c"} 1"#,
        r#"tollgate_top_key_requests{domain="web",rule="trial",by="shadow",descriptor="trial=t"} 1"#,
    ] {
        assert!(page.contains(line), "{line} not in\n{page}");
    }
}

/// `/top` trusted any loopback peer: a page served from a name rebound to 127.0.0.1 (DNS
/// rebinding) reached it through a browser on the host, naming its own host. From
/// loopback, the Host (HTTP/2's `:authority`, an absolute URI's host) must name loopback
/// too; the token opens it whatever the Host.
#[tokio::test]
async fn top_from_loopback_needs_a_loopback_host() {
    let server = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    known_traffic(&server).await;
    let addr = server.http_addr();
    let path = "/top?domain=web";
    let bearer = format!("Bearer {TOKEN}");
    let ours = [
        "localhost",
        "LocalHost:8080",
        "127.0.0.1",
        "127.0.0.1:1",
        "127.9.9.9:80",
        "[::1]",
        "[::1]:8080",
        "[::ffff:127.0.0.1]:8080",
    ];
    let foreign = [
        "rebound.example",
        "rebound.example:8080",
        "localhost.evil.example",
        "127.0.0.1.nip.io",
        "127.0.0.1.nip.io:8080",
        "localhost.",
        "2130706433",
        "0x7f.0.0.1",
        "[::1].evil.example",
        "[::2]:8080",
        "::1",
        "evil@127.0.0.1",
        "127.0.0.1:8080:80",
        "127.0.0.1:port",
    ];
    for (hosts, want) in [(&ours[..], 200), (&foreign[..], 403)] {
        for host in hosts {
            let one = get_with(addr, path, &[("host", host)]).await;
            assert_eq!(one.status, want, "HTTP/1 Host {host}: {one:?}");
            let Ok(two) = http2::send(addr, host, Method::GET, path, &[], "").await else {
                // An :authority h2 itself refuses to send is no request at all.
                assert_eq!(want, 403, "HTTP/2 :authority {host}");
                continue;
            };
            assert_eq!(two.status, want, "HTTP/2 :authority {host}: {two:?}");
            if want == 403 {
                assert!(two.body.contains("Host"), "{two:?}");
                let auth = [("authorization", bearer.as_bytes())];
                let with_token = http2::send(addr, host, Method::GET, path, &auth, "")
                    .await
                    .expect("HTTP/2");
                assert_eq!(with_token.status, 200, "{host} with the token");
            }
        }
    }
    let refused = get_with(addr, path, &[("host", "rebound.example")]).await;
    assert!(
        refused
            .body
            .contains("the Host must be localhost, 127.0.0.1 or [::1]"),
        "{refused:?}"
    );
    let with_token = get_with(
        addr,
        path,
        &[("host", "rebound.example"), ("authorization", &bearer)],
    )
    .await;
    assert_eq!(with_token.status, 200, "{with_token:?}");

    for (what, request) in [
        (
            "HTTP/1.0 without Host",
            "GET /top HTTP/1.0\r\n\r\n".to_owned(),
        ),
        (
            "two Hosts",
            format!(
                "GET /top HTTP/1.1\r\nHost: {addr}\r\nHost: rebound.example\r\nConnection: close\r\n\r\n"
            ),
        ),
        (
            "an absolute URI naming another host",
            format!(
                "GET http://rebound.example/top HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
            ),
        ),
    ] {
        let answer = http::send_raw(addr, request.as_bytes()).await.expect(what);
        assert!(matches!(answer.status, 400 | 403), "{what}: {answer:?}");
        assert!(!answer.body.contains("entries"), "{what}: {answer:?}");
    }
    let mut conn = TcpStream::connect(addr).await.expect("connect");
    conn.write_all(&h2_frames::get_without_authority("/top"))
        .await
        .expect("write");
    let body = h2_frames::answer_body(&mut conn, 1).await;
    assert!(
        body.as_ref().is_ok_and(|b| b.contains("no Host")),
        "HTTP/2 without :authority: {body:?}"
    );
}

/// The page in a real headless Chromium, opened with a descriptor to explain: it shows the
/// top keys, the rules as a tree and the explanation.
#[tokio::test]
async fn the_page_shows_the_top_keys_the_rules_and_an_explanation() {
    let Some(browser) = chromium::binary() else {
        return;
    };
    let server = InProcess::rules(RULES).start();
    known_traffic(&server).await;
    let url = format!(
        "http://{}/ui?domain=web&descriptor=ip=a",
        server.http_addr()
    );
    let dom = tokio::task::spawn_blocking(move || chromium::dump_dom(&browser, &url))
        .await
        .expect("chromium ran");
    let top = section(&dom, r#"<tbody id="top">"#, "</tbody>");
    let rows: Vec<&str> = top.split("</tr>").filter(|r| r.contains("<td")).collect();
    // Ranked by denials, the page's first ranking: shadow mode's `trial=t` is not there.
    assert_eq!(rows.len(), 2, "{top}");
    for (row, cells) in rows
        .iter()
        .zip([["3", "0", "web.ip", "ip=a"], ["1", "0", "web.ip", "ip=b"]])
    {
        assert_eq!(texts(row), cells, "{top}");
    }
    let rules = section(&dom, r#"<ul id="rules""#, "</section>");
    for rule in [
        "<li>web<ul>",
        "<li>ip: unit=MINUTE requests_per_unit=2",
        "<li>trial: ",
    ] {
        assert!(rules.contains(rule), "{rule} not in {rules}");
    }
    let explained = section(&dom, r#"<pre id="explain">"#, "</pre>");
    assert!(
        explained.contains(r#""overallCode": "OVER_LIMIT""#),
        "{explained}"
    );
    assert!(explained.contains(r#""key": "web|ip=a#"#), "{explained}");
    let health = section(&dom, r#"<span id="store-health""#, "</span>");
    assert!(health.ends_with(">answering"), "{health}");
}

/// On the page a value with U+202E read reversed and control characters went unseen; and
/// the explain form split a value at its commas. Every such character shows as an escape
/// (JSON's own in the explanation), and an entry is sent whole (`entry=` in the link, a
/// line in the form).
#[tokio::test]
async fn the_page_shows_hidden_characters_as_escapes_and_sends_values_whole() {
    let Some(browser) = chromium::binary() else {
        return;
    };
    let server = InProcess::rules(RULES).start();
    let value = "v,1\u{202e}gnp.exe\x1b[31m";
    let mut rls = server.client().await;
    for _ in 0..3 {
        rls.check("web", &[("ip", value)]).await;
    }
    let entry: String = form_urlencoded::byte_serialize(format!("ip={value}").as_bytes()).collect();
    let url = format!("http://{}/ui?domain=web&entry={entry}", server.http_addr());
    let dom = tokio::task::spawn_blocking(move || chromium::dump_dom(&browser, &url))
        .await
        .expect("chromium ran");
    let top = section(&dom, r#"<tbody id="top">"#, "</tbody>");
    let rows: Vec<&str> = top.split("</tr>").filter(|r| r.contains("<td")).collect();
    assert_eq!(rows.len(), 1, "{top}");
    assert_eq!(
        texts(rows[0]),
        ["1", "0", "web.ip", r"ip=v,1\u{202e}gnp.exe\x1b[31m"],
        "{top}"
    );
    let explained = section(&dom, r#"<pre id="explain">"#, "</pre>");
    assert!(
        explained.contains(r#""overallCode": "OVER_LIMIT""#),
        "the value was not sent whole: {explained}"
    );
    assert!(
        explained.contains(r#""descriptor": "ip=v,1\u202egnp.exe\u001b[31m""#),
        "{explained}"
    );
    for hidden in ['\u{202e}', '\x1b'] {
        assert!(!dom.contains(hidden), "{hidden:?} in the page: {dom}");
    }
}

/// The part of `dom` from `start` to the next `end`.
fn section<'a>(dom: &'a str, start: &str, end: &str) -> &'a str {
    let from = dom
        .find(start)
        .unwrap_or_else(|| panic!("{start} not in {dom}"));
    let rest = &dom[from..];
    &rest[..rest.find(end).unwrap_or(rest.len())]
}

/// The texts of a table row's cells.
fn texts(row: &str) -> Vec<&str> {
    row.split("<td")
        .skip(1)
        .filter_map(|cell| cell.split_once('>')?.1.split("</td>").next())
        .collect()
}
