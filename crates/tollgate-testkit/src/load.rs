//! Traffic with timed answers: single timed calls, sequences round-robin over instances,
//! simultaneous bursts, paced background load, and the closed loop of the benchmark; and
//! what the answers say (tallies, latency percentiles).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use tokio::task::{JoinHandle, JoinSet};

use crate::grpc::{Code, RateLimitRequest, RateLimitResponse, Rls, request};
use crate::wait;

/// A call that has not been answered after this long is recorded as hung.
pub const HANG: Duration = Duration::from_secs(5);

/// One answer as the client saw it.
#[derive(Clone, Debug)]
pub struct Answer {
    /// Wall-clock times the request was sent and the answer received.
    pub sent: SystemTime,
    pub received: SystemTime,
    pub took: Duration,
    /// The overall code, or the gRPC error code (`DeadlineExceeded` if it hung).
    pub result: Result<Code, tonic::Code>,
    /// Whether the answer has one status per descriptor, each with its `current_limit`,
    /// and is OVER_LIMIT overall exactly when one of them is: what an answer must be when
    /// every descriptor matches a rule (false for an error).
    pub well_formed: bool,
}

/// A client the load is driven through: tonic's ([`Rls`]), or the benchmark's leaner one
/// ([`crate::h2_rls::H2Rls`]).
pub trait Call: Send + 'static {
    /// One `ShouldRateLimit`: the answer, or how the call failed.
    fn call(
        &mut self,
        req: RateLimitRequest,
    ) -> impl Future<Output = Result<RateLimitResponse, tonic::Status>> + Send;
}

impl Call for Rls {
    async fn call(&mut self, req: RateLimitRequest) -> Result<RateLimitResponse, tonic::Status> {
        Rls::call(self, req).await
    }
}

/// Sends `req`, timing it; never waits longer than [`HANG`].
pub async fn timed(rls: &mut impl Call, req: RateLimitRequest) -> Answer {
    let descriptors = req.descriptors.len();
    let sent = SystemTime::now();
    let start = Instant::now();
    let (result, well_formed) = match tokio::time::timeout(HANG, rls.call(req)).await {
        Err(_) => (Err(tonic::Code::DeadlineExceeded), false),
        Ok(Err(status)) => (Err(status.code()), false),
        Ok(Ok(resp)) => {
            let code = Code::try_from(resp.overall_code)
                .unwrap_or_else(|_| panic!("unknown code in {resp:?}"));
            let over = Code::OverLimit as i32;
            let well_formed = resp.statuses.len() == descriptors
                && resp.statuses.iter().all(|s| s.current_limit.is_some())
                && resp.statuses.iter().any(|s| s.code == over) == (code == Code::OverLimit);
            (Ok(code), well_formed)
        }
    };
    Answer {
        sent,
        received: SystemTime::now(),
        took: start.elapsed(),
        result,
        well_formed,
    }
}

/// One descriptor of `entries` in `domain`, timed.
pub async fn timed_check(rls: &mut Rls, domain: &str, entries: &[(&str, &str)]) -> Answer {
    timed(rls, request(domain, &[entries])).await
}

/// `count` requests for one descriptor, one after another, round-robin over `clients`.
pub async fn round_robin(
    clients: &mut [Rls],
    domain: &str,
    entries: &[(&str, &str)],
    count: usize,
) -> Vec<Result<Code, tonic::Code>> {
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let n = clients.len();
        out.push(
            timed_check(&mut clients[i % n], domain, entries)
                .await
                .result,
        );
    }
    out
}

/// `count` requests for one descriptor, one after another, through `rls`.
pub async fn in_sequence(
    rls: &mut Rls,
    domain: &str,
    entries: &[(&str, &str)],
    count: usize,
) -> Vec<Result<Code, tonic::Code>> {
    round_robin(std::slice::from_mut(rls), domain, entries, count).await
}

/// `limit` admissions followed by `extra` denials.
pub fn exactly(limit: usize, extra: usize) -> Vec<Result<Code, tonic::Code>> {
    let mut want = vec![Ok(Code::Ok); limit];
    want.extend(vec![Ok(Code::OverLimit); extra]);
    want
}

/// Polls, with a fresh descriptor `(key, value(round))` each round (rounds count from
/// 1), until `limit + 2` requests round-robin over `clients` give exactly `limit` OK and
/// then OVER_LIMIT: limiting that is exact across instances, which only a working shared
/// store gives. Returns how long it took and the rounds; panics after `timeout`.
pub async fn await_exact_limiting(
    clients: &mut [Rls],
    domain: &str,
    key: &str,
    limit: usize,
    timeout: Duration,
    mut value: impl FnMut(usize) -> String,
) -> (Duration, usize) {
    let what = format!(
        "exact limiting of `{key}` across {} instances",
        clients.len()
    );
    let mut round = 0;
    let want = exactly(limit, 2);
    let (rounds, took) = wait::until_async(&what, timeout, async || {
        round += 1;
        let value = value(round);
        let got = round_robin(clients, domain, &[(key, &value)], limit + 2).await;
        if got == want {
            Ok(round)
        } else {
            Err(format!("round {round} ({key}={value}): {got:?}"))
        }
    })
    .await;
    (took, rounds)
}

