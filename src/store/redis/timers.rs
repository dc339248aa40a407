//! The index of due timers with replicas: `chatgate:timers:NAMESPACE`, a
//! sorted set of run ids by when their pause's next timer (a reminder, an
//! escalation) is due. A pause's owner fires its own timers; this index
//! lets any replica find one whose owner died (see `run/expiry.rs`), take
//! the run over and fire what came due, so that on-call is paged when
//! nobody touches the session.
//!
//! Written after the step it follows (a save, a timer's step), apart from
//! the fenced scripts: an entry is a hint. A missing one leaves the timer
//! to its owner (as before the index); a stale one (a pause decided or
//! ended, a timer already fired) is dropped by the sweep that finds it.

use super::{run_key, RedisStore};
use crate::session::SessionKey;
use crate::store::{PauseProgress, StoreError};

/// `chatgate:timers:NAMESPACE`.
fn timers_key(namespace: Option<&str>) -> String {
    format!("chatgate:timers:{}", namespace.unwrap_or("-"))
}

impl RedisStore {
    /// Indexes `run`'s next timer at `due_ms`, or takes it out (`None`).
    pub(super) async fn index_timer(
        &self,
        namespace: Option<&str>,
        run: &str,
        due_ms: Option<u64>,
    ) {
        let Ok(mut connection) = self.connection().await else {
            return;
        };
        let set = timers_key(namespace);
        let done = match due_ms {
            Some(due) => {
                redis::cmd("ZADD")
                    .arg(&set)
                    .arg(due)
                    .arg(run)
                    .query_async::<i64>(&mut connection)
                    .await
            }
            None => {
                redis::cmd("ZREM")
                    .arg(&set)
                    .arg(run)
                    .query_async::<i64>(&mut connection)
                    .await
            }
        };
        if let Err(err) = done {
            log::debug!("the index of due timers was not updated: {err}");
        }
    }

    /// After a pause was saved: its first timer indexed, if it has one.
    pub(super) async fn timer_saved(&self, record: &crate::store::PausedRecord) {
        if let Some(due) = record.timer_due_ms {
            let namespace = record.namespace.as_deref();
            self.index_timer(namespace, &record.run, Some(due)).await;
        }
    }

    /// After a timer's `step` for `key`'s run `run`: its next timer indexed.
    pub(super) async fn timer_fired(&self, run: &str, key: &SessionKey, step: &PauseProgress) {
        let namespace = self.replica.namespaces.name(key.owner);
        self.index_timer(namespace.as_deref(), run, step.next_timer_ms)
            .await;
    }

    /// The sessions of at most `limit` runs of `namespace` whose pause has
    /// a timer due at `now_ms` and still waits (listed in the inbox); an
    /// entry whose pause was decided, ended or is gone leaves the index.
    pub async fn due_timers(
        &self,
        namespace: Option<&str>,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<String>, StoreError> {
        let set = timers_key(namespace);
        let mut connection = self.connection().await?;
        let failed = |err: redis::RedisError| self.failed(&err);
        let runs = self.due_in(&mut connection, &set, now_ms, limit).await?;
        let prefix = format!("chatgate:session:{}:", namespace.unwrap_or("-"));
        let mut sessions = Vec::new();
        for run in runs {
            let (session, pending): (Option<String>, Option<String>) = redis::cmd("HMGET")
                .arg(run_key(&run))
                .arg("session")
                .arg("pending")
                .query_async(&mut connection)
                .await
                .map_err(failed)?;
            match (
                session.as_deref().and_then(|s| s.strip_prefix(&prefix)),
                pending,
            ) {
                (Some(session_id), Some(_)) => sessions.push(session_id.to_owned()),
                _ => self.unlist(&mut connection, &set, &run).await?,
            }
        }
        Ok(sessions)
    }
}
