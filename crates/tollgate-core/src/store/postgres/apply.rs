//! The arguments of one `tollgate_apply`: a call's ask, debt and deadline, and its
//! limits as the function's arrays, owned so that the call can outlive its request; and
//! of one `tollgate_apply_many`, many calls' arguments side by side.

use tokio_postgres::{Client, Row, Statement};

use crate::clock::Timestamp;
use crate::limit::Limit;
use crate::store::shared::backend::CallArgs;
use crate::store::shared::protocol::{limit_args, mode, units};

/// The arguments of one `tollgate_apply`, owned, so that a call can outlive its request.
pub(super) struct ApplyArgs {
    key: String,
    mode: &'static str,
    units: i64,
    extra: i64,
    debt: i64,
    deadline_us: i64,
    kinds: String,
    windows: Vec<i64>,
    params: Vec<i64>,
    rpus: Vec<i64>,
    bounds: Vec<i64>,
}

impl ApplyArgs {
    /// The call of `args` on its counter's row (its key after `prefix`); nothing changes
    /// if the database runs it after the deadline, if there is one.
    pub(super) fn new(prefix: &str, args: &CallArgs<'_>) -> Self {
        let (mode, n, extra) = mode(args.ask);
        let LimitArrays {
            kinds,
            windows,
            params,
            rpus,
            bounds,
        } = limit_arrays(args.limits, args.around);
        let (debt, deadline) = (args.debt, args.deadline);
        Self {
            key: format!("{prefix}{}", args.key),
            mode,
            units: signed(n),
            extra: signed(extra),
            debt: signed(units(debt)),
            // The function's zero is "none": it never runs at the epoch.
            deadline_us: signed(deadline.map_or(0, Timestamp::as_micros)),
            kinds,
            windows,
            params,
            rpus,
            bounds,
        }
    }

    /// The call through `client`'s prepared `check` statement: its one row.
    pub(super) async fn run(
        &self,
        client: &Client,
        check: &Statement,
    ) -> Result<Row, tokio_postgres::Error> {
        client
            .query_one(
                check,
                &[
                    &self.key,
                    &self.mode,
                    &self.units,
                    &self.debt,
                    &self.deadline_us,
                    &self.kinds,
                    &self.windows,
                    &self.params,
                    &self.rpus,
                    &self.bounds,
                    &self.extra,
                ],
            )
            .await
    }
}

/// The arguments of one `tollgate_apply_many`: each call's numbers at its index, its
/// limits' numbers after the previous call's.
pub(super) struct ManyArgs {
    keys: Vec<String>,
    modes: Vec<&'static str>,
    units: Vec<i64>,
    debts: Vec<i64>,
    deadlines_us: Vec<i64>,
    kinds: Vec<String>,
    windows: Vec<i64>,
    params: Vec<i64>,
    rpus: Vec<i64>,
    bounds: Vec<i64>,
    extras: Vec<i64>,
}

impl ManyArgs {
    /// The calls of `calls`, in their order.
    pub(super) fn new(calls: Vec<ApplyArgs>) -> Self {
        let n = calls.len();
        let limits: usize = calls.iter().map(|call| call.windows.len()).sum();
        let mut many = Self {
            keys: Vec::with_capacity(n),
            modes: Vec::with_capacity(n),
            units: Vec::with_capacity(n),
            debts: Vec::with_capacity(n),
            deadlines_us: Vec::with_capacity(n),
            kinds: Vec::with_capacity(n),
            windows: Vec::with_capacity(limits),
            params: Vec::with_capacity(limits),
            rpus: Vec::with_capacity(limits),
            bounds: Vec::with_capacity(3 * limits),
            extras: Vec::with_capacity(n),
        };
        for call in calls {
            many.keys.push(call.key);
            many.modes.push(call.mode);
            many.units.push(call.units);
            many.debts.push(call.debt);
            many.deadlines_us.push(call.deadline_us);
            many.kinds.push(call.kinds);
            many.windows.extend(call.windows);
            many.params.extend(call.params);
            many.rpus.extend(call.rpus);
            many.bounds.extend(call.bounds);
            many.extras.push(call.extra);
        }
        many
    }

    /// The calls through `client`'s prepared `check_many` statement, at `now_us` (0: the
    /// database's clock): one row per call, its number from 1 and its reply.
    pub(super) async fn run(
        &self,
        client: &Client,
        check_many: &Statement,
        now_us: i64,
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        client
            .query(
                check_many,
                &[
                    &self.keys,
                    &self.modes,
                    &self.units,
                    &self.debts,
                    &self.deadlines_us,
                    &now_us,
                    &self.kinds,
                    &self.windows,
                    &self.params,
                    &self.rpus,
                    &self.bounds,
                    &self.extras,
                ],
            )
            .await
    }
}

pub(super) fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The limits as the function's arrays (see `limit_args`): kind letters, windows,
/// params, limits, and three calendar boundaries per limit.
pub(super) struct LimitArrays {
    pub(super) kinds: String,
    pub(super) windows: Vec<i64>,
    pub(super) params: Vec<i64>,
    pub(super) rpus: Vec<i64>,
    pub(super) bounds: Vec<i64>,
}

/// The limits as the function's arrays: kind letters, windows, params, limits, and three
/// calendar boundaries per limit, placed around the store time `around`.
pub(super) fn limit_arrays(limits: &[Limit], around: Timestamp) -> LimitArrays {
    let mut kinds = String::with_capacity(limits.len());
    let mut windows = Vec::with_capacity(limits.len());
    let mut params = Vec::with_capacity(limits.len());
    let mut rpus = Vec::with_capacity(limits.len());
    let mut bounds = Vec::with_capacity(3 * limits.len());
    for limit in limits {
        let (kind, window_us, param, rpu, bounds_us) = limit_args(limit, around);
        kinds.push_str(kind);
        windows.push(signed(window_us));
        params.push(i64::from(param));
        rpus.push(i64::from(rpu));
        bounds.extend(bounds_us.map(signed));
    }
    LimitArrays {
        kinds,
        windows,
        params,
        rpus,
        bounds,
    }
}
