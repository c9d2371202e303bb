//! Parsing one rules document, with the place of every problem in it.

use super::ConfigError;
use super::spec::DomainSpec;

/// YAML nodes allowed in one document: far above any real rules file of
/// [`super::MAX_FILE_BYTES`], so that only the file size limit is ever met in practice.
const MAX_NODES: usize = 20_000_000;

/// Parses one rules document; the error names the place in it and the problem.
pub(super) fn parse(origin: &str, text: &str) -> Result<DomainSpec, ConfigError> {
    let mut place = String::new();
    let options = serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_nodes: MAX_NODES,
            max_events: 2 * MAX_NODES,
        },
    };
    serde_saphyr::with_deserializer_from_str_with_options(text, options, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            place = e.path().to_string();
            e.into_inner()
        })
    })
    .map_err(|e| {
        let location = e
            .location()
            .map(|l| format!(" (line {} column {})", l.line(), l.column()))
            .unwrap_or_default();
        let path = if place == "." { String::new() } else { place };
        let message = in_our_words(&e);
        ConfigError {
            origin: origin.to_owned(),
            path,
            message: format!("{message}{location}"),
        }
    })
}

/// The problem as a rules author reads it: the parser's own wording where it names the
/// problem, ours where it would tell a library user what to call instead.
fn in_our_words(e: &serde_saphyr::Error) -> String {
    use serde_saphyr::Error;
    use serde_saphyr::budget::BudgetBreach;
    match e.without_snippet() {
        Error::Budget {
            breach: BudgetBreach::Depth { depth },
            ..
        } => format!("nested {depth} levels deep, deeper than rules can be"),
        Error::Budget { .. } => "the document is too large to be rules".to_owned(),
        Error::MultipleDocuments { .. } => {
            "more than one YAML document (`---`) in one file; give each domain a file of its \
             own"
            .to_owned()
        }
        Error::DuplicateMappingKey { key: Some(key), .. } => {
            format!("the key `{key}` is given twice")
        }
        Error::DuplicateMappingKey { key: None, .. } => "a key is given twice".to_owned(),
        _ => message_of(&e.to_string()).to_owned(),
    }
}

/// The bare message of a YAML error: its first line without the "error: line L column C: "
/// lead, since the location is appended in a fixed form.
fn message_of(rendered: &str) -> &str {
    let line = rendered.lines().next().unwrap_or(rendered).trim();
    let line = line.strip_prefix("error: ").unwrap_or(line);
    match line
        .strip_prefix("line ")
        .and_then(|rest| rest.split_once(": "))
    {
        Some((_, message)) => message,
        None => line,
    }
}
