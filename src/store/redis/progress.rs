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
use crate::store::progress::Step;
use crate::store::{Fault, PauseProgress, StoreError};

/// KEYS: run, session. ARGV: instance, epoch, field, step (JSON), and
/// for a step that moved the pause's expiry (an escalation's `extends`):
/// the new expiry (ms) and the records' new time to live (ms), else ''.
/// A moved expiry keeps the records (and the pause's listing and its
/// `conf:` key) alive for as long as the pause now waits.
static RECORD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r"
if redis.call('HGET', KEYS[2], 'instance') ~= ARGV[1]
   or redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[2] then return 'not_owner' end
if redis.call('EXISTS', KEYS[1]) == 0 then return 'gone' end
if redis.call('HEXISTS', KEYS[1], 'decision_nonce') == 1 then return 'decided' end
redis.call('HSET', KEYS[1], ARGV[3], ARGV[4])
if ARGV[5] ~= '' then
  local ttl = tonumber(ARGV[6])
  if redis.call('PTTL', KEYS[1]) < ttl then redis.call('PEXPIRE', KEYS[1], ttl) end
  if redis.call('PTTL', KEYS[2]) < ttl then redis.call('PEXPIRE', KEYS[2], ttl) end
  local listed = redis.call('HGET', KEYS[1], 'pending')
  if listed then
    local set, member, id = string.match(listed, '^(%S+) (%S+) (%S+)$')
    if set then
      redis.call('ZADD', set, 'XX', ARGV[5], member)
      redis.call('SET', 'chatgate:conf:' .. id, set .. ' ' .. ARGV[5] .. ' ' .. member, 'PX', ttl)
    end
  end
end
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
        let (expiry, ttl) = match step.expires_at_ms {
            Some(at) => {
                let left = at.saturating_sub(crate::clock::now_ms());
                let ttl = left + self.replica.linger.as_millis() as u64;
                (at.to_string(), ttl.to_string())
            }
            None => (String::new(), String::new()),
        };
        let answer: String = self
            .invoke(
                &RECORD,
                &[&run_key(run), &self.session_key(key)],
                &[
                    &self.instance,
                    &epoch,
                    step.step().field(),
                    &json,
                    &expiry,
                    &ttl,
                ],
            )
            .await?;
        match answer.as_str() {
            "ok" => {
                // A timer's step moves the index of due timers (see `timers`).
                if matches!(step.step(), Step::Reminded | Step::Escalated) {
                    self.timer_fired(run, key, step).await;
                }
                Ok(())
            }
            "not_owner" => Err(self.refused(Fault::Moved, "another replica owns this run now")),
            "decided" => Err(self.refused(Fault::Moved, "this pause was decided meanwhile")),
            _ => Err(self.refused(Fault::Lost, "the run's record is gone")),
        }
    }
}
