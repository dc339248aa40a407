//! The execution journal (see [`crate::store::execution`]) in Redis: a
//! hash per run, `chatgate:calls:RUN`, one field per call
//! (`CONFIRMATION_ID:KEY`), its latest entry. Written by one fenced
//! script (only the session's owner under its epoch, while the run's
//! record is there), living as long as the record; the run's end (or its
//! removal) drops it.

use std::sync::LazyLock;

use redis::Script;

use super::keys::run_key;
use super::RedisStore;
use crate::session::SessionKey;
use crate::store::{CallEntry, Fault, StoreError};

/// `chatgate:calls:RUN`.
pub(super) fn calls_key(run: &str) -> String {
    format!("chatgate:calls:{run}")
}

/// KEYS: run, session, calls. ARGV: instance, epoch, field, entry (JSON).
static KEEP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('HGET', KEYS[2], 'instance') ~= ARGV[1]
   or redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[2] then return 'not_owner' end
if redis.call('EXISTS', KEYS[1]) == 0 then return 'gone' end
redis.call('HSET', KEYS[3], ARGV[3], ARGV[4])
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then redis.call('PEXPIRE', KEYS[3], ttl) else redis.call('PERSIST', KEYS[3]) end
return 'ok'
",
    )
});

impl RedisStore {
    pub(super) async fn keep_call(
        &self,
        run: &str,
        key: &SessionKey,
        entry: &CallEntry,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(entry).unwrap_or_default();
        let field = format!("{}:{}", entry.confirmation_id, entry.key);
        let epoch = self.epoch(run);
        let answer: String = self
            .invoke(
                &KEEP,
                &[&run_key(run), &self.session_key(key), &calls_key(run)],
                &[&self.instance, &epoch, &field, &json],
            )
            .await?;
        match answer.as_str() {
            "ok" => Ok(()),
            "not_owner" => Err(self.refused(Fault::Moved, "another replica owns this run now")),
            _ => Err(self.refused(Fault::Lost, "the run's record is gone")),
        }
    }

    /// The journal of `run`'s pause `confirmation_id`, by task.
    pub(super) async fn calls_of(
        &self,
        run: &str,
        confirmation_id: &str,
    ) -> Result<Vec<CallEntry>, StoreError> {
        let mut connection = self.connection().await?;
        let fields: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(calls_key(run))
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        let prefix = format!("{confirmation_id}:");
        let mut entries: Vec<CallEntry> = fields
            .into_iter()
            .filter_map(|(field, json)| {
                let key = field.strip_prefix(&prefix)?;
                Some(serde_json::from_str(&json).unwrap_or_else(|err| {
                    log::warn!("run {run}: the journal entry of call {key} is unreadable ({err})");
                    // Its task is not known either: it stands for every
                    // task of the pause the journal does not name.
                    CallEntry::unreadable(confirmation_id, usize::MAX)
                }))
            })
            .collect();
        entries.sort_by_key(|entry| entry.index);
        Ok(entries)
    }
}
