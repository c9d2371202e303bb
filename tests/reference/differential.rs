//! Differential test: for each seed, a random rule set and request sequence
//! ([`crate::generate`]) go in lockstep to the reference and to Tollgate, each server on a
//! redis-server of its own, and every answer is compared field by field
//! ([`crate::compare`]).
//!
//! Tollgate runs in two ways, one test each: with its defaults and fixed windows
//! (`DEFAULT_ALGORITHM=fixed_window`: its sliding windows differ by design) and a store
//! timeout as long as the reference's (`STORE_TIMEOUT=10s`: an answer decided without
//! Redis would be noise here), and with `REFERENCE_MODE=true`, which is to answer and count
//! exactly as the reference does.
//!
//! The test command runs seed [`FIXED_SEED`]; `DIFFERENTIAL_SEEDS=N` runs seeds 1 to N,
//! `DIFFERENTIAL_SEED=S` seed S alone; `DIFFERENTIAL_WITHOUT=name,…` leaves features out
//! of the cases ([`crate::generate::FEATURES`]), so that a known difference stops hiding
//! the ones behind it. A seed stops at its first difference, which is then
//! made minimal: the requests before it are dropped one by one, and the descriptors of
//! each, as long as a difference of the same kind remains (each attempt counts in fresh
//! counters: the rules are loaded under several domains, one per attempt); then, on
//! servers started afresh for each attempt, the settings, the rules' descriptors and
//! their options. A difference is printed with the rules, the settings, the requests and
//! both answers; with several seeds, a table of the kinds of difference found and the
//! smallest case of each (only those are simplified).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{Code, DescriptorStatus};
use tollgate_testkit::grpc::Rls;
use tollgate_testkit::redis::RedisServer;
use tollgate_testkit::reference::{self, Installed, Reference, RuntimeRoot, plain_env};
use tollgate_testkit::tollgate::Server;
use tollgate_testkit::{http, wait};

use crate::compare::{self, Answer, Difference};
use crate::generate::{Case, without_from_env};
use crate::support::{reference_mode_note, tollgate_with_env, vars, work_dir};

/// Features the pinned reference (its module at 2026-01-22, the newest the Go module proxy
/// serves) does not have, always left out:
/// - `quota`: quota mode there is its first design (#1045: every answer OK), which its
///   #1059 replaced by the rule Tollgate follows (OVER_LIMIT when a non-quota descriptor,
///   or every quota descriptor, is over); tests/envoy/budgets.rs checks that rule with the
///   reference's later integration scenarios;
/// - `negative`: `is_negative_hits`, which it ignores (it counts the hits up).
const REFERENCE_LACKS: [&str; 2] = ["quota", "negative"];

