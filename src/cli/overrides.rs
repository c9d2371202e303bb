//! `tollgate override set|list|delete`: runtime overrides on a running server, through
//! its `/overrides` API, with the admin client's transport.

use serde_json::{Value, json};
use tollgate_core::overrides::{Override, OverrideEntry, OverrideLimit};

use crate::cli::admin_client::call_json;
use crate::cli::client::parse_descriptor;
use crate::cli::visible::shown;
use crate::config::settings::{OverriddenArgs, OverrideAction, OverrideArgs};

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
            let query = domain.map_or_else(String::new, |d| {
                let encoded: String = form_urlencoded::byte_serialize(d.as_bytes()).collect();
                format!("?domain={encoded}")
            });
            ("GET", format!("/overrides{query}"), String::new())
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

/// One line per override: `set api tenant=acme: 5 per minute`.
fn render(answer: &Value) -> String {
    let line = |verb: &str, o: &Value| {
        let entries: Vec<String> = o["entries"]
            .as_array()
            .map(|e| {
                e.iter()
                    .map(|e| format!("{}={}", shown(&e["key"]), shown(&e["value"])))
                    .collect()
            })
            .unwrap_or_default();
        let limit = &o["limit"];
        let mut text = format!(
            "{verb} {} {}: {} per {}",
            shown(&o["domain"]),
            entries.join(","),
            limit["requests_per_unit"],
            shown(&limit["unit"]).to_lowercase()
        );
        if let Some(at) = o["expires_at"].as_u64() {
            text.push_str(&format!(" until {at}"));
        }
        text + "\n"
    };
    if let Some(listed) = answer["overrides"].as_array() {
        let mut out = format!(
            "{} override(s), kept in {}\n",
            listed.len(),
            shown(&answer["keptIn"])
        );
        for o in listed {
            out.push_str(&line("override", &o["override"]));
        }
        return out;
    }
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
