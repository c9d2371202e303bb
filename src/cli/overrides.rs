//! `tollgate override set|list|delete`: runtime overrides on a running server, through
//! its `/overrides` API, with the admin client's transport.

use serde_json::{Value, json};
use tollgate_core::overrides::{Override, OverrideEntry, OverrideLimit};

use crate::cli::admin_client::call_json;
use crate::cli::client::parse_descriptor;
use crate::cli::visible::{shown, visible};
use crate::config::settings::{ClientTlsArgs, OverriddenArgs, OverrideAction, OverrideArgs};
use crate::ops::overrides::{entries as descriptor_text, limit_text};

/// Runs the action and prints what the server did.
pub(crate) async fn run(args: OverrideArgs) -> anyhow::Result<()> {
    let token = Some(args.admin_token.as_str());
    let (method, path, body) = match args.action {
        OverrideAction::Set {
            descriptor,
            requests_per_unit,
            unit,
            unit_multiplier,
            algorithm,
            name,
            expires_at,
        } => {
            let spec = Override {
                domain: descriptor.domain.clone(),
                entries: entries(&descriptor)?,
                limit: OverrideLimit {
                    requests_per_unit,
                    unit,
                    unit_multiplier,
                    algorithm,
                    name,
                },
                expires_at,
            };
            (
                "PUT",
                "/overrides".to_owned(),
                serde_json::to_string(&spec)?,
            )
        }
        OverrideAction::List { domain } => {
            print!("{}", list(&args.http_addr, &args.tls, domain, token).await?);
            return Ok(());
        }
        OverrideAction::Delete { descriptor } => {
            let body = json!({ "domain": descriptor.domain, "entries": entries(&descriptor)? });
            ("DELETE", "/overrides".to_owned(), body.to_string())
        }
    };
    let answer = call_json(&args.http_addr, &args.tls, method, &path, &body, token).await?;
    print!("{}", render(&answer));
    Ok(())
}

fn entries(descriptor: &OverriddenArgs) -> anyhow::Result<Vec<OverrideEntry>> {
    let parsed = parse_descriptor(&descriptor.descriptor)?;
    Ok(parsed
        .entries
        .into_iter()
        .map(|e| OverrideEntry {
            key: e.key,
            value: e.value,
        })
        .collect())
}

/// Overrides asked for per page.
const PAGE: &str = "1000";

/// Every override (of `domain`, if named), page after page, one line each after a line
/// that counts them.
async fn list(
    addr: &str,
    tls: &ClientTlsArgs,
    domain: Option<String>,
    token: Option<&str>,
) -> anyhow::Result<String> {
    let (mut lines, mut count) = (String::new(), 0_usize);
    let mut cursor: Option<String> = None;
    loop {
        let mut query = form_urlencoded::Serializer::new(String::new());
        query.append_pair("limit", PAGE);
        if let Some(domain) = &domain {
            query.append_pair("domain", domain);
        }
        if let Some(cursor) = &cursor {
            query.append_pair("cursor", cursor);
        }
        let path = format!("/overrides?{}", query.finish());
        let answer = call_json(addr, tls, "GET", &path, "", token).await?;
        for o in answer["overrides"].as_array().into_iter().flatten() {
            lines.push_str(&line("override", &o["override"]));
            count += 1;
        }
        match answer["next"].as_str() {
            Some(next) if cursor.as_deref() != Some(next) => cursor = Some(next.to_owned()),
            Some(next) => anyhow::bail!("{addr} answered the page after {next:?} with itself"),
            None => {
                let kept_in = shown(&answer["keptIn"]);
                return Ok(format!("{count} override(s), kept in {kept_in}\n{lines}"));
            }
        }
    }
}

/// One override's line: `set api tenant=acme: 5 per minute`.
fn line(verb: &str, o: &Value) -> String {
    match serde_json::from_value::<Override>(o.clone()) {
        Ok(o) => {
            let text = format!(
                "{verb} {} {}: {}",
                o.domain,
                descriptor_text(&o.entries),
                limit_text(&o)
            );
            format!("{}\n", visible(&text))
        }
        Err(e) => format!("{verb} (unreadable: {e})\n"),
    }
}

/// What a change answered, one line per override it names.
fn render(answer: &Value) -> String {
    let mut out = String::new();
    for (verb, key) in [
        ("set", "set"),
        ("replaced", "replaced"),
        ("deleted", "deleted"),
    ] {
        if answer[key].is_object() {
            out.push_str(&line(verb, &answer[key]));
        }
    }
    out
}
