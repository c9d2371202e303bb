//! Rule files that must be rejected, by `check-config` and by `serve`, with
//! `FILE: PATH: PROBLEM` lines on stderr and exit code 1.

use tollgate_testkit::process::Finished;
use tollgate_testkit::tollgate::{ConfigDir, Serve, check_config};

/// Asserts the process exited with code 1 and that a stderr line reports `problem` (the
/// start of the message) for `file_name` at `path`, as `…/FILE: PATH: PROBLEM…`; returns
/// that line.
fn assert_config_problem<'a>(
    finished: &'a Finished,
    file_name: &str,
    path: &str,
    problem: &str,
) -> &'a str {
    assert_eq!(
        finished.status.code(),
        Some(1),
        "expected exit code 1; stderr:\n{}",
        finished.stderr
    );
    let wanted = format!("/{file_name}: {path}: {problem}");
    finished
        .stderr
        .lines()
        .find(|line| line.contains(&wanted))
        .unwrap_or_else(|| {
            panic!(
                "no stderr line reports `{wanted}`; stderr:\n{}",
                finished.stderr
            )
        })
}

/// Writes `yaml` as `file_name`, runs `check-config` on it and asserts the problem is
/// reported; returns the line that reports it.
fn rejected(file_name: &str, yaml: &str, path: &str, problem: &str) -> String {
    let dir = ConfigDir::with_file(file_name, yaml);
    let finished = check_config(&dir.file(file_name));
    assert_eq!(
        finished.stdout, "",
        "a rejected config prints nothing on stdout"
    );
    assert_config_problem(&finished, file_name, path, problem).to_owned()
}

#[test]
fn empty_domain() {
    rejected(
        "empty_dom.yaml",
        "domain: ''\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        "domain",
        "config file cannot have empty domain",
    );
}

#[test]
fn empty_key() {
    rejected(
        "empty_key.yaml",
        "domain: d\ndescriptors:\n  - key: ''\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
        "descriptors[0]",
        "descriptor has empty key",
    );
}

#[test]
fn duplicate_key_and_value_at_one_level() {
    let line = rejected(
        "dup.yaml",
        r#"
domain: d
descriptors:
  - key: color
    value: blue
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: color
    value: blue
    rate_limit: {unit: minute, requests_per_unit: 2}
"#,
        "descriptors[1]",
        "duplicate descriptor",
    );
    assert!(
        line.contains("color") && line.contains("blue"),
        "the duplicate message names key and value: {line}"
    );
}

#[test]
fn same_key_and_value_at_different_levels_is_valid() {
    let dir = ConfigDir::with_file(
        "levels.yaml",
        r#"
domain: d
descriptors:
  - key: color
    value: blue
    descriptors:
      - key: color
        value: blue
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: color
    value: red
    rate_limit: {unit: second, requests_per_unit: 1}
"#,
    );
    let finished = check_config(&dir.file("levels.yaml"));
    assert!(finished.status.success(), "{finished:?}");
    assert_eq!(finished.stdout, "ok\n");
}

#[test]
fn invalid_unit() {
    rejected(
        "unit.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
        "descriptors[0].rate_limit.unit",
        "invalid rate limit unit 'fortnight'",
    );
}

#[test]
fn unknown_field() {
    let line = rejected(
        "unknown.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requestsperunit: 1\n",
        "descriptors[0].rate_limit.requestsperunit",
        "unknown field `requestsperunit`",
    );
    assert!(
        line.contains("requests_per_unit") && line.ends_with("(line 6 column 7)"),
        "the message lists the known fields and the position: {line}"
    );
}

#[test]
fn unlimited_with_unit() {
    rejected(
        "unl.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unlimited: true, unit: second}\n",
        "descriptors[0].rate_limit",
        "should not specify rate limit unit when unlimited",
    );
}

#[test]
fn replaces_itself() {
    rejected(
        "self.yaml",
        r#"
domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      name: mine
      replaces: [{name: mine}]
"#,
        "descriptors[0].rate_limit.replaces",
        "replaces should not contain name of same descriptor",
    );
}

#[test]
fn empty_replaces_entry() {
    rejected(
        "empty_repl.yaml",
        r#"
domain: d
descriptors:
  - key: a
    rate_limit:
      unit: second
      requests_per_unit: 1
      name: mine
      replaces: [{name: ''}]
"#,
        "descriptors[0].rate_limit.replaces",
        "should not have an empty replaces entry",
    );
}

#[test]
fn yaml_syntax_error_names_file_path_and_line() {
    let line = rejected(
        "broken.yaml",
        "domain: d\ndescriptors:\n  - key: [unclosed\n",
        "descriptors[0].key",
        "expected string",
    );
    assert!(
        line.ends_with("(line 3 column 10)"),
        "the message ends with the line and column of the sequence: {line}"
    );
}

