//! `RateLimitConfig` resources → rules, through the same model and validation as YAML
//! files: each resource becomes a [`DomainSpec`] named by the resource, so that problems
//! read `resource-name: descriptors[0].rate_limit.unit: invalid rate limit unit 'x'`.
//! Pure: no I/O, no clock.

use envoy_types::pb::google::protobuf::value::Kind;
use envoy_types::pb::google::protobuf::{Any, Struct, Value};
use envoy_types::pb::ratelimit::config::ratelimit::v3::{
    RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitUnit,
};
use prost::{Message, Name};
use tollgate_core::Rules;
use tollgate_core::rules::{
    DescriptorSpec, DomainSpec, MetaValue, Metadata, RateLimitSpec, ReplaceSpec, RulesBuilder,
};

use super::problem::Problem;

/// The rules of one response, and the names of the resources they came from.
#[derive(Debug)]
pub(crate) struct Compiled {
    pub(crate) rules: Rules,
    pub(crate) resources: Vec<String>,
}

/// Decodes and compiles every resource of one response into one rule set (State of the
/// World: the response is the whole configuration). `Err` holds every problem found, one
/// per entry, each naming its resource.
pub(crate) fn compile(
    resources: &[Any],
    mut builder: RulesBuilder,
) -> Result<Compiled, Vec<Problem>> {
    let mut problems = Vec::new();
    let mut names = Vec::with_capacity(resources.len());
    for (i, any) in resources.iter().enumerate() {
        let config = match decode(i, any) {
            Ok(config) => config,
            Err(problem) => {
                problems.push(problem);
                continue;
            }
        };
        // Envoy Gateway names each resource after its domain; an unnamed one is named by
        // its place, so that errors still point somewhere.
        let origin = if config.name.is_empty() {
            format!("resources[{i}]")
        } else {
            config.name.clone()
        };
        builder.add_spec(&origin, domain_spec(config));
        names.push(origin);
    }
    match builder.finish() {
        Ok(rules) if problems.is_empty() => Ok(Compiled {
            rules,
            resources: names,
        }),
        Ok(_) => Err(problems),
        Err(errors) => {
            problems.extend(errors.0.into_iter().map(Problem::Rule));
            Err(problems)
        }
    }
}

/// Resource `index` of a response, decoded.
fn decode(index: usize, any: &Any) -> Result<RateLimitConfig, Problem> {
    let expected = RateLimitConfig::type_url();
    if any.type_url != expected {
        return Err(Problem::ResourceType {
            index,
            found: any.type_url.clone(),
            expected,
        });
    }
    RateLimitConfig::decode(any.value.as_slice())
        .map_err(|error| Problem::Undecodable { index, error })
}

/// One resource as the rules model: the xDS fields map one to one onto the YAML ones.
pub(crate) fn domain_spec(config: RateLimitConfig) -> DomainSpec {
    DomainSpec {
        domain: config.domain,
        descriptors: config.descriptors.into_iter().map(descriptor).collect(),
    }
}

fn descriptor(d: RateLimitDescriptor) -> DescriptorSpec {
    DescriptorSpec {
        key: d.key,
        value: (!d.value.is_empty()).then_some(d.value),
        rate_limit: d.rate_limit.map(policy),
        rate_limits: None,
        // The protocol has no field for it: in-flight limits come from rule files only.
        in_flight: None,
        descriptors: d.descriptors.into_iter().map(descriptor).collect(),
        shadow_mode: d.shadow_mode,
        detailed_metric: d.detailed_metric,
        value_to_metric: false,
        // The protocol has no field for it either.
        share_threshold: false,
        quota_mode: d.quota_mode,
        // The protocol has no field for it: the metadata key `quota_group` names it.
        quota_group: None,
        // xDS has no field for it: BUDGET_DOMAINS makes rules of a domain budgets.
        budget: false,
        metadata: d.metadata.map(metadata),
    }
}

fn policy(p: RateLimitPolicy) -> RateLimitSpec {
    RateLimitSpec {
        unit: unit_name(p.unit, p.unlimited),
        requests_per_unit: p.requests_per_unit,
        unlimited: p.unlimited,
        name: (!p.name.is_empty()).then_some(p.name),
        replaces: p
            .replaces
            .into_iter()
            .map(|r| ReplaceSpec { name: r.name })
            .collect(),
        ..RateLimitSpec::default()
    }
}

