use std::time::Duration;

use super::*;
use crate::clock::{ManualClock, Timestamp};
use crate::lock::lock;
use crate::request::LimitOverride;
use crate::store::MemoryStore;
use crate::unit::Unit;

const SECOND: u64 = crate::clock::NANOS_PER_SECOND;

const RULES: &str = r#"
domain: d
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
  - key: api
    rate_limits:
      - {name: per_second, unit: second, requests_per_unit: 2}
      - {name: per_day, unit: day, requests_per_unit: 3}
  - key: bucket
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: token_bucket, burst: 2}
  - key: shadow
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: broad
    rate_limit: {name: broad, unit: minute, requests_per_unit: 1}
  - key: narrow
    rate_limit: {name: narrow, unit: minute, requests_per_unit: 5, replaces: [{name: broad}]}
  - key: free
    rate_limit: {unlimited: true}
"#;

fn limiter() -> (Limiter, ManualClock) {
    limiter_with(Options::default())
}

fn limiter_with(options: Options) -> (Limiter, ManualClock) {
    let clock = ManualClock::new(Timestamp::from_nanos(1_000 * SECOND));
    let rules = Rules::from_yaml("rules.yaml", RULES).expect("rules load");
    let store = Store::Memory(MemoryStore::new(
        crate::Capacity::default(),
        std::sync::Arc::new(clock.clone()),
    ));
    (Limiter::with_recorder(rules, store, options, ()), clock)
}

fn one<'a>(key: &'a str, value: &'a str) -> Descriptor<'a> {
    Descriptor::new([(key, value)])
}

async fn outcome(l: &Limiter, d: Descriptor<'_>) -> Outcome {
    let decision = l
        .decide(&Request::new("d", vec![d]))
        .await
        .expect("decides");
    decision
        .descriptors
        .into_iter()
        .next()
        .expect("one outcome")
}

async fn limited(l: &Limiter, d: Descriptor<'_>) -> Limited {
    match outcome(l, d).await {
        Outcome::Limited(limited) => limited,
        other => panic!("expected a counted descriptor, got {other:?}"),
    }
}

/// What `hits` on the one descriptor `entry` of `domain` get, from the rule limiting it.
pub(super) async fn limited_on(
    l: &Limiter,
    domain: &str,
    entry: (&str, &str),
    hits: Hits,
) -> Limited {
    let request = Request::new(domain, vec![Descriptor::new([entry]).with_hits(hits)]);
    let decision = l.decide(&request).await.expect("decides");
    decision.descriptors[0]
        .limited()
        .cloned()
        .expect("a counted descriptor")
}

#[tokio::test]
async fn a_check_counts_nothing_and_says_whether_the_counter_is_within_its_limit() {
    let (l, _) = limiter();
    let check = || one("user", "ann").with_hits(Hits::Check);
    for _ in 0..5 {
        let c = limited(&l, check()).await;
        assert!(c.admitted);
        assert_eq!(c.remaining, 3, "what is left, as the reference says");
        assert_eq!(c.hits, 0);
    }
    for _ in 0..3 {
        assert!(limited(&l, one("user", "ann")).await.admitted);
    }
    let at_limit = limited(&l, check()).await;
    assert!(at_limit.admitted, "at the limit, not over it");
    assert_eq!(at_limit.remaining, 0);
    assert!(!limited(&l, one("user", "ann")).await.admitted);
}

#[tokio::test]
async fn a_requests_refunds_are_counted_before_its_hits() {
    let (l, _) = limiter();
    let used = limited(&l, one("user", "ann").with_hits(Hits::Consume(3))).await;
    assert_eq!(used.remaining, 0);
    // A settlement: the usage listed before the refund of the reservation.
    let settle = Request::new(
        "d",
        vec![
            one("user", "ann").with_hits(Hits::Consume(2)),
            one("user", "ann").with_hits(Hits::Refund(3)),
        ],
    );
    let decision = l.decide(&settle).await.expect("decides");
    assert!(!decision.over_limit, "{decision:?}");
    assert_eq!(
        limited(&l, one("user", "ann").with_hits(Hits::Check))
            .await
            .remaining,
        1
    );
}

#[tokio::test]
async fn refunds_give_units_back() {
    let (l, _) = limiter();
    let three = limited(&l, one("user", "ann").with_hits(Hits::Consume(3))).await;
    assert_eq!((three.remaining, three.hits), (0, 3));
    let refund = limited(&l, one("user", "ann").with_hits(Hits::Refund(2))).await;
    assert!(refund.admitted);
    assert_eq!(refund.remaining, 2);
    assert_eq!(limited(&l, one("user", "ann")).await.remaining, 1);
}

