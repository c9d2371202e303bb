//! The Lua script against the Rust algorithms on a real redis-server (see
//! [`crate::store::shared::differential`]).

use std::sync::OnceLock;

use proptest::prelude::*;
use tollgate_testkit::redis::RedisServer;

use super::script;
use crate::store::shared::differential::{fresh_key, limits, operation, replay};

/// One redis-server for every case of this test binary.
fn redis() -> &'static RedisServer {
    static REDIS: OnceLock<RedisServer> = OnceLock::new();
    REDIS.get_or_init(RedisServer::start)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_script_answers_as_the_algorithms_do(
        limits in limits(),
        history in prop::collection::vec(operation(), 1..40),
        phase_us in 0u64..86_400_000_000,
    ) {
        let mut conn = redis().connection_as(None);
        let script = script::script();
        let key = format!("differential{{{}}}", fresh_key());
        replay(&limits, &history, phase_us, |hits, now| {
            let mut invocation = script.key(&key);
            script::add_args(&mut invocation, &limits, hits, 0, now);
            invocation.invoke(&mut conn).map_err(|e| e.to_string())
        })?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A batch answers as its checks would, one call each, in order: two checks of one
    /// counter in a batch see each other as two calls would.
    #[test]
    fn a_batch_answers_as_its_checks_one_call_each(
        limits in limits(),
        checks in prop::collection::vec((0usize..3, operation()), 2..12),
        start_us in 1u64..86_400_000_000,
    ) {
        let mut conn = redis().connection_as(None);
        let script = script::script();
        let (batched, single) = (fresh_key(), fresh_key());
        let key = |base: u64, counter: usize| format!("batch{{{base}-{counter}}}");
        let fail = |e: redis::RedisError| TestCaseError::fail(e.to_string());
        let mut batch = script.prepare_invoke();
        batch.arg("b").arg(checks.len());
        let mut expected = Vec::new();
        let mut now_us = start_us;
        for (counter, (gap_us, hits)) in &checks {
            now_us += gap_us;
            let now_ns = now_us * 1_000;
            batch.key(key(batched, *counter));
            script::add_args(&mut batch, &limits, *hits, 0, now_ns);
            let mut one = script.key(key(single, *counter));
            script::add_args(&mut one, &limits, *hits, 0, now_ns);
            let reply: Vec<i64> = one.invoke(&mut conn).map_err(fail)?;
            expected.push(i64::try_from(reply.len()).expect("a short reply"));
            expected.extend(reply);
        }
        let replies: Vec<i64> = batch.invoke(&mut conn).map_err(fail)?;
        prop_assert_eq!(replies, expected);
    }
}
