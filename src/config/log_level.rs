//! `LOG_LEVEL`: a level, as the reference names them (logrus's panic, fatal, error, warn,
//! warning, info, debug, trace) or `off`, or a `tracing` directive (`info,h2=debug`).
//! Anything else is refused at startup: the filter would take an unknown word
//! (`verbose`) for a target's name and turn every other log line off.

/// The accepted levels, for the refusal.
const ACCEPTED: &str = "error, warn, info, debug, trace or off (or the reference's panic, \
                        fatal, warning), or a directive like info,h2=debug";

/// The `tracing` filter `text` means; an error naming the accepted values.
pub(crate) fn parse(text: &str) -> Result<String, String> {
    let refused = || format!("'{text}' is not a log level: use {ACCEPTED}");
    let parts: Vec<&str> = text.split(',').map(str::trim).collect();
    if let [single] = parts.as_slice()
        && !single.contains('=')
    {
        return match level(single) {
            // Tollgate's own crates at that level, the libraries at info: h2, hyper and
            // tower would otherwise log every frame.
            Some(low @ ("debug" | "trace")) => {
                Ok(format!("info,tollgate={low},tollgate_core={low}"))
            }
            Some(known) => Ok(known.to_owned()),
            None => Err(refused()),
        };
    }
    let mut directives = Vec::with_capacity(parts.len());
    for part in parts.iter().filter(|p| !p.is_empty()) {
        let directive = match part.rsplit_once('=') {
            Some((target, named)) => level(named).map(|l| format!("{target}={l}")),
            None => level(part).map(str::to_owned),
        };
        directives.push(directive.ok_or_else(refused)?);
    }
    match directives.is_empty() {
        true => Err(refused()),
        false => Ok(directives.join(",")),
    }
}

/// The `tracing` level a name means, if it names one.
fn level(name: &str) -> Option<&'static str> {
    Some(match name.trim().to_ascii_lowercase().as_str() {
        "off" => "off",
        "panic" | "fatal" | "error" => "error",
        "warn" | "warning" => "warn",
        "info" => "info",
        "debug" => "debug",
        "trace" => "trace",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_and_directives_are_taken() {
        assert_eq!(parse("info").as_deref(), Ok("info"));
        assert_eq!(parse("WARNING").as_deref(), Ok("warn"));
        assert_eq!(parse("fatal").as_deref(), Ok("error"));
        assert_eq!(
            parse("debug").as_deref(),
            Ok("info,tollgate=debug,tollgate_core=debug")
        );
        assert_eq!(parse("info, h2=debug").as_deref(), Ok("info,h2=debug"));
        assert_eq!(
            parse("tollgate_core::store=trace").as_deref(),
            Ok("tollgate_core::store=trace")
        );
    }

    #[test]
    fn unknown_words_are_refused_naming_the_levels() {
        for bad in ["verbose", "", "info,loud", "h2=chatty"] {
            let why = parse(bad).expect_err(bad);
            assert!(
                why.contains("error, warn, info, debug, trace or off"),
                "{why}"
            );
        }
    }
}