#[tokio::test]
async fn several_limits_report_the_tightest_and_count_all_or_nothing() {
    let (l, clock) = limiter();
    let first = limited(&l, one("api", "k")).await;
    assert_eq!(first.limit.name(), Some("per_second"));
    assert_eq!(first.remaining, 1);
    limited(&l, one("api", "k")).await;
    let third = limited(&l, one("api", "k")).await;
    assert!(third.is_over());
    assert_eq!(third.limit.name(), Some("per_second"));
    clock.advance(Duration::from_nanos(2 * SECOND));
    let fourth = limited(&l, one("api", "k")).await;
    assert!(
        !fourth.is_over(),
        "the denied third hit was not counted by the daily limit"
    );
    assert_eq!(fourth.limit.name(), Some("per_day"));
    let fifth = limited(&l, one("api", "k")).await;
    assert!(fifth.is_over());
    assert_eq!(fifth.limit.name(), Some("per_day"));
}

#[tokio::test]
async fn token_bucket_rules_refill_continuously() {
    let (l, clock) = limiter();
    assert!(limited(&l, one("bucket", "b")).await.admitted);
    assert!(limited(&l, one("bucket", "b")).await.admitted);
    let denied = limited(&l, one("bucket", "b")).await;
    assert!(denied.is_over());
    assert_eq!(denied.reset, Duration::from_secs(1));
    clock.advance(Duration::from_nanos(SECOND));
    assert!(limited(&l, one("bucket", "b")).await.admitted);
}

#[tokio::test]
async fn a_limit_override_replaces_the_configured_limit() {
    let (l, _) = limiter();
    let mut d = one("user", "ann");
    d.limit = Some(LimitOverride {
        requests_per_unit: 1,
        unit: Unit::Hour,
    });
    let first = limited(&l, d.clone()).await;
    assert_eq!(
        (first.limit.requests_per_unit(), first.limit.unit()),
        (1, Unit::Hour)
    );
    assert!(limited(&l, d).await.is_over());
    // The configured 3/minute counter is a different counter and untouched.
    assert_eq!(limited(&l, one("user", "ann")).await.remaining, 2);
}

#[tokio::test]
async fn an_override_for_an_unknown_domain_limits_nothing() {
    let (l, _) = limiter();
    let mut d = one("user", "ann");
    d.limit = Some(LimitOverride {
        requests_per_unit: 0,
        unit: Unit::Second,
    });
    let decision = l
        .decide(&Request::new("other", vec![d]))
        .await
        .expect("decides");
    assert_eq!(decision.descriptors, [Outcome::NoLimit]);
    assert!(!decision.over_limit);
}

#[tokio::test]
async fn shadow_mode_counts_but_never_denies() {
    let (l, _) = limiter();
    limited(&l, one("shadow", "x")).await;
    let second = limited(&l, one("shadow", "x")).await;
    assert!(!second.admitted && second.shadow && !second.is_over());
    assert_eq!(second.remaining, 0);
}

#[tokio::test]
async fn replaced_limits_are_dropped_when_the_replacing_one_matches() {
    let (l, _) = limiter();
    let both = Request::new("d", vec![one("broad", "x"), one("narrow", "x")]);
    for _ in 0..3 {
        let decision = l.decide(&both).await.expect("decides");
        assert_eq!(decision.descriptors[0], Outcome::NoLimit);
        assert!(!decision.over_limit);
    }
    // Alone, the broad limit applies (1/minute).
    assert!(limited(&l, one("broad", "x")).await.admitted);
    assert!(limited(&l, one("broad", "x")).await.is_over());
}

#[tokio::test]
async fn unlimited_and_unmatched_descriptors() {
    let (l, _) = limiter();
    assert_eq!(outcome(&l, one("free", "x")).await, Outcome::Unlimited);
    assert_eq!(outcome(&l, one("nothing", "x")).await, Outcome::NoLimit);
}

#[tokio::test]
async fn global_shadow_mode_answers_ok_while_outcomes_tell_the_truth() {
    let (l, _) = limiter_with(Options {
        global_shadow_mode: true,
        ..Options::default()
    });
    for _ in 0..3 {
        limited(&l, one("user", "ann")).await;
    }
    let decision = l
        .decide(&Request::new("d", vec![one("user", "ann")]))
        .await
        .expect("decides");
    assert!(!decision.over_limit);
    assert!(decision.descriptors[0].is_over());
}

