//! Names for unnamed limits: the place of their rule in the rules, so that the
//! `RateLimit-Policy` header and the 429 hook tell which rule applied
//! (`"remote_address.path_/login"`) where the core's fallback says `descriptor-0`.

use std::borrow::Cow;

use tollgate_core::{Decision, Outcome, Request, Rules};

/// `decision` with every unnamed limit named by its rule's path (levels joined with `.`,
/// each `key` or `key_value`, as the reference's metric labels write them). Limits of no
/// rule (a request's own override) keep no name.
pub(crate) fn by_rule_path<'d>(
    decision: &'d Decision,
    request: &Request<'_>,
    rules: &Rules,
) -> Cow<'d, Decision> {
    let unnamed = |o: &Outcome| {
        o.limited()
            .is_some_and(|l| l.limit.name().is_none_or(str::is_empty))
    };
    if !decision.descriptors.iter().any(unnamed) {
        return Cow::Borrowed(decision);
    }
    let Some(domain) = rules.domain(&request.domain) else {
        return Cow::Borrowed(decision);
    };
    let mut named = decision.clone();
    for (outcome, descriptor) in named.descriptors.iter_mut().zip(&request.descriptors) {
        if !unnamed(outcome) {
            continue;
        }
        if let (Outcome::Limited(limited), Some(rule)) = (outcome, domain.find(descriptor.pairs()))
        {
            limited.limit = limited.limit.clone().with_name(rule.path().join("."));
        }
    }
    Cow::Owned(named)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tollgate_core::{Descriptor, Limit, Limited, Unit};

    use super::*;

    fn limited(limit: Limit) -> Outcome {
        Outcome::Limited(Limited {
            limit,
            admitted: true,
            shadow: false,
            quota: false,
            remaining: 1,
            reset: Duration::from_secs(1),
            hits: 1,
            metadata: None,
            group_over: false,
            in_flight: None,
        })
    }

    fn name(outcome: &Outcome) -> Option<&str> {
        outcome.limited().and_then(|l| l.limit.name())
    }

    #[test]
    fn unnamed_limits_take_their_rules_path_and_named_ones_keep_theirs() {
        let rules = Rules::from_yaml(
            "rules.yaml",
            r#"
domain: api
descriptors:
  - key: remote_address
    descriptors:
      - key: path
        value: /login
        rate_limit: {unit: minute, requests_per_unit: 3}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3, name: per-user}
"#,
        )
        .expect("valid rules");
        let request = Request::new(
            "api",
            vec![
                Descriptor::new([("remote_address", "192.0.2.1"), ("path", "/login")]),
                Descriptor::new([("user", "ann")]),
                Descriptor::new([("other", "x")]),
            ],
        );
        let decision = Decision {
            over_limit: false,
            descriptors: vec![
                limited(Limit::new(3, Unit::Minute)),
                limited(Limit::new(3, Unit::Minute).with_name("per-user")),
                limited(Limit::new(9, Unit::Second)),
            ],
        };
        let named = by_rule_path(&decision, &request, &rules);
        let names: Vec<_> = named.descriptors.iter().map(name).collect();
        assert_eq!(
            names,
            [Some("remote_address.path_/login"), Some("per-user"), None]
        );
        let all_named = Decision {
            over_limit: false,
            descriptors: vec![decision.descriptors[1].clone()],
        };
        assert!(matches!(
            by_rule_path(&all_named, &request, &rules),
            Cow::Borrowed(_)
        ));
    }
}
