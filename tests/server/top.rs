//! `GET /top` and `tollgate top`: the heaviest keys of each rule by hits, denials and
//! shadow mode's would-be denials, after known traffic.

use serde_json::Value;
use tollgate_testkit::chromium;
use tollgate_testkit::http::get;
use tollgate_testkit::process;
use tollgate_testkit::tollgate::{self, COMMAND_TIMEOUT, Listening};

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

#[tokio::test]
async fn metrics_show_the_heaviest_keys_of_each_rule() {
    let server = InProcess::rules(RULES).start();
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
