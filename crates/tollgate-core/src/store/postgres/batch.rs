//! How PostgreSQL sends a group of coalesced calls ([`crate::store::shared::batch`]): one
//! `tollgate_apply_many` statement, on the pool's next connection. Each call stays exact
//! and atomic on its row; the statement's transaction holds every row it locked until it
//! ends, so a batch is one commit instead of one per call.

use std::sync::Arc;

use tokio_postgres::Row;

use super::apply::{ApplyArgs, ManyArgs};
use super::classify::classify;
use super::connect::PgConnector;
use crate::store::shared::backend::TripError;
use crate::store::shared::batch::{Group, Sent};
use crate::store::shared::link::Link;

/// `tollgate_apply_many` statements over the pool `link` holds.
pub(super) struct Statements {
    pub(super) link: Arc<Link<PgConnector>>,
}

impl Group for Statements {
    type Call = ApplyArgs;
    /// The numbers `tollgate_apply` returned.
    type Reply = Vec<i64>;
    type Key = ();
    const STORE: &'static str = "PostgreSQL";

    /// One statement carries any counters: the function orders their row locks.
    fn grouping(&self) -> Option<fn(&ApplyArgs)> {
        None
    }

    fn send(&self, calls: Vec<ApplyArgs>) -> Sent<Vec<i64>> {
        let Some(pool) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let count = calls.len();
        let many = ManyArgs::new(calls);
        let link = self.link.clone();
        Box::pin(async move {
            let conn = pool.pick();
            let rows = many
                .run(&conn.client, &conn.check_many, 0)
                .await
                .map_err(|e| classify(&link, e))?;
            in_call_order(rows, count).map_err(|e| TripError::Failed(Arc::new(e)))
        })
    }
}

/// Why a statement's rows are not one reply per call.
#[derive(Debug, thiserror::Error)]
pub(super) enum BadRows {
    /// A row is not a call's number and reply.
    #[error("a row of tollgate_apply_many: {0}")]
    Row(#[from] tokio_postgres::Error),
    /// A call numbered outside the batch, twice, or not at all.
    #[error("tollgate_apply_many did not reply to each of its {0} calls once")]
    Calls(usize),
}

/// The replies of `rows` (one per call, in any order) in the order of the `count` calls.
pub(super) fn in_call_order(rows: Vec<Row>, count: usize) -> Result<Vec<Vec<i64>>, BadRows> {
    let mut replies: Vec<Option<Vec<i64>>> = vec![None; count];
    for row in rows {
        let call: i32 = row.try_get(0)?;
        let slot = usize::try_from(call)
            .ok()
            .and_then(|call| call.checked_sub(1))
            .and_then(|i| replies.get_mut(i))
            .filter(|slot| slot.is_none())
            .ok_or(BadRows::Calls(count))?;
        *slot = Some(row.try_get(1)?);
    }
    replies
        .into_iter()
        .collect::<Option<Vec<_>>>()
        .ok_or(BadRows::Calls(count))
}
