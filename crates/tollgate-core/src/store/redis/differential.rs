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
