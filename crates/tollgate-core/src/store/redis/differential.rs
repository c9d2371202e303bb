//! The Lua script against the Rust algorithms on a real redis-server (see
//! [`crate::store::shared::differential`]).

use std::sync::OnceLock;

use proptest::prelude::*;
use tollgate_testkit::redis::RedisServer;

use super::script::{self, Check, Replies};
use crate::clock::Timestamp;
use crate::limit::Limit;
use crate::store::shared::differential::{
    YEAR_US, a_hit_past_the_burst_is_refused, fresh_key, limits, operation, read_after_upgrade,
    replay, stored_before_ends,
};
use crate::store::shared::protocol::{Ask, RawReply};

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
        phase_us in 0u64..YEAR_US,
    ) {
        let mut conn = redis().connection_as(None);
        let script = script::script();
        script.load(&mut conn).map_err(|e| TestCaseError::fail(e.to_string()))?;
        let key = fresh_key().to_string();
        replay(&limits, &history, phase_us, |debt, ask, now, around| {
            let check = Check { key: &key, limits: &limits, ask, debt, deadline: None, now: Some(now), around };
            run(&mut conn, &script, &check)
        })?;
    }
}

/// A connection to the shared redis-server, and the script, loaded there.
fn loaded() -> (redis::Connection, redis::Script) {
    let mut conn = redis().connection_as(None);
    let script = script::script();
    let loaded = script.load(&mut conn);
    assert!(loaded.is_ok(), "{loaded:?}");
    (conn, script)
}

/// `ask` on counter `key` of `limits` at `now`, with no debt and no deadline.
fn call_at(
    conn: &mut redis::Connection,
    script: &redis::Script,
    (key, limits): (&str, &[Limit]),
    ask: Ask,
    now: Timestamp,
) -> Result<RawReply, String> {
    let check = Check {
        key,
        limits,
        ask,
        debt: 0,
        deadline: None,
        now: Some(now),
        around: now,
    };
    run(conn, script, &check)
}

/// `check` through `script`, its reply as numbers.
fn run(
    conn: &mut redis::Connection,
    script: &redis::Script,
    check: &Check<'_>,
) -> Result<RawReply, String> {
    let replies: Replies = script::call(script, "differential", check)
        .query(conn)
        .map_err(|e| e.to_string())?;
    let reply = script::only(replies).map_err(|e| e.to_string())?;
    script::raw(reply, &script::parts(check.limits)).map_err(|e| e.to_string())
}

/// Charges far past any limit (usage reported after the fact) leave a counter that still
/// denies: what the script stores stays below 2^53, where it reads back as written rather
/// than as a value it could not have written (an empty counter).
#[test]
fn huge_charges_still_deny() {
    use std::time::Duration;

    use crate::algo::Hits;
    use crate::limit::{Algorithm, Limit};
    use crate::unit::Unit;

    let (mut conn, script) = loaded();
    let day = Limit::new(1, Unit::Day);
    for algorithm in [
        Algorithm::SlidingWindow { precision: 10 },
        Algorithm::FixedWindow,
        Algorithm::TokenBucket { burst: 1 },
    ] {
        let limits = [day.clone().with_algorithm(algorithm).unwrap_or(day.clone())];
        let key = fresh_key().to_string();
        let now = Timestamp::from_micros(1_790_000_000_000_000);
        let mut flag = |hits, now| {
            let check = Check {
                key: &key,
                limits: &limits,
                ask: Ask::Hits(hits),
                debt: 0,
                deadline: None,
                now: Some(now),
                around: now,
            };
            let replies: Result<Replies, _> =
                script::call(&script, "differential", &check).query(&mut conn);
            let reply = replies.map_err(|e| e.to_string())?;
            script::only(reply)
                .map(|r| r.flag)
                .map_err(|e| e.to_string())
        };
        // Counted, though far over the limit.
        assert!(flag(Hits::Charge(1 << 50), now).is_ok(), "{algorithm:?}");
        assert_eq!(
            flag(Hits::Consume(1), now + Duration::from_millis(1)),
            Ok(0),
            "{algorithm:?}"
        );
    }
}

/// A bucket never admits a request of more units than its burst, as the algorithm
/// (see [`a_hit_past_the_burst_is_refused`]).
#[test]
fn a_hit_past_the_burst_is_never_admitted() {
    let (mut conn, script) = loaded();
    let refused = a_hit_past_the_burst_is_refused(|key, limits, hits, now| {
        call_at(&mut conn, &script, (key, limits), Ask::Hits(hits), now)
    });
    assert_eq!(refused, Ok(()));
}

/// A counter the script stored before it kept sub-windows' ends still counts after an
/// upgrade, as that script counted it (see [`read_after_upgrade`]).
#[test]
fn a_counter_stored_before_ends_were_kept_still_counts() {
    let (mut conn, script) = loaded();
    let at = Timestamp::from_micros(1_790_000_000_250_000);
    let (limits, state) = stored_before_ends(at);
    let key = fresh_key().to_string();
    let stored: redis::RedisResult<()> = redis::cmd("EVAL")
        .arg(
            "local v = {} for i, a in ipairs(ARGV) do v[i] = tonumber(a) end \
             redis.call('SET', KEYS[1], cmsgpack.pack(unpack(v)))",
        )
        .arg(1)
        .arg(script::previous_key("differential", &key))
        .arg(&state)
        .query(&mut conn);
    assert!(stored.is_ok(), "{stored:?}");
    let read = read_after_upgrade(at, |hits, now| {
        call_at(&mut conn, &script, (&key, &limits), Ask::Hits(hits), now)
    });
    assert_eq!(read, Ok(()));
}

