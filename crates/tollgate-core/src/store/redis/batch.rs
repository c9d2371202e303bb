//! How Redis sends a group of coalesced calls ([`crate::store::shared::batch`]): one
//! script call per Cluster slot (a script touches one slot), at most four batches out.

use std::sync::Arc;

use redis::cluster_routing::Slot;

use super::classify::classify;
use super::connect::{Conn, RedisConnector};
use super::script::{self, Packed, Replies, ScriptReply};
use crate::store::shared::backend::TripError;
use crate::store::shared::batch::{Group, Sent};
use crate::store::shared::link::Link;

/// Batches out at once: a call that finds fewer out goes at once, so a batch is never
/// held up behind a slow one, while what arrives meanwhile still rides together.
pub(super) const MAX_OUT: usize = 4;

/// Script calls over the connection `link` holds, running `script`.
pub(super) struct ScriptCalls {
    pub(super) link: Arc<Link<RedisConnector>>,
    pub(super) script: Arc<redis::Script>,
}

impl Group for ScriptCalls {
    type Call = Packed;
    type Reply = ScriptReply;
    type Key = Slot;
    const STORE: &'static str = "Redis";

    fn grouping(&self) -> Option<fn(&Packed) -> Slot> {
        match self.link.conn().as_deref() {
            Some(Conn::Cluster(_)) => Some(|call| Slot::for_key(call.key())),
            _ => None,
        }
    }

    /// One EVALSHA for `calls`.
    fn send(&self, calls: Vec<Packed>) -> Sent<ScriptReply> {
        let Some(conn) = self.link.conn() else {
            return Box::pin(std::future::ready(Err(TripError::NotConnected)));
        };
        let mut conn: Conn = (*conn).clone();
        let cmd = script::batch(&self.script, calls.iter());
        let (script, link) = (self.script.clone(), self.link.clone());
        Box::pin(async move {
            conn.eval::<Replies>(&cmd, &script)
                .await
                .map(|Replies(replies)| replies)
                .map_err(|e| classify(&link, e))
        })
    }
}
