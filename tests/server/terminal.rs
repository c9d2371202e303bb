//! What the commands print of keys and values a client chose is safe on a terminal: C0
//! and C1 control characters and bidirectional overrides and isolates come out as visible
//! escapes (`\x1b`, `\u{202e}`), never as themselves, in every command.

use std::process::Command;

use tollgate_testkit::admin::{self, TOKEN};
use tollgate_testkit::http::Method;
use tollgate_testkit::process::{self, Finished};
use tollgate_testkit::tollgate::{self, COMMAND_TIMEOUT, Listening};

use crate::in_process::InProcess;

/// A limit whose name hides an escape and a right-to-left override (YAML's escapes).
const RULES: &str = "domain: tt\ndescriptors:\n  - key: user\n    rate_limit: {unit: hour, \
                     requests_per_unit: 2, name: \"per\\e[31mRED\\u202euser\"}\n";

/// A client's value that clears the screen, paints in red, reverses what follows, rings
/// the bell and holds a C1 control.
const HOSTILE: &str = "\x1b[2J\x1b[31mFAKE\u{202e}exe.txt\u{2066}\x07\u{85}end";
/// [`HOSTILE`] as every command must print it.
const SHOWN: &str = r"\x1b[2J\x1b[31mFAKE\u{202e}exe.txt\u{2066}\x07\u{85}end";

/// Whether `text` holds a character a terminal would act on or reorder by: a control
/// character other than the line ends the command writes, or a bidirectional control.
fn unsafe_char(text: &str) -> Option<char> {
    text.chars().find(|&c| {
        (c.is_control() && c != '\n')
            || matches!(c, '\u{61c}' | '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    })
}

fn run(what: &str, server: &Listening, args: &[&str]) -> Finished {
    let mut cmd: Command = tollgate::command();
    let addr_flag = if args[0] == "client" {
        "--addr"
    } else {
        "--http-addr"
    };
    let addr = if args[0] == "client" {
        server.grpc_addr()
    } else {
        server.http_addr()
    };
    cmd.arg(args[0])
        .args([addr_flag, &addr.to_string()])
        .args(&args[1..])
        .env("ADMIN_TOKEN", TOKEN);
    let out = process::run(what, cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"));
    for (stream, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        assert!(
            unsafe_char(text).is_none(),
            "{what} printed {:?} raw on {stream}: {text:?}",
            unsafe_char(text)
        );
    }
    out
}

#[tokio::test]
async fn every_command_prints_control_and_bidi_characters_as_escapes() {
    let server = InProcess::rules(RULES).env("ADMIN_TOKEN", TOKEN).start();
    let mut rls = server.client().await;
    for _ in 0..3 {
        rls.check("tt", &[("user", HOSTILE)]).await;
    }
    let descriptor = format!("user={HOSTILE}");

    let top = run("tollgate top", &server, &["top", "--domain", "tt"]);
    assert!(top.status.success(), "{top:?}");
    assert!(
        top.stdout.contains(&format!("tt.user user={SHOWN}\n")),
        "{top:?}"
    );

    let client = run(
        "tollgate client",
        &server,
        &["client", "--domain", "tt", "--descriptor", &descriptor],
    );
    assert!(
        client.stdout.contains(r"name=per\x1b[31mRED\u{202e}user "),
        "{client:?}"
    );

    let explain = run(
        "tollgate explain",
        &server,
        &["explain", "--domain", "tt", "--descriptor", &descriptor],
    );
    assert!(explain.status.success(), "{explain:?}");
    assert!(
        explain
            .stdout
            .contains(&format!("descriptor 0: user={SHOWN}: rule tt.user")),
        "{explain:?}"
    );
    assert!(
        explain.stdout.contains(&format!("  key: tt|user={SHOWN}#")),
        "{explain:?}"
    );

    let reset = run(
        "tollgate reset",
        &server,
        &["reset", "--domain", "tt", "--descriptor", &descriptor],
    );
    assert!(reset.status.success(), "{reset:?}");
    assert!(
        reset.stdout.starts_with(&format!("reset tt|user={SHOWN}#")),
        "{reset:?}"
    );

    // Controls set over the API (a NUL is refused there: PostgreSQL cannot keep one).
    let set = r#"{"domain":"tt","entries":[{"key":"user","value":"soh\u0001del\u007f\u2067"}],"limit":{"requests_per_unit":5,"unit":"hour"}}"#;
    let set = admin::overrides(&server, Method::PUT, "/overrides", set, Some(TOKEN)).await;
    assert_eq!(set.status, 200, "{set:?}");
    let list = run("tollgate override list", &server, &["override", "list"]);
    assert!(list.status.success(), "{list:?}");
    assert!(
        list.stdout
            .contains(r"override tt user=soh\x01del\x7f\u{2067}: 5 per "),
        "{list:?}"
    );
}