/// The unit as the YAML names it. UNKNOWN is no unit for an unlimited limit, as in the
/// reference; for any other it is kept by name so that validation rejects it the way the
/// reference does (`invalid rate limit unit 'UNKNOWN'`), as is a number outside the enum.
fn unit_name(unit: i32, unlimited: bool) -> Option<String> {
    match RateLimitUnit::try_from(unit) {
        Ok(RateLimitUnit::Unknown) if unlimited => None,
        Ok(known) => Some(known.as_str_name().to_owned()),
        Err(_) => Some(unit.to_string()),
    }
}

/// A `google.protobuf.Struct` as rule metadata.
fn metadata(s: Struct) -> Metadata {
    s.fields
        .into_iter()
        .map(|(key, value)| (key, meta_value(value)))
        .collect()
}

fn meta_value(v: Value) -> MetaValue {
    match v.kind {
        None | Some(Kind::NullValue(_)) => MetaValue::Null,
        Some(Kind::NumberValue(n)) => MetaValue::Number(n),
        Some(Kind::StringValue(s)) => MetaValue::String(s),
        Some(Kind::BoolValue(b)) => MetaValue::Bool(b),
        Some(Kind::StructValue(s)) => MetaValue::Map(metadata(s)),
        Some(Kind::ListValue(l)) => MetaValue::List(l.values.into_iter().map(meta_value).collect()),
    }
}

#[cfg(test)]
mod tests {
    use tollgate_core::Defaults;

    use envoy_types::pb::google::protobuf::ListValue;
    use envoy_types::pb::ratelimit::config::ratelimit::v3::RateLimitReplace;
    use envoy_types::util::pack_any;

    use super::*;

    /// A builder of the default settings.
    fn plain() -> RulesBuilder {
        RulesBuilder::new(Defaults::default())
    }

    /// One that merges domains given by several resources.
    fn merging() -> RulesBuilder {
        plain().merge_domains(true)
    }

    fn limit(unit: RateLimitUnit, requests_per_unit: u32) -> Option<RateLimitPolicy> {
        Some(RateLimitPolicy {
            unit: unit as i32,
            requests_per_unit,
            ..Default::default()
        })
    }

    fn config(name: &str, domain: &str, descriptors: Vec<RateLimitDescriptor>) -> Any {
        pack_any(RateLimitConfig {
            name: name.into(),
            domain: domain.into(),
            descriptors,
        })
    }

    /// Resource `name` for `domain` with one descriptor limited per `unit`.
    fn one(name: &str, domain: &str, k: &str, v: &str, unit: RateLimitUnit, n: u32) -> Any {
        config(name, domain, vec![key(k, v, limit(unit, n))])
    }

    fn key(key: &str, value: &str, rate_limit: Option<RateLimitPolicy>) -> RateLimitDescriptor {
        RateLimitDescriptor {
            key: key.into(),
            value: value.into(),
            rate_limit,
            ..Default::default()
        }
    }

    fn problems(resources: &[Any]) -> Vec<String> {
        texts(compile(resources, plain()).expect_err("invalid"))
    }

