//! A pause that is not its run's record, listed where every replica finds
//! it (#44): a reconcile pause, asked while the run's record keeps its
//! decided plan. It is a record of its own, `chatgate:run:RUN.aside`, with
//! the run's session, in the namespace's pending set and `conf:ID` as a
//! stored pause is, so that any replica lists it in the inbox and locates
//! it for a link or a Slack button (and passes the decision to the run's
//! owner); the session's `run` stays the run. Written and dropped only by
//! the session's owner under its epoch; it lives until the pause's expiry
//! (plus the linger) at most, and goes with the run's end or removal.

use std::sync::LazyLock;

use redis::Script;

use super::keys::{pending_key, run_key};
use super::scripts::UNLIST;
use super::RedisStore;
use crate::session::SessionKey;
use crate::store::{Fault, PausedRecord, StoreError};

/// The id of `run`'s aside pause record.
pub(super) fn aside_of(run: &str) -> String {
    format!("{run}{ASIDE}")
}

/// What an aside record's id ends with (`END` and `REMOVE` drop
/// `chatgate:run:RUN` followed by it).
pub(super) const ASIDE: &str = ".aside";

/// KEYS: aside run, session, pending set. ARGV: record (JSON), ttl ms,
/// instance, epoch, score (its expiry, ms), confirmation id, aside id.
static LIST: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{UNLIST}{}",
        r"
if redis.call('HGET', KEYS[2], 'instance') ~= ARGV[3]
   or redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[4] then return 0 end
unlist(KEYS[1])
redis.call('DEL', KEYS[1])
local member = ARGV[6] .. '|' .. ARGV[7]
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'session', KEYS[2],
  'pending', KEYS[3] .. ' ' .. member .. ' ' .. ARGV[6])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[5], member)
redis.call('SET', 'chatgate:conf:' .. ARGV[6], KEYS[3] .. ' ' .. ARGV[5] .. ' ' .. member, 'PX', ARGV[2])
return 1
"
    ))
});

/// KEYS: aside run, session. ARGV: instance, epoch.
static DROP: LazyLock<Script> = LazyLock::new(|| {
    Script::new(&format!(
        "{UNLIST}{}",
        r"
if redis.call('HGET', KEYS[2], 'instance') ~= ARGV[1]
   or redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[2] then return 0 end
unlist(KEYS[1])
redis.call('DEL', KEYS[1])
return 1
"
    ))
});

impl RedisStore {
    /// Lists `record` (its `run` the run's, its id [`aside_of`] it).
    pub(super) async fn list_aside_record(
        &self,
        record: &PausedRecord,
        key: &SessionKey,
    ) -> Result<(), StoreError> {
        let aside = aside_of(&record.run);
        let mut record = record.clone();
        record.run = aside.clone();
        let now_ms = crate::clock::now_ms();
        let ttl =
            record.expires_at_ms.saturating_sub(now_ms) + self.replica.linger.as_millis() as u64;
        let packed = self.encode(&record);
        let epoch = self.epoch(run_of(&aside));
        let pending = pending_key(record.namespace.as_deref());
        let (ttl, expiry) = (ttl.to_string(), record.expires_at_ms.to_string());
        let listed: i64 = self
            .invoke_raw(
                &LIST,
                &[&run_key(&aside), &self.session_key(key), &pending],
                &[
                    &packed,
                    ttl.as_bytes(),
                    self.instance.as_bytes(),
                    epoch.as_bytes(),
                    expiry.as_bytes(),
                    record.confirmation_id.as_bytes(),
                    aside.as_bytes(),
                ],
            )
            .await?;
        match listed {
            1 => Ok(()),
            _ => Err(self.refused(Fault::Moved, "another replica owns this session now")),
        }
    }

    /// Drops `run`'s aside pause record, if it has one.
    pub(super) async fn drop_aside(&self, run: &str, key: &SessionKey) -> Result<(), StoreError> {
        let epoch = self.epoch(run);
        let _: i64 = self
            .invoke(
                &DROP,
                &[&run_key(&aside_of(run)), &self.session_key(key)],
                &[&self.instance, &epoch],
            )
            .await?;
        Ok(())
    }
}

/// The run whose aside record `aside` is.
pub(super) fn run_of(aside: &str) -> &str {
    aside.strip_suffix(ASIDE).unwrap_or(aside)
}