/// `n` requests released at the same instant (each from its own task, on clones of the
/// clients round-robin), with every answer.
pub async fn burst(clients: &[Rls], n: usize, req: &RateLimitRequest) -> Vec<Answer> {
    let start = Arc::new(tokio::sync::Barrier::new(n));
    let mut tasks = JoinSet::new();
    for i in 0..n {
        let mut rls = clients[i % clients.len()].clone();
        let (req, start) = (req.clone(), start.clone());
        tasks.spawn(async move {
            start.wait().await;
            timed(&mut rls, req).await
        });
    }
    tasks.join_all().await
}

/// Requests at a steady pace in the background, one task per request (so that a hung
/// call cannot hold back the next), round-robin over clients and over `values` of `key`.
/// Every answer is kept.
pub struct Load {
    stop: Arc<AtomicBool>,
    answers: Arc<Mutex<Vec<Answer>>>,
    driver: JoinHandle<()>,
}

/// Answers [`Load::start`] waits for before it returns: the load is running.
const FIRST_ANSWERS: usize = 50;
/// How long the first answers may take.
const FIRST_ANSWERS_TIMEOUT: Duration = Duration::from_secs(30);

impl Load {
    /// Starts the load and returns once its first answers are in.
    pub async fn start(
        clients: &[Rls],
        domain: &str,
        key: &str,
        values: Vec<String>,
        period: Duration,
    ) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let answers = Arc::new(Mutex::new(Vec::new()));
        let clients = clients.to_vec();
        let (domain, key) = (domain.to_owned(), key.to_owned());
        let driver = {
            let (stop, answers) = (stop.clone(), answers.clone());
            tokio::spawn(async move {
                let mut ticker = tokio::time::interval(period);
                ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let mut tasks = JoinSet::new();
                let mut i = 0;
                while !stop.load(Ordering::Relaxed) {
                    ticker.tick().await;
                    let mut rls = clients[i % clients.len()].clone();
                    let req = request(&domain, &[&[(&key, &values[i % values.len()])]]);
                    let answers = answers.clone();
                    tasks.spawn(async move {
                        let answer = timed(&mut rls, req).await;
                        lock(&answers).push(answer);
                    });
                    i += 1;
                    while tasks.try_join_next().is_some() {}
                }
                while tasks.join_next().await.is_some() {}
            })
        };
        let load = Self {
            stop,
            answers,
            driver,
        };
        load.await_answers_since(SystemTime::UNIX_EPOCH, FIRST_ANSWERS, FIRST_ANSWERS_TIMEOUT)
            .await;
        load
    }

    /// [`Load::start`] on one counter (`key=one`) at `per_second` requests a second: a
    /// limit reached under steady load.
    pub async fn on_one_counter(clients: &[Rls], domain: &str, key: &str, per_second: u32) -> Self {
        let period = Duration::from_secs(1) / per_second.max(1);
        Self::start(clients, domain, key, vec!["one".to_owned()], period).await
    }

    /// Waits until at least `n` requests sent at or after `since` have been answered.
    pub async fn await_answers_since(&self, since: SystemTime, n: usize, timeout: Duration) {
        let what = format!("{n} answers of the background load");
        wait::until_async(&what, timeout, async || {
            let got = lock(&self.answers)
                .iter()
                .filter(|a| a.sent >= since)
                .count();
            if got >= n {
                Ok(())
            } else {
                Err(format!("{got} answers"))
            }
        })
        .await;
    }

    /// Stops sending, waits for every outstanding answer, and returns all answers in the
    /// order they were sent.
    pub async fn finish(self) -> Vec<Answer> {
        self.stop.store(true, Ordering::Relaxed);
        self.driver.await.expect("the load driver task");
        let mut answers = std::mem::take(&mut *lock(&self.answers));
        answers.sort_by_key(|a| a.sent);
        answers
    }
}