/// A counter the previous layout stored (MessagePack, its ends kept) reads after an
/// upgrade as exactly the numbers it held: the script moves it to this layout unchanged.
#[test]
fn a_counter_of_the_previous_layout_keeps_its_numbers() {
    use crate::algo::Hits;
    use crate::limit::Algorithm;
    use crate::unit::Unit;

    let (mut conn, script) = loaded();
    // Per minute in three sub-windows of 20 s, and per hour in a fixed window.
    let minute = Limit::new(50, Unit::Minute);
    let limits = [
        minute
            .clone()
            .with_algorithm(Algorithm::SlidingWindow { precision: 3 })
            .unwrap_or(minute),
        Limit::new(500, Unit::Hour)
            .with_algorithm(Algorithm::FixedWindow)
            .unwrap_or(Limit::new(500, Unit::Hour)),
    ];
    let at = Timestamp::from_micros(1_790_000_000_250_000);
    let newest = at.as_micros() / 20_000_000;
    let hour = at.as_micros() / 3_600_000_000;
    // newest, four sub-windows by number modulo four, window, count, then the four ends.
    let mut numbers = vec![newest, 0, 0, 0, 0, hour, 17, 0, 0, 0, 0];
    for (age, (count, end)) in [(3u64, 40_000u64), (5, 65_535), (9, 12), (2, 3)]
        .into_iter()
        .enumerate()
    {
        let index = usize::try_from((newest - age as u64) % 4).unwrap_or(0);
        numbers[1 + index] = count * 256 + age as u64;
        numbers[7 + index] = end;
    }
    let key = fresh_key().to_string();
    let stored: redis::RedisResult<()> = redis::cmd("EVAL")
        .arg(
            "local v = {} for i, a in ipairs(ARGV) do v[i] = tonumber(a) end \
             redis.call('SET', KEYS[1], cmsgpack.pack(unpack(v)), 'PX', 60000)",
        )
        .arg(1)
        .arg(script::previous_key("differential", &key))
        .arg(&numbers)
        .query(&mut conn);
    assert!(stored.is_ok(), "{stored:?}");
    let read = call_at(
        &mut conn,
        &script,
        (&key, &limits),
        Ask::Hits(Hits::Check),
        at,
    );
    let expected: Vec<i64> = numbers.iter().map(|&n| n as i64).collect();
    assert_eq!(read.map(|r| r.state), Ok(expected));
}

/// A batch on Redis' own clock, as requests send it, answers each call by its outcome:
/// an admitted call its state alone, a denied one its flag and state, one run after its
/// deadline -1; all at the one instant Redis read.
#[test]
fn a_batch_on_redis_clock_answers_each_call_by_its_outcome() {
    use std::time::{SystemTime, UNIX_EPOCH};

    use crate::algo::Hits;
    use crate::unit::Unit;

    let (mut conn, script) = loaded();
    let key = fresh_key().to_string();
    let limits = [Limit::new(1, Unit::Hour)];
    let since_epoch = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    let around = Timestamp::from_micros(u64::try_from(since_epoch.as_micros()).unwrap_or(0));
    let call = |deadline| {
        let check = Check {
            key: &key,
            limits: &limits,
            ask: Ask::Hits(Hits::Consume(1)),
            debt: 0,
            deadline,
            now: None,
            around,
        };
        script::pack("differential", &check)
    };
    let calls = [
        call(None),
        call(None),
        call(Some(Timestamp::from_micros(1))),
    ];
    let replies: Result<Replies, _> = script::batch(&script, calls.iter()).query(&mut conn);
    let replies = replies.map(|Replies(replies)| replies);
    let Ok([admitted, denied, late]) = replies.as_deref() else {
        panic!("three replies: {replies:?}");
    };
    let flags = [admitted.flag, denied.flag, late.flag];
    assert_eq!(flags, [1, 0, -1]);
    assert!(admitted.state.is_empty(), "a new counter: {admitted:?}");
    let parts = script::parts(&limits);
    let counted = script::raw(denied.clone(), &parts).map(|raw| raw.state);
    assert!(
        counted.is_ok_and(|numbers| !numbers.is_empty()),
        "{denied:?}"
    );
    assert!(late.state.is_empty(), "{late:?}");
    let nows = [admitted.now_us, denied.now_us, late.now_us];
    assert_eq!(nows, [admitted.now_us; 3], "one instant for the batch");
    let off = u64::try_from(admitted.now_us).map(|us| us.abs_diff(around.as_micros()));
    assert!(
        off.is_ok_and(|us| us < 60_000_000),
        "Redis' clock: {nows:?}"
    );
}
