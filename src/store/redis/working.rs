//! The index of runs at work with replicas (#44): `chatgate:working:
//! NAMESPACE`, a sorted set of run ids by when their decision was recorded.
//! A run at work lives in its owner's memory; when the owner dies, no
//! request may come for its session, so every replica's sweep (see
//! `run/expiry.rs`) looks here, and a run whose owner is gone is taken
//! over and goes on where its execution journal says.
//!
//! Written after the decision it follows, apart from the fenced scripts:
//! an entry is a hint. A missing one leaves the run to a request for its
//! session (as before the index); a stale one (a run that ended, paused
//! again or is gone) is dropped by the sweep that finds it.

use super::{run_key, RedisStore};
use crate::session::SessionKey;
use crate::store::StoreError;

/// `chatgate:working:NAMESPACE`.
fn working_key(namespace: Option<&str>) -> String {
    format!("chatgate:working:{}", namespace.unwrap_or("-"))
}

impl RedisStore {
    /// After a decision was recorded: `run` of `key` is at work.
    pub(super) async fn index_working(&self, run: &str, key: &SessionKey) {
        let Ok(mut connection) = self.connection().await else {
            return;
        };
        let namespace = self.replica.namespaces.name(key.owner);
        let done = redis::cmd("ZADD")
            .arg(working_key(namespace.as_deref()))
            .arg(crate::clock::now_ms())
            .arg(run)
            .query_async::<i64>(&mut connection)
            .await;
        if let Err(err) = done {
            log::debug!("the index of runs at work was not updated: {err}");
        }
    }

    /// The sessions of at most `limit` runs of `namespace` at work (their
    /// decision recorded, not ended, not paused again) since before
    /// `since_ms`, the longest unlooked-at first; each is looked at again
    /// a lease later at the earliest. An entry of a run that is not at
    /// work leaves the index.
    pub async fn working_runs(
        &self,
        namespace: Option<&str>,
        since_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let set = working_key(namespace);
        let mut connection = self.connection().await?;
        let failed = |err: redis::RedisError| self.failed(&err);
        let runs = self.due_in(&mut connection, &set, since_ms, limit).await?;
        let prefix = format!("chatgate:session:{}:", namespace.unwrap_or("-"));
        let mut sessions = Vec::new();
        for run in runs {
            let (session, decided, ended): (Option<String>, Option<String>, Option<String>) =
                redis::cmd("HMGET")
                    .arg(run_key(&run))
                    .arg("session")
                    .arg("decision_nonce")
                    .arg("ended")
                    .query_async(&mut connection)
                    .await
                    .map_err(failed)?;
            match (
                session.as_deref().and_then(|s| s.strip_prefix(&prefix)),
                decided,
                ended,
            ) {
                (Some(session_id), Some(_), None) => {
                    sessions.push(session_id.to_owned());
                    // Looked at now: to the back of the line, so that runs
                    // long at work on live owners never keep a dead
                    // owner's out of the next looks.
                    redis::cmd("ZADD")
                        .arg(&set)
                        .arg("XX")
                        .arg(crate::clock::now_ms())
                        .arg(&run)
                        .query_async::<i64>(&mut connection)
                        .await
                        .map_err(failed)?;
                }
                _ => self.unlist(&mut connection, &set, &run).await?,
            }
        }
        Ok(sessions)
    }
}
