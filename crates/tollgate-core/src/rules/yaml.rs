//! Parsing one rules document, with the place of every problem in it.

use super::config_error::ConfigError;
use super::spec::DomainSpec;

/// YAML nodes allowed in one document: far above any real rules file of
/// [`super::MAX_FILE_BYTES`], so that only the file size limit is ever met in practice.
const MAX_NODES: usize = 20_000_000;

/// The most problems reported for one document before the rest is left unread.
const MAX_PROBLEMS: usize = 100;

/// A parse error: where in the text, and the problem as reported.
struct Failure {
    error: ConfigError,
    /// Line and column (both from 1), when the parser knows them.
    at: Option<(usize, usize)>,
}

/// Parses one rules document, reporting every problem rather than the first: after a
/// problem, the entry it is in (its line and the lines indented below it) is blanked out
/// and the rest parsed again, so a typo in one descriptor does not hide the mistakes of
/// another. Blanking keeps every line and column where it was. Returns the spec of what
/// parsed, if the document could be read to its end, and the problems found.
pub(super) fn parse_all(origin: &str, text: &str) -> (Option<DomainSpec>, Vec<ConfigError>) {
    let mut errors = Vec::new();
    let mut text = text.to_owned();
    while errors.len() < MAX_PROBLEMS {
        let failure = match parse_once(origin, &text) {
            Ok(spec) => return (Some(spec), errors),
            Err(failure) => failure,
        };
        errors.push(failure.error);
        let Some(blanked) = failure.at.and_then(|(line, _)| blank_entry(&text, line)) else {
            break;
        };
        text = blanked;
    }
    (None, errors)
}

/// `text` with the block entry starting on `line` blanked out: that line and the lines
/// after it indented deeper (or empty). None when there is nothing left to blank there.
fn blank_entry(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.split('\n').collect();
    let first = lines.get(line.checked_sub(1)?)?;
    let indent = first.len() - first.trim_start_matches(' ').len();
    if first.trim().is_empty() {
        return None;
    }
    let mut out = String::with_capacity(text.len());
    let mut inside = false;
    for (i, l) in lines.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let depth = l.len() - l.trim_start_matches(' ').len();
        inside = if i + 1 == line {
            true
        } else {
            inside && (l.trim().is_empty() || depth > indent)
        };
        if inside {
            out.extend(l.chars().map(|c| if c == '\r' { c } else { ' ' }));
        } else {
            out.push_str(l);
        }
    }
    Some(out)
}

fn parse_once(origin: &str, text: &str) -> Result<DomainSpec, Failure> {
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
        let at = e
            .location()
            .map(|l| (l.line() as usize, l.column() as usize));
        let location = at
            .map(|(line, column)| format!(" (line {line} column {column})"))
            .unwrap_or_default();
        let path = if place == "." { String::new() } else { place };
        let message = in_our_words(&e);
        Failure {
            error: ConfigError {
                origin: origin.to_owned(),
                path,
                message: format!("{message}{location}"),
            },
            at,
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