#[tokio::test]
async fn invalid_requests_are_refused_with_the_reason() {
    let (l, _) = limiter();
    let err = l
        .decide(&Request::new("d", vec![]))
        .await
        .expect_err("no descriptors");
    assert!(matches!(
        err,
        DecideError::InvalidArgument(InvalidRequest::NoDescriptors)
    ));
}

/// Counts what it is told, per rule, as a metrics recorder would.
#[derive(Default)]
struct Tally(std::sync::Mutex<Vec<(String, u64, bool)>>);

impl Recorder for Tally {
    type Rule = String;

    fn prepare(&self, rule: &Rule) -> String {
        format!("{}.{}", rule.domain(), rule.path().join("."))
    }

    fn record(&self, _: &Rule, name: &String, _: &Descriptor<'_>, outcome: &Limited) {
        let mut seen = lock(&self.0);
        seen.push((name.clone(), outcome.hits, outcome.admitted));
    }
}

#[tokio::test]
async fn the_recorder_sees_every_counted_descriptor_with_its_rule() {
    let rules = Rules::from_yaml("rules.yaml", RULES).expect("rules load");
    let l = Limiter::with_recorder(
        rules,
        Store::Memory(MemoryStore::default()),
        Options::default(),
        Tally::default(),
    );
    let request = Request::new("d", vec![one("user", "ann"), one("free", "x")]);
    for _ in 0..4 {
        l.decide(&request).await.expect("decides");
    }
    // Reinstalling prepares the rules again; decisions go on counting.
    l.install(Rules::from_yaml("rules.yaml", RULES).expect("rules load"));
    l.decide(&request).await.expect("decides");
    let seen = l.recorder().0.lock().expect("not poisoned").clone();
    let user = |admitted| ("d.user".to_owned(), 1, admitted);
    assert_eq!(
        seen,
        [user(true), user(true), user(true), user(false), user(false)]
    );
}

#[tokio::test]
async fn check_counts_the_given_hits_on_every_descriptor() {
    let (l, _) = limiter();
    let two = l
        .check(
            "d",
            [one("user", "ann"), one("user", "bob")],
            Hits::Consume(2),
        )
        .await
        .expect("decides");
    let remaining: Vec<u64> = two
        .descriptors
        .iter()
        .filter_map(|o| o.limited().map(|l| l.remaining))
        .collect();
    assert_eq!(remaining, [1, 1]);
    let more = l
        .check("d", [one("user", "ann")], Hits::Consume(2))
        .await
        .expect("decides");
    assert!(more.over_limit);
}

const BUDGETS: &str = r#"
domain: q
descriptors:
  - key: tenant
    quota_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1000}
  - key: tokens
    budget: true
    rate_limit: {unit: minute, requests_per_unit: 1000, algorithm: fixed_window}
  - key: service
    value: service_1
    quota_mode: true
    metadata: {service_with_quota: {name: service_1}}
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: service
    value: service_2
    quota_mode: true
    metadata: {service_with_quota: {name: service_2}}
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 3}
"#;

fn budgets(options: Options) -> (Limiter, ManualClock) {
    // On a minute boundary, so that fixed windows start with the test.
    let clock = ManualClock::new(Timestamp::from_nanos(60 * 1_000 * SECOND));
    let rules = Rules::from_yaml("budgets.yaml", BUDGETS).expect("rules load");
    let store = Store::Memory(MemoryStore::new(
        crate::Capacity::default(),
        std::sync::Arc::new(clock.clone()),
    ));
    (Limiter::with_recorder(rules, store, options, ()), clock)
}

async fn decide_q(l: &Limiter, descriptors: Vec<Descriptor<'_>>) -> Decision {
    l.decide(&Request::new("q", descriptors))
        .await
        .expect("decides")
}

#[tokio::test]
async fn a_budget_records_charges_past_the_limit_until_the_window_frees_room() {
    for key in ["tenant", "tokens"] {
        let (l, clock) = budgets(Options::default());
        let check = || one(key, "acme").with_hits(Hits::Check);
        let charge = || one(key, "acme").with_hits(Hits::Consume(400));
        for fits in [true, true, false] {
            assert!(!decide_q(&l, vec![check()]).await.over_limit, "{key}");
            let charged = limited_of(&decide_q(&l, vec![charge()]).await);
            assert_eq!(charged.admitted, fits, "{key}");
            assert_eq!(charged.hits, 400, "{key}: recorded either way");
        }
        // 1,200 of 1,000 used: every request-time check is over now...
        let denied = decide_q(&l, vec![check()]).await;
        assert!(denied.over_limit, "{key}");
        // ...until the charges have left the window.
        clock.advance(Duration::from_nanos(
            limited_of(&denied).reset.as_nanos() as u64
        ));
        assert!(!decide_q(&l, vec![check()]).await.over_limit, "{key}");
    }
}

