//! `quota_group`: where it is read from, and every way of writing it wrong.

use super::*;

fn problems(text: &str, defaults: Defaults) -> String {
    let mut builder = RulesBuilder::new(defaults);
    builder.add_yaml("rules.yaml", text);
    match builder.finish() {
        Ok(_) => panic!("rules should be rejected"),
        Err(e) => e.to_string(),
    }
}

fn rule<'r>(rules: &'r Rules, entries: &[(&str, &str)]) -> &'r Rule {
    rules
        .domain("d")
        .and_then(|d| d.find(entries.iter().copied()))
        .expect("a rule")
}

#[test]
fn a_group_comes_from_its_field_or_from_the_metadata_key() {
    let text = r#"
domain: d
descriptors:
  - key: model
    value: a
    quota_mode: true
    quota_group: model-a
    metadata: {model: a}
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: model
    value: b
    quota_mode: true
    metadata: {model: b, quota_group: "model-b"}
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: model
    value: c
    quota_mode: true
    metadata: {quota_group: "model-c"}
    rate_limit: {unit: hour, requests_per_unit: 100}
  - key: tenant
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 100}
"#;
    let rules = Rules::from_yaml("rules.yaml", text).unwrap_or_else(|e| panic!("{e}"));
    let a = rule(&rules, &[("model", "a")]);
    assert_eq!(a.quota_group(), Some("model-a"));
    let b = rule(&rules, &[("model", "b")]);
    assert_eq!(b.quota_group(), Some("model-b"));
    let only_model = Metadata::from([("model".to_owned(), MetaValue::String("b".into()))]);
    assert_eq!(
        b.metadata(),
        Some(&only_model),
        "the key names the group only"
    );
    assert_eq!(rule(&rules, &[("model", "c")]).metadata(), None);
    assert_eq!(rule(&rules, &[("tenant", "t")]).quota_group(), None);
}

#[test]
fn a_group_refuses_what_it_cannot_mean() {
    let errors = problems(
        r#"
domain: d
descriptors:
  - key: plain
    quota_group: g
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: empty
    quota_mode: true
    quota_group: ""
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: spaced
    quota_mode: true
    quota_group: "two words"
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: control
    quota_mode: true
    quota_group: "a\u001b[31m"
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: number
    quota_mode: true
    metadata: {quota_group: 7}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: twice
    quota_mode: true
    quota_group: g
    metadata: {quota_group: g}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: long
    quota_mode: true
    quota_group: "LONG"
    rate_limit: {unit: hour, requests_per_unit: 1}
"#
        .replace("LONG", &"g".repeat(129))
        .as_str(),
        Defaults::default(),
    );
    for expected in [
        "rules.yaml: descriptors[0].quota_group: quota group 'g' groups quota-mode rules: set quota_mode: true on this rule",
        "rules.yaml: descriptors[1].quota_group: the quota group's name is empty",
        "rules.yaml: descriptors[2].quota_group: the quota group 'two words' holds ' ': a name may hold letters, digits and - _ . : / @",
        "rules.yaml: descriptors[3].quota_group: the quota group 'a\\u{1b}[31m' holds '\\u{1b}'",
        "rules.yaml: descriptors[4].metadata.quota_group: the quota group must be a string: the group's name",
        "rules.yaml: descriptors[5].quota_group: the quota group is named twice, as `quota_group` and in `metadata`; name it once",
        "rules.yaml: descriptors[6].quota_group: the quota group's name is 129 bytes (at most 128)",
    ] {
        assert!(errors.contains(expected), "{expected}\nnot in\n{errors}");
    }
    assert!(
        !errors.contains('\u{1b}'),
        "no control character reaches the message"
    );
}

#[test]
fn reference_mode_refuses_the_field_and_keeps_the_metadata_key_as_metadata() {
    let reference = Defaults {
        reference: true,
        ..Defaults::default()
    };
    let errors = problems(
        "domain: d\ndescriptors:\n  - key: m\n    quota_mode: true\n    quota_group: g\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
        reference.clone(),
    );
    assert!(
        errors.contains("rules.yaml: descriptors[0].quota_group: REFERENCE_MODE answers as the reference does; `quota_group` is Tollgate's"),
        "{errors}"
    );
    let mut builder = RulesBuilder::new(reference);
    builder.add_yaml(
        "rules.yaml",
        "domain: d\ndescriptors:\n  - key: m\n    quota_mode: true\n    metadata: {quota_group: g}\n    rate_limit: {unit: hour, requests_per_unit: 1}\n",
    );
    let rules = builder.finish().unwrap_or_else(|e| panic!("{e}"));
    let m = rule(&rules, &[("m", "x")]);
    assert_eq!(m.quota_group(), None);
    assert!(
        m.metadata()
            .is_some_and(|meta| meta.contains_key("quota_group"))
    );
}
