//! A pause's progress in Redis (see [`PauseProgress`]): each step in its
//! own field of the run's hash (`approvals`, `reminded`, `escalated`), so
//! that steps never overwrite each other, written by one fenced script:
//! only the session's owner under its epoch, and only while the pause
//! waits (no decision recorded). [`RedisStore::get`] joins them to the
//! record.

use std::sync::LazyLock;

use redis::Script;

use super::keys::run_key;
use super::RedisStore;
use crate::session::SessionKey;
use crate::store::{Fault, PauseProgress, StoreError};

/// KEYS: run, session. ARGV: instance, epoch, field, step (JSON).
static RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('HGET', KEYS[2], 'instance') ~= ARGV[1]
   or redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[2] then return 'not_owner' end
if redis.call('EXISTS', KEYS[1]) == 0 then return 'gone' end
if redis.call('HEXISTS', KEYS[1], 'decision_nonce') == 1 then return 'decided' end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
return 'ok'
",
    )
});

impl RedisStore {
    pub(super) async fn record_step(
        &self,
        run: &str,
        key: &SessionKey,
        step: &PauseProgress,
    ) -> Result<(), StoreError> {
        let json = serde_json::to_string(step).unwrap_or_default();
        let epoch = self.epoch(run);
        let answer: String = self
            .invoke(
                &RECORD,
                &[&run_key(run), &self.session_key(key)],
                &[&self.instance, &epoch, step.step().field(), &json],
            )
            .await?;
        match answer.as_str() {
            "ok" => Ok(()),
            "not_owner" => Err(self.refused(Fault::Moved, "another replica owns this run now")),
            "decided" => Err(self.refused(Fault::Moved, "this pause was decided meanwhile")),
            _ => Err(self.refused(Fault::Lost, "the run's record is gone")),
        }
    }
}