fn limited_of(d: &Decision) -> Limited {
    d.descriptors[0]
        .limited()
        .cloned()
        .expect("a counted descriptor")
}

#[tokio::test]
async fn quota_mode_denies_only_when_every_budget_is_over() {
    let (l, _) = budgets(Options::default());
    let both = || vec![one("service", "service_1"), one("service", "service_2")];
    // service_1 allows 1 a minute, service_2 allows 2: the request passes while either
    // still has budget, as in the reference's quota scenario.
    let answers = [
        decide_q(&l, both()).await,
        decide_q(&l, both()).await,
        decide_q(&l, both()).await,
    ];
    let over: Vec<bool> = answers.iter().map(|d| d.over_limit).collect();
    assert_eq!(over, [false, false, true]);
    // Per-descriptor answers still tell the truth.
    assert!(answers[1].descriptors[0].is_over());
    assert!(!answers[1].descriptors[1].is_over());
    // The metadata of the rules travels with their outcomes.
    let meta = limited_of(&answers[0])
        .metadata
        .expect("service_1 has metadata");
    assert!(meta.contains_key("service_with_quota"));
    // A descriptor that is not a budget denies on its own, as always.
    let (l, _) = budgets(Options::default());
    decide_q(&l, vec![one("plain", "p")]).await;
    let mixed = decide_q(&l, vec![one("plain", "p"), one("service", "service_2")]).await;
    assert!(mixed.over_limit);
}

/// The reference's `multiservice-tokenquota.sh` (its newest source's integration suite)
/// on the manual clock, in the default sliding window: each request is checked against
/// both services, served by the first with quota and charged to it on the response path;
/// a minute after the last request service_1 has quota again. At several alignments to
/// the 6 s sub-windows, early in one first (issue #40).
#[tokio::test]
async fn the_references_multiservice_token_quota_script_passes_in_the_default_mode() {
    for offset_ms in [1, 300, 2_999, 5_990] {
        let (l, clock) = budgets(Options::default());
        clock.advance(Duration::from_millis(offset_ms));
        let services = ["service_1", "service_2"];
        let mut served = Vec::new();
        for request in 1..=7 {
            if request == 7 {
                // "Waiting 1 minute for quota buckets to be refreshed"
                clock.advance(Duration::from_secs(60));
            }
            let check = services
                .iter()
                .map(|s| one("service", s).with_hits(Hits::Check))
                .collect();
            let answer = decide_q(&l, check).await;
            let service = answer.descriptors.iter().position(|d| !d.is_over());
            if let Some(i) = service {
                let charge = one("service", services[i]).with_hits(Hits::Consume(1));
                decide_q(&l, vec![charge]).await;
            }
            served.push(service.map(|i| i + 1));
            clock.advance(Duration::from_millis(5));
        }
        let script = [Some(1), Some(1), Some(2), Some(2), Some(2), None, Some(1)];
        assert_eq!(served, script, "{offset_ms} ms into a minute");
    }
}

#[tokio::test]
async fn global_quota_mode_makes_every_descriptor_a_budget() {
    let (l, _) = budgets(Options {
        quota_mode: true,
        ..Options::default()
    });
    decide_q(&l, vec![one("plain", "p")]).await;
    // plain is over, but an unmatched descriptor is a budget that is not over.
    let d = decide_q(&l, vec![one("plain", "p"), one("unmatched", "x")]).await;
    assert!(!d.over_limit);
    let alone = decide_q(&l, vec![one("plain", "p")]).await;
    assert!(alone.over_limit);
    assert_eq!(limited_of(&alone).hits, 1, "charged though over");
}