fn lock(answers: &Mutex<Vec<Answer>>) -> std::sync::MutexGuard<'_, Vec<Answer>> {
    // A task that panicked while pushing left a complete vector behind.
    answers
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Closed-loop load, as the benchmark drives it: each of `callers` (a client and a
/// source of requests) sends its next request as soon as the previous one is answered,
/// until `end`. Only requests that start at or after `measure_from` and are answered by
/// `end` are returned; one still in flight at `end` is abandoned.
pub async fn closed_loop<C: Call, F>(
    callers: Vec<(C, F)>,
    measure_from: tokio::time::Instant,
    end: tokio::time::Instant,
) -> Vec<Answer>
where
    F: FnMut() -> RateLimitRequest + Send + 'static,
{
    let mut tasks = JoinSet::new();
    for (mut rls, mut next) in callers {
        tasks.spawn(async move {
            let mut answers = Vec::new();
            while tokio::time::Instant::now() < end {
                let started = tokio::time::Instant::now();
                let Ok(answer) = tokio::time::timeout_at(end, timed(&mut rls, next())).await else {
                    break;
                };
                if started >= measure_from {
                    answers.push(answer);
                }
            }
            answers
        });
    }
    tasks.join_all().await.into_iter().flatten().collect()
}

/// Open-loop load, as a latency benchmark needs: requests at a fixed `rate` per second
/// from `next`, round-robin over `clients`, whatever the answers take, so that a slow
/// server shows as queueing instead of as a slower client. Each answer's `took` counts
/// from when its request was due, not from when it could be sent. Only requests due at
/// or after `measure_from` and answered by `end` are returned.
pub async fn open_loop<C: Call + Clone, F>(
    clients: Vec<C>,
    mut next: F,
    rate: u32,
    measure_from: tokio::time::Instant,
    end: tokio::time::Instant,
) -> Vec<Answer>
where
    F: FnMut() -> RateLimitRequest,
{
    let period = Duration::from_secs(1) / rate.max(1);
    let mut ticker = tokio::time::interval(period);
    // Late ticks fire at once: the schedule, not the server, sets the pace.
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut tasks = JoinSet::new();
    let mut answers = Vec::new();
    let mut i = 0;
    loop {
        let due = ticker.tick().await;
        if due >= end {
            break;
        }
        let mut rls = clients[i % clients.len()].clone();
        i += 1;
        let req = next();
        tasks.spawn(async move {
            let lag = tokio::time::Instant::now().saturating_duration_since(due);
            let answer = tokio::time::timeout_at(end, timed(&mut rls, req))
                .await
                .ok()?;
            let answer = Answer {
                took: answer.took + lag,
                ..answer
            };
            (due >= measure_from).then_some(answer)
        });
        while let Some(done) = tasks.try_join_next() {
            answers.extend(done.ok().flatten());
        }
    }
    answers.extend(tasks.join_all().await.into_iter().flatten());
    answers
}

/// Answers sent in `[from, to)`.
pub fn sent_between(answers: &[Answer], from: SystemTime, to: SystemTime) -> Vec<&Answer> {
    answers
        .iter()
        .filter(|a| a.sent >= from && a.sent < to)
        .collect()
}

/// How many answers had each result.
pub fn tally<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for a in answers {
        *counts.entry(format!("{:?}", a.result)).or_insert(0) += 1;
    }
    counts
}

/// Asserts that at most `limit` of `answers` were admitted, and at least 90 % of it (the
/// limit is used, not starved by the store's trouble).
pub fn assert_admitted_within(answers: &[Answer], limit: usize) {
    let counts = tally(answers);
    let ok = answers.iter().filter(|a| a.result == Ok(Code::Ok)).count();
    assert!(
        ok <= limit,
        "{ok} admitted past a limit of {limit}: {counts:?}"
    );
    assert!(ok * 10 >= limit * 9, "the limit is used: {counts:?}");
}

/// The nearest-rank `p` percentile (0 < p ≤ 1) of sorted samples; the default if empty.
pub fn percentile<T: Copy + Default>(sorted: &[T], p: f64) -> T {
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted
        .get(rank.saturating_sub(1))
        .copied()
        .unwrap_or_default()
}

/// The latencies of `answers`, sorted.
pub fn latencies<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> Vec<Duration> {
    let mut took: Vec<Duration> = answers.into_iter().map(|a| a.took).collect();
    took.sort_unstable();
    took
}

/// Asserts that the `p` percentile of the answers' latencies is within `bound`; a few
/// slow calls on a loaded machine are tolerated, a slow store path is not. None may have
/// hung.
pub fn assert_latency(answers: &[Answer], p: f64, bound: Duration, what: &str) {
    let took = latencies(answers);
    let at_p = percentile(&took, p);
    let hung = answers
        .iter()
        .filter(|a| a.result == Err(tonic::Code::DeadlineExceeded))
        .count();
    assert_eq!(hung, 0, "{what}: {hung} of {} calls hung", answers.len());
    assert!(
        at_p <= bound,
        "{what}: p{:.0} latency {at_p:?} > {bound:?} over {} calls (p50 {:?}, max {:?})",
        p * 100.0,
        answers.len(),
        percentile(&took, 0.5),
        took.last().copied().unwrap_or_default()
    );
}

/// Asserts that every answer is `want`; otherwise names the tally and a few others.
pub fn assert_all<'a>(
    answers: impl IntoIterator<Item = &'a Answer>,
    want: Result<Code, tonic::Code>,
    what: &str,
) {
    let answers: Vec<&Answer> = answers.into_iter().collect();
    let wrong: Vec<&&Answer> = answers.iter().filter(|a| a.result != want).collect();
    assert!(
        wrong.is_empty(),
        "{what}: want {want:?} for all {} answers; got {:?}, e.g. {:?}",
        answers.len(),
        tally(answers.iter().copied()),
        &wrong[..wrong.len().min(5)]
    );
}