    fn texts(problems: Vec<Problem>) -> Vec<String> {
        problems.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn every_field_maps_onto_the_yaml_model() {
        let text = |s: &str| Value {
            kind: Some(Kind::StringValue(s.into())),
        };
        let meta = Struct {
            fields: [
                ("tier".to_owned(), text("gold")),
                (
                    "list".to_owned(),
                    Value {
                        kind: Some(Kind::ListValue(ListValue {
                            values: vec![
                                Value {
                                    kind: Some(Kind::NumberValue(2.0)),
                                },
                                Value { kind: None },
                            ],
                        })),
                    },
                ),
            ]
            .into_iter()
            .collect(),
        };
        let spec = domain_spec(RateLimitConfig {
            name: "res".into(),
            domain: "d".into(),
            descriptors: vec![RateLimitDescriptor {
                key: "k".into(),
                value: "".into(),
                rate_limit: Some(RateLimitPolicy {
                    unit: RateLimitUnit::Week as i32,
                    requests_per_unit: 7,
                    unlimited: false,
                    name: "weekly".into(),
                    replaces: vec![RateLimitReplace { name: "old".into() }],
                }),
                descriptors: vec![key("inner", "v", None)],
                shadow_mode: true,
                detailed_metric: true,
                quota_mode: true,
                metadata: Some(meta),
            }],
        });
        let d = &spec.descriptors[0];
        assert_eq!(spec.domain, "d");
        assert_eq!(d.key, "k");
        assert_eq!(d.value, None, "an empty value is the key-only default");
        let limit = d.rate_limit.as_ref().expect("a limit");
        assert_eq!(limit.unit.as_deref(), Some("WEEK"));
        assert_eq!(limit.requests_per_unit, 7);
        assert_eq!(limit.name.as_deref(), Some("weekly"));
        assert_eq!(limit.replaces, [ReplaceSpec { name: "old".into() }]);
        assert!(d.shadow_mode && d.detailed_metric && d.quota_mode);
        assert_eq!(d.descriptors[0].value.as_deref(), Some("v"));
        let meta = d.metadata.as_ref().expect("metadata");
        assert_eq!(meta["tier"], MetaValue::String("gold".into()));
        assert_eq!(
            meta["list"],
            MetaValue::List(vec![MetaValue::Number(2.0), MetaValue::Null])
        );
    }

    #[test]
    fn resources_compile_into_one_rule_set() {
        let compiled = compile(
            &[
                one("a", "alpha", "k", "", RateLimitUnit::Second, 1),
                one("b", "beta", "k", "x", RateLimitUnit::Year, 2),
            ],
            plain(),
        )
        .expect("valid");
        assert_eq!(compiled.resources, ["a", "b"]);
        let dump = compiled.rules.dump();
        assert_eq!(
            dump,
            "alpha.k: unit=SECOND requests_per_unit=1, shadow_mode=false\n\
             beta.k_x: unit=YEAR requests_per_unit=2, shadow_mode=false\n"
        );
        let empty = compile(&[], plain()).expect("no resources is valid");
        assert_eq!(empty.rules.domains().count(), 0);
    }

    #[test]
    fn unknown_unit_is_valid_only_when_unlimited() {
        let unlimited = Some(RateLimitPolicy {
            unlimited: true,
            ..Default::default()
        });
        let ok = compile(&[config("r", "d", vec![key("k", "", unlimited)])], plain())
            .expect("unlimited without a unit is valid");
        assert_eq!(ok.rules.dump(), "d.k: unlimited, shadow_mode=false\n");

        let errors = problems(&[one("r", "d", "k", "", RateLimitUnit::Unknown, 5)]);
        assert_eq!(
            errors,
            ["r: descriptors[0].rate_limit.unit: invalid rate limit unit 'UNKNOWN'"]
        );
        let mut odd = limit(RateLimitUnit::Second, 1);
        if let Some(p) = odd.as_mut() {
            p.unit = 42;
        }
        let errors = problems(&[config("r", "d", vec![key("k", "", odd)])]);
        assert_eq!(
            errors,
            ["r: descriptors[0].rate_limit.unit: invalid rate limit unit '42'"]
        );
    }

    #[test]
    fn every_problem_is_reported_and_named_by_its_resource() {
        let errors = problems(&[
            one("first", "d", "", "", RateLimitUnit::Second, 1),
            Any {
                type_url: "type.googleapis.com/other.Thing".into(),
                value: vec![],
            },
            Any {
                type_url: RateLimitConfig::type_url(),
                value: vec![0xff, 0xff, 0xff],
            },
            config("dup", "d", vec![]),
            config("", "", vec![]),
        ]);
        assert_eq!(errors.len(), 5, "{errors:#?}");
        assert_eq!(
            errors[0],
            "resources[1]: resource of type 'type.googleapis.com/other.Thing', expected \
             'type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig'"
        );
        assert!(
            errors[1].starts_with("resources[2]: cannot decode a RateLimitConfig: "),
            "{}",
            errors[1]
        );
        assert_eq!(errors[2], "first: descriptors[0]: descriptor has empty key");
        assert_eq!(
            errors[3],
            "dup: domain: duplicate domain 'd' (also in first)"
        );
        assert_eq!(
            errors[4],
            "resources[4]: domain: config file cannot have empty domain"
        );
    }

    #[test]
    fn same_domain_merges_only_when_asked() {
        let resources = [
            one("one", "shared", "a", "", RateLimitUnit::Minute, 1),
            one("two", "shared", "b", "", RateLimitUnit::Minute, 2),
        ];
        assert_eq!(
            problems(&resources),
            ["two: domain: duplicate domain 'shared' (also in one)"]
        );
        let merged = compile(&resources, merging()).expect("merged");
        assert_eq!(merged.rules.dump().lines().count(), 2);
        let clash = [
            one("one", "shared", "a", "", RateLimitUnit::Minute, 1),
            one("two", "shared", "a", "", RateLimitUnit::Hour, 1),
        ];
        let errors = texts(compile(&clash, merging()).expect_err("same key twice"));
        assert_eq!(errors.len(), 1, "{errors:#?}");
        assert!(errors[0].starts_with("two: "), "{}", errors[0]);
    }
}