#[tokio::test]
async fn all_or_nothing_gives_back_what_the_other_descriptors_counted() {
    for (all_or_nothing, user_left) in [(false, 1u64), (true, 2)] {
        let (l, _) = budgets(Options {
            all_or_nothing,
            ..Options::default()
        });
        let both = || vec![one("user", "ann"), one("plain", "p")];
        assert!(!decide_q(&l, both()).await.over_limit);
        let second = decide_q(&l, both()).await;
        assert!(second.over_limit);
        let user = second.descriptors[0].limited().expect("user is counted");
        assert_eq!(user.remaining, user_left, "reported");
        let next = decide_q(&l, vec![one("user", "ann").with_hits(Hits::Check)]).await;
        assert_eq!(
            limited_of(&next).remaining,
            user_left,
            "all_or_nothing={all_or_nothing}: what is left"
        );
    }
}

#[tokio::test]
async fn values_of_a_shared_wildcard_count_on_one_counter() {
    let rules = Rules::from_yaml(
        "rules.yaml",
        r#"
domain: d
descriptors:
  - key: files
    value: "docs/*"
    share_threshold: true
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: files
    value: "img/*"
    rate_limit: {unit: minute, requests_per_unit: 2}
"#,
    )
    .expect("rules");
    let l = Limiter::new(rules, Store::Memory(MemoryStore::default()));
    for (value, admitted) in [("docs/a", true), ("docs/b", true), ("docs/c", false)] {
        let got = limited(&l, one("files", value)).await.admitted;
        assert_eq!(got, admitted, "{value}: the docs/* values share 2 a minute");
    }
    for value in ["img/a", "img/a", "img/b", "img/b"] {
        assert!(
            limited(&l, one("files", value)).await.admitted,
            "{value}: 2 each"
        );
    }
}

#[tokio::test]
async fn explain_names_the_rule_the_counter_and_the_decision_without_counting() {
    let (l, _) = limiter();
    let request = Request::new(
        "d",
        vec![
            one("user", "ann"),
            one("nobody", "x"),
            one("broad", "b"),
            one("narrow", "n"),
        ],
    );
    let ann = Request::new("d", vec![one("user", "ann")]);
    for _ in 0..3 {
        l.decide(&ann).await.expect("decides");
    }
    for _ in 0..2 {
        let explained = l.explain(&request).await.expect("explains");
        assert!(explained.decision.over_limit);
        let [user, nobody, broad, narrow] = &explained.descriptors[..] else {
            panic!("four descriptors: {explained:?}");
        };
        match &user.matched {
            Matched::Rule { rule, origins } => {
                assert_eq!(rule.path(), ["user"]);
                assert_eq!(origins, &["rules.yaml"]);
            }
            other => panic!("{other:?}"),
        }
        let counter = user.counter.as_ref().expect("a counter");
        assert!(counter.key().starts_with("d|user=ann#"), "{counter:?}");
        assert_eq!(counter.limits()[0].requests_per_unit(), 3);
        let peek = user.peek.as_ref().expect("peeked");
        let local = peek.local.as_ref().expect("a local counter");
        assert!(local.held && peek.shared.is_none());
        assert_eq!(local.limits[0].remaining, 0);
        assert!(explained.decision.descriptors[0].is_over());
        assert!(matches!(nobody.matched, Matched::Nothing(NoMatch::NoRule)));
        assert!(matches!(broad.matched, Matched::Replaced(_)));
        assert!(matches!(narrow.matched, Matched::Rule { .. }));
        let narrow_peek = narrow.peek.as_ref().expect("peeked");
        let narrow_local = narrow_peek.local.as_ref().expect("a local counter");
        assert!(!narrow_local.held, "explaining counts nothing");
        assert_eq!(narrow_local.limits[0].remaining, 5);
    }
    let unknown = l
        .explain(&Request::new("nosuch", vec![one("user", "ann")]))
        .await
        .expect("explains");
    assert!(matches!(
        unknown.descriptors[0].matched,
        Matched::Nothing(NoMatch::NoDomain)
    ));
    assert!(!unknown.decision.over_limit);
}

#[tokio::test]
async fn reset_leaves_alone_the_counter_of_a_replaced_rule() {
    let (l, _) = limiter();
    assert!(limited(&l, one("broad", "x")).await.admitted);
    assert!(limited(&l, one("broad", "x")).await.is_over());
    let both = Request::new("d", vec![one("broad", "x"), one("narrow", "x")]);
    let keys = l.reset(&both).await.expect("resets");
    let [narrow] = &keys[..] else {
        panic!("only the counter the request is counted on: {keys:?}");
    };
    assert!(narrow.starts_with("d|narrow=x#"), "{narrow}");
    // Not counted by this request, the broad counter is not its to empty.
    assert!(limited(&l, one("broad", "x")).await.is_over());
}
