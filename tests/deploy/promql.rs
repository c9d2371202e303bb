//! Just enough of PromQL to check a dashboard against `/metrics`: the metric names an
//! expression selects, the labels its matchers name, and the labels it groups by.

/// What an expression asks of the series it reads.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Uses {
    /// Each selected metric with the labels its matchers name.
    pub(crate) selectors: Vec<(String, Vec<String>)>,
    /// Labels in `by`, `without`, `on`, `ignoring` and `group_left/right` lists.
    pub(crate) grouping: Vec<String>,
}

/// Keywords followed by a parenthesised list of labels.
const LABEL_LISTS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Keywords that stand alone, and aggregations (which may be followed by `by (…)` before
/// their parenthesis).
const KEYWORDS: &[&str] = &[
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// The metrics and labels `expr` uses. Grafana's variables (`$job`, `${x}`,
/// `$__rate_interval`) are skipped; so are strings, numbers and range brackets.
pub(crate) fn uses(expr: &str) -> Uses {
    let chars: Vec<char> = expr.chars().collect();
    let mut uses = Uses::default();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '[' {
            i = skip_past(&chars, i, ']');
        } else if c == '$' {
            i = skip_variable(&chars, i + 1);
        } else if c.is_ascii_digit() || c == '.' {
            i = skip_word(&chars, i);
        } else if is_name_start(c) {
            let end = skip_word(&chars, i);
            let word: String = chars[i..end].iter().collect();
            let next = skip_spaces(&chars, end);
            i = end;
            if LABEL_LISTS.contains(&word.as_str()) {
                if chars.get(next) == Some(&'(') {
                    let close = skip_past(&chars, next, ')');
                    uses.grouping.extend(names(&chars[next + 1..close - 1]));
                    i = close;
                }
            } else if KEYWORDS.contains(&word.as_str()) || chars.get(next) == Some(&'(') {
                // An operator, or a function or aggregation applied to what follows.
            } else if chars.get(next) == Some(&'{') {
                let close = skip_past(&chars, next, '}');
                uses.selectors
                    .push((word, matcher_labels(&chars[next + 1..close - 1])));
                i = close;
            } else {
                uses.selectors.push((word, Vec::new()));
            }
        } else {
            i += 1;
        }
    }
    uses
}

/// The metric and label of a Grafana variable query `label_values(SELECTOR, LABEL)`.
pub(crate) fn label_values(query: &str) -> Option<(Uses, String)> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (selector, label) = inner.rsplit_once(',')?;
    Some((uses(selector), label.trim().to_owned()))
}

fn is_name_start(c: char) -> bool {
    c.is_ascii_alphabetic() || c == '_' || c == ':'
}

fn skip_word(chars: &[char], mut i: usize) -> usize {
    while i < chars.len()
        && (chars[i].is_ascii_alphanumeric()
            || chars[i] == '_'
            || chars[i] == ':'
            || chars[i] == '.')
    {
        i += 1;
    }
    i
}

fn skip_spaces(chars: &[char], mut i: usize) -> usize {
    while i < chars.len() && chars[i].is_whitespace() {
        i += 1;
    }
    i
}

fn skip_variable(chars: &[char], i: usize) -> usize {
    if chars.get(i) == Some(&'{') {
        skip_past(chars, i, '}')
    } else {
        skip_word(chars, i)
    }
}

/// The index after the string starting at `start` (escapes honoured).
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        i += if chars[i] == '\\' { 2 } else { 1 };
    }
    i + 1
}

/// The index after the first `close` from `start` on, outside strings.
fn skip_past(chars: &[char], start: usize, close: char) -> usize {
    let mut i = start + 1;
    while i < chars.len() && chars[i] != close {
        i = if chars[i] == '"' || chars[i] == '\'' {
            skip_string(chars, i)
        } else {
            i + 1
        };
    }
    (i + 1).min(chars.len() + 1)
}

/// Comma-separated names.
fn names(list: &[char]) -> Vec<String> {
    list.iter()
        .collect::<String>()
        .split(',')
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty())
        .collect()
}

/// The label names of `a="x", b=~"y"`.
fn matcher_labels(matchers: &[char]) -> Vec<String> {
    let mut labels = Vec::new();
    let mut i = 0;
    while i < matchers.len() {
        let c = matchers[i];
        if c == '"' || c == '\'' {
            i = skip_string(matchers, i);
        } else if is_name_start(c) {
            let end = skip_word(matchers, i);
            labels.push(matchers[i..end].iter().collect());
            i = end;
        } else {
            i += 1;
        }
    }
    labels
}

#[test]
fn names_labels_and_groupings_are_found_and_the_rest_skipped() {
    let expr = r#"histogram_quantile(0.99, sum by (le) (rate(a_seconds_bucket{job=~"$job", x!="q}\""}[$__rate_interval]))) / ignoring(k) b_total * on (instance) group_left max by (instance, version) (c) > bool 2 unless d offset 5m"#;
    let got = uses(expr);
    let owned = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        got.selectors,
        [
            ("a_seconds_bucket".to_owned(), owned(&["job", "x"])),
            ("b_total".to_owned(), Vec::new()),
            ("c".to_owned(), Vec::new()),
            ("d".to_owned(), Vec::new()),
        ]
    );
    assert_eq!(
        got.grouping,
        owned(&["le", "k", "instance", "instance", "version"])
    );
    let (selector, label) =
        label_values(r#"label_values(m{job=~"$job"}, domain)"#).expect("a label_values query");
    assert_eq!(selector.selectors, [("m".to_owned(), owned(&["job"]))]);
    assert_eq!(label, "domain");
    assert_eq!(label_values("up"), None);
}