#[test]
fn problem_in_a_nested_descriptor_has_its_full_path() {
    rejected(
        "nested.yaml",
        r#"
domain: d
descriptors:
  - key: a
    descriptors:
      - key: b
      - key: ''
        rate_limit: {unit: second, requests_per_unit: 1}
"#,
        "descriptors[0].descriptors[1]",
        "descriptor has empty key",
    );
}

#[test]
fn duplicate_domain_across_files_of_a_directory() {
    let dir = ConfigDir::new();
    let rule = "domain: shared\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n";
    dir.write("one.yaml", rule);
    dir.write("two.yml", rule);
    let finished = check_config(dir.path());
    assert_eq!(finished.status.code(), Some(1), "{finished:?}");
    assert!(
        finished.stderr_lines().iter().any(|l| {
            l.contains("duplicate domain 'shared'")
                && (l.contains("one.yaml") || l.contains("two.yml"))
        }),
        "{}",
        finished.stderr
    );
}

#[test]
fn every_problem_of_every_file_is_reported() {
    let dir = ConfigDir::new();
    dir.write(
        "a.yaml",
        "domain: ''\ndescriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\n",
    );
    dir.write(
        "b.yaml",
        r#"
domain: b
descriptors:
  - key: ''
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: x
    rate_limit: {unlimited: true, unit: second}
"#,
    );
    let finished = check_config(dir.path());
    assert_config_problem(
        &finished,
        "a.yaml",
        "domain",
        "config file cannot have empty domain",
    );
    assert_config_problem(
        &finished,
        "b.yaml",
        "descriptors[0]",
        "descriptor has empty key",
    );
    assert_config_problem(
        &finished,
        "b.yaml",
        "descriptors[1].rate_limit",
        "should not specify rate limit unit when unlimited",
    );
}

/// What the YAML parser says to a library user (which function to call, which option to
/// set, a Rust debug value) is said in a rules author's words.
#[test]
fn yaml_problems_are_told_in_our_words() {
    let deep = format!(
        "domain: d\ndescriptors:\n  - key: k\n    metadata: {}1{}\n",
        "{a: ".repeat(70),
        "}".repeat(70)
    );
    let cases = [
        (
            "two_documents.yaml",
            "domain: a\ndescriptors: []\n---\ndomain: b\n".to_owned(),
            "",
            "more than one YAML document",
        ),
        (
            "twice.yaml",
            "domain: a\ndomain: b\ndescriptors: []\n".to_owned(),
            "?",
            "the key `domain` is given twice",
        ),
        (
            "deep.yaml",
            deep,
            &format!("descriptors[0].metadata{}", ".a".repeat(60)),
            "nested 65 levels deep",
        ),
    ];
    for (file, yaml, path, problem) in cases {
        let line = if path.is_empty() {
            // A problem of the whole file has no path: `FILE: PROBLEM`.
            let dir = ConfigDir::with_file(file, &yaml);
            let finished = check_config(&dir.file(file));
            assert_eq!(finished.status.code(), Some(1), "{}", finished.stderr);
            let wanted = format!("/{file}: {problem}");
            finished
                .stderr
                .lines()
                .find(|l| l.contains(&wanted))
                .unwrap_or_else(|| panic!("no `{wanted}` in\n{}", finished.stderr))
                .to_owned()
        } else {
            rejected(file, &yaml, path, problem)
        };
        for leak in [
            "from_str_multiple",
            "DuplicateKeyPolicy",
            "Options",
            "budget",
            "{ depth",
        ] {
            assert!(!line.contains(leak), "{line}");
        }
    }
}

#[test]
fn a_misspelled_field_does_not_hide_a_bad_unit_before_it() {
    let dir = ConfigDir::with_file(
        "both.yaml",
        r#"
domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: b
    ratelimit: {unit: second, requests_per_unit: 1}
"#,
    );
    let finished = check_config(&dir.file("both.yaml"));
    assert_config_problem(
        &finished,
        "both.yaml",
        "descriptors[0].rate_limit.unit",
        "invalid rate limit unit 'fortnight'",
    );
    assert_config_problem(
        &finished,
        "both.yaml",
        "descriptors[1].ratelimit",
        "unknown field `ratelimit`",
    );
}

#[test]
fn serve_refuses_an_invalid_config_with_exit_code_1() {
    let dir = ConfigDir::with_file(
        "bad.yaml",
        "domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n",
    );
    let finished = Serve::path(&dir.file("bad.yaml")).refused("an invalid config");
    assert_config_problem(
        &finished,
        "bad.yaml",
        "descriptors[0].rate_limit.unit",
        "invalid rate limit unit 'fortnight'",
    );
}

#[test]
fn serve_refuses_a_missing_config_path() {
    let dir = ConfigDir::new();
    let missing = dir.file("missing.yaml");
    let finished = Serve::path(&missing).refused("a missing config");
    assert_eq!(finished.status.code(), Some(1), "{finished:?}");
    assert!(
        finished.stderr.contains("missing.yaml"),
        "{}",
        finished.stderr
    );
}