/// The seed of the test command.
const FIXED_SEED: u64 = 1;
/// Domains a case's rules are loaded under on its first servers: its run and the
/// attempts to drop requests.
const DOMAINS: usize = 40;
/// Most restarts spent on simplifying the settings and rules of one case.
const SIMPLIFY_ATTEMPTS: usize = 80;
/// How a replay's domain is shown: the one of the rules as printed.
const SHOWN_DOMAIN: &str = "d";
/// The rules' windows are a minute or longer, and every boundary of theirs is a minute
/// boundary: a replay, which takes well under this, starts with this much of the minute
/// left.
const REPLAY_NEEDS: Duration = Duration::from_secs(3);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_with_fixed_windows_answers_as_the_reference() {
    run(Variant::FixedWindow).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tollgate_in_reference_mode_answers_as_the_reference() {
    run(Variant::ReferenceMode).await;
}

/// How Tollgate is set up.
#[derive(Clone, Copy, Debug)]
enum Variant {
    FixedWindow,
    ReferenceMode,
}

impl Variant {
    fn env(self) -> Vec<(String, String)> {
        match self {
            Variant::FixedWindow => vars(&[
                ("DEFAULT_ALGORITHM", "fixed_window"),
                ("STORE_TIMEOUT", "10s"),
            ]),
            Variant::ReferenceMode => vars(&[("REFERENCE_MODE", "true")]),
        }
    }

    fn describe(self) -> String {
        let env: Vec<String> = self
            .env()
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        format!("Tollgate with {}", env.join(" "))
    }
}

/// The seeds to run: `DIFFERENTIAL_SEED`, else 1..=`DIFFERENTIAL_SEEDS`, else the fixed one.
fn seeds() -> Vec<u64> {
    let number = |name: &str| {
        std::env::var(name).ok().map(|value| {
            value
                .trim()
                .parse::<u64>()
                .unwrap_or_else(|e| panic!("{name}={value} is not a number: {e}"))
        })
    };
    match (number("DIFFERENTIAL_SEED"), number("DIFFERENTIAL_SEEDS")) {
        (Some(seed), _) => vec![seed],
        (None, Some(n)) => (1..=n).collect(),
        (None, None) => vec![FIXED_SEED],
    }
}

async fn run(variant: Variant) {
    let test = format!("differential: {}", variant.describe());
    let Some(installed) = reference::or_skip(&test) else {
        return;
    };
    let note = match variant {
        Variant::ReferenceMode => reference_mode_note(),
        Variant::FixedWindow => String::new(),
    };
    let mut session = Session {
        installed,
        variant,
        reference_redis: RedisServer::start(),
        tollgate_redis: RedisServer::start(),
        serial: 0,
    };
    let seeds = seeds();
    let mut without = without_from_env();
    without.extend(REFERENCE_LACKS);
    if let Variant::FixedWindow = variant {
        // Tollgate's own all-or-nothing (docs/MIGRATING.md, "Differences from the reference").
        without.push("stop_increment");
    }
    let mut findings = Vec::new();
    for &seed in &seeds {
        if let Some(finding) = session.check(Case::generate(seed, &without)).await {
            findings.push(finding);
        }
    }
    if findings.is_empty() {
        return;
    }
    let mut classes: BTreeMap<String, Vec<Finding>> = BTreeMap::new();
    for finding in findings {
        classes
            .entry(finding.kind.clone())
            .or_default()
            .push(finding);
    }
    let mut report = format!(
        "\n##### {}: {} of {} seeds answer differently from the reference; {} kinds{} #####\n",
        variant.describe(),
        classes.values().map(Vec::len).sum::<usize>(),
        seeds.len(),
        classes.len(),
        if without.is_empty() {
            String::new()
        } else {
            format!(" (DIFFERENTIAL_WITHOUT={})", without.join(","))
        }
    );
    for (kind, list) in &classes {
        let seeds: Vec<String> = list
            .iter()
            .take(12)
            .map(|f| f.case.seed.to_string())
            .collect();
        let more = if list.len() > 12 { ", …" } else { "" };
        let _ = writeln!(
            report,
            "{:>5} seeds: {kind}  (seeds {}{more})",
            list.len(),
            seeds.join(", ")
        );
    }
    for list in classes.into_values() {
        if let Some(smallest) = list.into_iter().min_by_key(Finding::size) {
            let simplest = session.simplify(smallest).await;
            let _ = write!(report, "{simplest}");
        }
    }
    eprintln!("{report}{note}");
    panic!(
        "{}: answers differ from the reference's (cases above){note}",
        variant.describe()
    );
}

/// A case on which Tollgate differs from the reference.
struct Finding {
    variant: Variant,
    case: Case,
    /// Requests of the generated sequence up to the first difference.
    original: usize,
    /// What the last step differs in, or the refusal: see [`Outcome::kind`].
    kind: String,
    outcome: Outcome,
}

/// What a case gave.
enum Outcome {
    /// Tollgate would not start on rules the reference serves.
    Refused(String),
    /// The requests up to the first difference, if any, with both answers.
    Ran {
        steps: Vec<Step>,
        /// `tollgate_store_fallbacks_total` after the run: answers decided without Redis.
        fallbacks: f64,
    },
}

impl Outcome {
    /// The kind of difference: what differs in the last step, or the refusal; `None` if
    /// the answers agree.
    fn kind(&self) -> Option<String> {
        match self {
            Outcome::Refused(why) => Some(format!("Tollgate refuses the rules: {}", problem(why))),
            Outcome::Ran { steps, .. } => kind_of(steps),
        }
    }

    fn requests(&self) -> Vec<RateLimitRequest> {
        match self {
            Outcome::Refused(_) => Vec::new(),
            Outcome::Ran { steps, .. } => steps.iter().map(|s| s.request.clone()).collect(),
        }
    }
}

/// The problem in Tollgate's refusal of a rule file, without the file and the place
/// (`FILE: PLACE: PROBLEM (line L column C)` in its last line).
fn problem(refusal: &str) -> &str {
    let line = refusal
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default();
    let problem = line.rsplit_once(".yaml: ").map_or(line, |(_, rest)| rest);
    let problem = problem.split_once(": ").map_or(problem, |(_, rest)| rest);
    problem
        .rsplit_once(" (line ")
        .map_or(problem, |(problem, _)| problem)
}

/// What the last of `steps` differs in most (see [`Difference::rank`]), and for a
/// descriptor's status how many hits it asked for and whether with an override or
/// negative, if it differs at all.
fn kind_of(steps: &[Step]) -> Option<String> {
    let step = steps.last()?;
    let primary = step.differences.iter().min_by_key(|d| d.rank())?;
    let mut kind = primary.class();
    if let Some(d) = primary
        .status()
        .and_then(|i| step.request.descriptors.get(i))
    {
        let hits = d
            .hits_addend
            .as_ref()
            .map_or(u64::from(step.request.hits_addend.max(1)), |h| h.value);
        let mut features = vec![match hits {
            0 => "hits 0",
            1 => "hits 1",
            _ => "hits n",
        }];
        if d.limit.is_some() {
            features.push("override");
        }
        if d.is_negative_hits {
            features.push("negative");
        }
        kind.push_str(&format!(" ({})", features.join(", ")));
    }
    Some(kind)
}

/// Whether every difference of the last of `steps` follows from a deliberate difference
/// (docs/MIGRATING.md, "Differences from the reference"): Tollgate counts admitted hits
/// only, and a refused request on none of its descriptors, so once the reference has
/// counted hits it denied on the same entries (earlier, or before in the same request), or
/// hits of a request it refused, the counts differ, and a denial reports what is left where the
/// reference's over-counted counter has nothing; or the reference counted under another
/// window length in the same key (its key names a window's start, not its length, so a day
/// and a week that start together share a counter; Tollgate's do not). With `shadow`
/// rules a denial answers OK: one with nothing left is taken for one. Headers, metadata
/// and the overall code follow the statuses.
fn deliberate(steps: &[Step], shadow: bool) -> bool {
    let Some(last) = steps.last() else {
        return false;
    };
    let explained_status = |i: usize, field: &str| {
        let Some(descriptor) = last.request.descriptors.get(i) else {
            return false;
        };
        let statuses = reference_statuses(last);
        let denied_here = statuses
            .get(i)
            .is_some_and(|status| denied(status, hits_of(last, descriptor), shadow));
        if field.ends_with("limit_remaining") && denied_here {
            return true;
        }
        let unit = statuses.get(i).map(unit_of);
        earlier(steps, i).any(|(d, status, hits)| {
            d.entries == descriptor.entries
                && (denied(status, hits, shadow) || Some(unit_of(status)) != unit)
        }) || counted_in_refused(steps, shadow, descriptor)
    };
    let statuses: Vec<(usize, &str)> = last
        .differences
        .iter()
        .filter_map(|d| d.status().map(|i| (i, d.field.as_str())))
        .collect();
    let any_denial =
        earlier(steps, usize::MAX).any(|(_, status, hits)| denied(status, hits, shadow));
    !last.differences.is_empty()
        && statuses
            .iter()
            .all(|&(i, field)| explained_status(i, field))
        && last.differences.iter().all(|d| {
            d.status().is_some()
                || d.field == "overall_code" && !statuses.is_empty()
                || (d.field.starts_with("response_headers_to_add")
                    || d.field.starts_with("dynamic_metadata"))
                    && any_denial
        })
}

/// Whether one of `steps` that the reference refused (or, with `shadow`, denied a
/// descriptor of) counted hits on the entries of `descriptor`: Tollgate counts a refused
/// request on none of its descriptors (all or none), the reference on those that fit.
fn counted_in_refused(steps: &[Step], shadow: bool, descriptor: &RateLimitDescriptor) -> bool {
    steps.iter().any(|step| {
        let statuses = reference_statuses(step);
        let refused = statuses.iter().any(|status| {
            status.code == Code::OverLimit as i32 || (shadow && status.limit_remaining == 0)
        });
        refused
            && step
                .request
                .descriptors
                .iter()
                .any(|d| d.entries == descriptor.entries && hits_of(step, d) > 0)
    })
}

/// Whether the reference denied a descriptor while counting `hits` on it.
fn denied(status: &DescriptorStatus, hits: u64, shadow: bool) -> bool {
    let over = status.code == Code::OverLimit as i32;
    hits > 0 && (over || (shadow && status.limit_remaining == 0))
}

/// The hits a descriptor of `step` asked for.
fn hits_of(step: &Step, d: &RateLimitDescriptor) -> u64 {
    d.hits_addend
        .as_ref()
        .map_or(u64::from(step.request.hits_addend.max(1)), |h| h.value)
}

/// The descriptors of every step, the last one's only before its descriptor `i`, with
/// the reference's status and the hits each asked for.
fn earlier(
    steps: &[Step],
    i: usize,
) -> impl Iterator<Item = (&RateLimitDescriptor, &DescriptorStatus, u64)> {
    steps.iter().enumerate().flat_map(move |(s, step)| {
        let until = if s + 1 == steps.len() { i } else { usize::MAX };
        step.request
            .descriptors
            .iter()
            .zip(reference_statuses(step))
            .take(until)
            .map(move |(d, status)| (d, status, hits_of(step, d)))
    })
}

fn reference_statuses(step: &Step) -> &[DescriptorStatus] {
    step.reference
        .as_ref()
        .map(|r| r.statuses.as_slice())
        .unwrap_or_default()
}

/// The unit of the limit a status names (0 when none).
fn unit_of(status: &DescriptorStatus) -> i32 {
    status.current_limit.as_ref().map_or(0, |l| l.unit)
}

/// Whether any of the case's rules or settings is in shadow mode.
fn has_shadow(case: &Case) -> bool {
    case.rules_yaml(SHOWN_DOMAIN).contains("shadow_mode: true")
        || case
            .settings
            .iter()
            .any(|(name, value)| name == "SHADOW_MODE" && value == "true")
}

/// One request and the two answers.
struct Step {
    /// For the rules' domain ([`crate::generate::RULES_DOMAIN`]), not the replay's.
    request: RateLimitRequest,
    reference: Answer,
    tollgate: Answer,
    differences: Vec<Difference>,
}

impl Finding {
    /// Smaller is simpler to read: steps, then the size of the rules.
    fn size(&self) -> (usize, usize) {
        (
            self.outcome.requests().len(),
            self.case.rules_yaml(SHOWN_DOMAIN).len(),
        )
    }
}

impl std::fmt::Display for Finding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let settings: Vec<String> = self
            .case
            .settings
            .iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        writeln!(
            f,
            "\n=== seed {} ({}{}) ===",
            self.case.seed,
            self.variant.describe(),
            if settings.is_empty() {
                String::new()
            } else {
                format!("; both servers with {}", settings.join(" "))
            }
        )?;
        writeln!(f, "kind: {}", self.kind)?;
        writeln!(f, "rules:\n{}", self.case.rules_yaml(SHOWN_DOMAIN))?;
        match &self.outcome {
            Outcome::Refused(why) => writeln!(
                f,
                "the reference serves these rules; Tollgate exits at startup:\n{why}"
            ),
            Outcome::Ran { steps, fallbacks } => {
                writeln!(
                    f,
                    "requests (the first difference was at request {} of the generated \
                     sequence; minimised to {}):",
                    self.original,
                    steps.len()
                )?;
                for (i, step) in steps.iter().enumerate() {
                    let request = compare::request(&Case::domain(&step.request, SHOWN_DOMAIN));
                    writeln!(f, "  {}. {request}", i + 1)?;
                    if step.differences.is_empty() {
                        writeln!(f, "     both: {}", compare::answer(&step.reference))?;
                        continue;
                    }
                    writeln!(f, "     reference: {}", compare::answer(&step.reference))?;
                    writeln!(f, "     tollgate:  {}", compare::answer(&step.tollgate))?;
                    for d in &step.differences {
                        writeln!(
                            f,
                            "     differs: {}: reference {}, tollgate {}",
                            d.field, d.reference, d.tollgate
                        )?;
                    }
                }
                if *fallbacks > 0.0 {
                    writeln!(
                        f,
                        "NOTE: Tollgate decided {fallbacks} answers without Redis (store \
                         timeouts): this case may be noise"
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// What every case of one test shares: the servers' binaries and stores, and a serial
/// number that gives every replay a domain of its own (fresh counters, though the stores
/// are kept).
struct Session {
    installed: &'static Installed,
    variant: Variant,
    reference_redis: RedisServer,
    tollgate_redis: RedisServer,
    serial: usize,
}

/// The two servers of one attempt, and the domains their rules are loaded under.
struct Trial {
    reference: Rls,
    tollgate: Rls,
    tollgate_server: Server,
    domains: std::vec::IntoIter<String>,
    reference_server: Reference,
    _root: RuntimeRoot,
}

impl Session {
    /// Starts both servers on `case`'s rules under `domains` new domains; the refusal if
    /// Tollgate will not start.
    async fn start(&mut self, case: &Case, domains: usize) -> Result<Trial, String> {
        let root = RuntimeRoot::new_in(&work_dir("differential"));
        let names: Vec<String> = (0..domains)
            .map(|_| {
                self.serial += 1;
                format!("s{}n{}", case.seed, self.serial)
            })
            .collect();
        for domain in &names {
            root.write(&format!("{domain}.yaml"), &case.rules_yaml(domain));
        }
        let common = |redis: &RedisServer| {
            let mut env = plain_env(&redis.host_port(), &root);
            env.extend(case.settings.iter().cloned());
            env
        };
        let mut tollgate_env = common(&self.tollgate_redis);
        tollgate_env.extend(self.variant.env());
        let starting = tollgate_with_env(&tollgate_env)
            .spawn()
            .unwrap_or_else(|e| panic!("{e}"));
        let reference = Reference::start(self.installed, &common(&self.reference_redis)).await;
        let tollgate_server = starting.ready().map_err(|exit| exit.stderr)?;
        Ok(Trial {
            reference: reference.client().await,
            tollgate: tollgate_server.client().await,
            tollgate_server,
            domains: names.into_iter(),
            reference_server: reference,
            _root: root,
        })
    }

    /// Runs `case`: the minimal difference if there is one.
    async fn check(&mut self, case: Case) -> Option<Finding> {
        let mut trial = match self.start(&case, DOMAINS).await {
            Ok(trial) => trial,
            Err(why) => {
                let outcome = Outcome::Refused(why);
                return Some(Finding {
                    variant: self.variant,
                    kind: outcome.kind()?,
                    case,
                    original: 0,
                    outcome,
                });
            }
        };
        assert_serves(&trial, &case).await;
        let steps = trial.replay(&case.requests).await?;
        if matches!(self.variant, Variant::FixedWindow) && deliberate(&steps, has_shadow(&case)) {
            // REFERENCE_MODE (the other test) answers these as the reference does.
            return None;
        }
        let outcome = Outcome::Ran {
            fallbacks: 0.0,
            steps,
        };
        let kind = outcome.kind()?;
        let original = outcome.requests().len();
        let steps = match outcome {
            Outcome::Ran { steps, .. } => trial.minimise(steps, &kind).await,
            Outcome::Refused(_) => return None,
        };
        let fallbacks = trial.fallbacks().await;
        Some(Finding {
            variant: self.variant,
            case,
            original,
            kind,
            outcome: Outcome::Ran { steps, fallbacks },
        })
    }

    /// `finding` with settings, descriptors of the rules and their options dropped as
    /// long as a difference of the same kind remains; each attempt on new servers.
    async fn simplify(&mut self, mut finding: Finding) -> Finding {
        let requests = finding.outcome.requests();
        let mut at = 0;
        for _ in 0..SIMPLIFY_ATTEMPTS {
            let Some(candidate) = finding.case.simplifications().into_iter().nth(at) else {
                break;
            };
            let outcome = match self.start(&candidate, 1).await {
                Err(why) => Outcome::Refused(why),
                Ok(mut trial) => match trial.replay(&requests).await {
                    None => break,
                    Some(steps) => Outcome::Ran {
                        fallbacks: trial.fallbacks().await,
                        steps,
                    },
                },
            };
            if outcome.kind().as_ref() == Some(&finding.kind) {
                finding.case = candidate;
                finding.outcome = outcome;
            } else {
                at += 1;
            }
        }
        finding
    }
}

impl Trial {
    /// Sends `requests` to both, under a domain not used before, until the first
    /// difference; `None` when no domain is left.
    async fn replay(&mut self, requests: &[RateLimitRequest]) -> Option<Vec<Step>> {
        let domain = self.domains.next()?;
        wait::room_in_window(Duration::from_secs(60), REPLAY_NEEDS).await;
        let mut steps = Vec::new();
        for request in requests {
            let bound = Case::domain(request, &domain);
            let reference = self.reference.call(bound.clone()).await;
            let tollgate = self.tollgate.call(bound).await;
            let differences = compare::differences(&reference, &tollgate);
            let differs = !differences.is_empty();
            steps.push(Step {
                request: request.clone(),
                reference,
                tollgate,
                differences,
            });
            if differs {
                break;
            }
        }
        Some(steps)
    }

    /// `steps` (ending in a difference of `kind`) with as few requests, and descriptors,
    /// as keep a difference of that kind.
    async fn minimise(&mut self, mut steps: Vec<Step>, kind: &str) -> Vec<Step> {
        let same = |tried: &[Step]| kind_of(tried).as_deref() == Some(kind);
        let mut requests: Vec<RateLimitRequest> = steps.iter().map(|s| s.request.clone()).collect();
        let mut i = 0;
        while i + 1 < requests.len() {
            let mut candidate = requests.clone();
            candidate.remove(i);
            match self.replay(&candidate).await {
                None => return steps,
                Some(tried) if same(&tried) => {
                    requests = tried.iter().map(|s| s.request.clone()).collect();
                    steps = tried;
                }
                Some(_) => i += 1,
            }
        }
        for r in 0..requests.len() {
            let mut d = 0;
            while requests[r].descriptors.len() > 1 && d < requests[r].descriptors.len() {
                let mut candidate = requests.clone();
                candidate[r].descriptors.remove(d);
                match self.replay(&candidate).await {
                    None => return steps,
                    Some(tried) if tried.len() == candidate.len() && same(&tried) => {
                        requests = candidate;
                        steps = tried;
                    }
                    Some(_) => d += 1,
                }
            }
        }
        steps
    }

    /// Answers Tollgate decided without Redis so far.
    async fn fallbacks(&self) -> f64 {
        self.tollgate_server
            .metric("tollgate_store_fallbacks_total")
            .await
            .unwrap_or(0.0)
    }
}

/// Panics unless the reference loaded the case's rules (it logs a file it refuses and
/// serves nothing): the generator must write only rules the reference accepts.
async fn assert_serves(trial: &Trial, case: &Case) {
    let reference = &trial.reference_server;
    let dump = http::get(reference.debug, "/rlconfig").await;
    let domain = format!("s{}n", case.seed);
    assert!(
        dump.body.contains(&domain),
        "the reference did not load the generated rules of seed {} (a bug of the \
         generator):\n{}\nits log:\n{}",
        case.seed,
        case.rules_yaml(SHOWN_DOMAIN),
        reference.log().tail(20)
    );
}
