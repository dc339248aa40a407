//! The Lua scripts every step that must not race another replica runs as:
//! Redis runs each one atomically. Keys and values are described in
//! [`super`].
//!
//! A script a replica sent may run late: its client gave up after the
//! command timeout, and Redis runs it when it gets to it (after a stall, a
//! slow fsync). So every script that changes a run or a session checks the
//! caller's fence first: its instance *and* the session's epoch, which every
//! claim and takeover increments; a decision or a claim carries a nonce,
//! and once [`RESOLVE`] or [`RESOLVE_CLAIM`] has voided a nonce, a late
//! script carrying it changes nothing.

/// `alive(instance)`: the owner's heartbeat (`INSTANCE URL SIGNATURE`) and
/// the milliseconds it has left while it names `instance`, else nil. Shared by the scripts that must tell a live owner
/// from a dead one.
pub const ALIVE: &str = r"
local function alive(inst)
  if not inst or inst == '' then return nil end
  local replica = string.match(inst, '^(.+)/[^/]+$')
  if not replica then return nil end
  local key = 'chatgate:replica:' .. replica
  local beat = redis.call('GET', key)
  if not beat then return nil end
  local sp = string.find(beat, ' ', 1, true)
  if sp and string.sub(beat, 1, sp - 1) == inst then
    return beat, tostring(redis.call('PTTL', key))
  end
  return nil
end
";

/// `unlist(run key)`: the run's pause leaves the inbox's index (its
/// `pending` field names it: `PENDING_SET MEMBER CONFIRMATION_ID`). Shared by
/// every script that decides or ends a pause. Its `conf:ID` stays until it
/// expires (the pause's expiry and the linger): an approver still finds the
/// run by a decided pause's id, on any replica, while the run's record
/// lasts (a record that is gone finds nothing).
pub const UNLIST: &str = r"
local function unlist(rk)
  local p = redis.call('HGET', rk, 'pending')
  if not p then return end
  local set, member = string.match(p, '^(%S+) (%S+) %S+$')
  if set then
    redis.call('ZREM', set, member)
  end
  redis.call('HDEL', rk, 'pending')
end
";

/// `enqueue(first)`: the webhook events in `ARGV[first + 1..]` (JSON: id,
/// event_type, target, order, body), queued at `ARGV[first]` (ms), join
/// the outbox: `outbox:ev:SEQ` (the event), `outbox:q:TARGET ORDER` (its
/// URL and session's queue of seqs: one delivered at a time, in order),
/// `outbox:due` (queues by when their head may be taken) and `outbox:all`
/// (every seq by when it was queued: the depth and the oldest). Shared by
/// every script that writes what an event announces, so both or neither.
pub const ENQUEUE: &str = r"
local function enqueue(first)
  if #ARGV <= first then return end
  local now = ARGV[first]
  for i = first + 1, #ARGV do
    local e = cjson.decode(ARGV[i])
    local seq = redis.call('INCR', 'chatgate:outbox:seq')
    local q = 'chatgate:outbox:q:' .. e.target .. ' ' .. e.order
    redis.call('HSET', 'chatgate:outbox:ev:' .. seq, 'id', e.id, 'type', e.event_type,
      'target', e.target, 'ord', e.order, 'body', e.body, 'queued_at', now,
      'attempts', 0, 'q', q)
    redis.call('ZADD', 'chatgate:outbox:all', now, seq)
    if redis.call('RPUSH', q, seq) == 1 then
      redis.call('ZADD', 'chatgate:outbox:due', now, q)
    end
  end
end
";

/// ARGV: now ms, events (see [`ENQUEUE`]). Events no record write carries.
pub const ANNOUNCE: &str = r"
enqueue(1)
return 1
";

/// ARGV: now ms, lease ms, limit. Takes the heads of the queues that are
/// due (at most `limit`), each leased to the caller until now + lease:
/// flat `SEQ ID TYPE TARGET ORDER BODY QUEUED_AT ATTEMPTS` per event. A
/// queue emptied under a taker (its head settled by another) leaves.
pub const TAKE_EVENTS: &str = r"
local now = tonumber(ARGV[1])
local out = {}
local qs = redis.call('ZRANGEBYSCORE', 'chatgate:outbox:due', '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
for _, q in ipairs(qs) do
  local seq = redis.call('LINDEX', q, 0)
  if not seq then
    redis.call('ZREM', 'chatgate:outbox:due', q)
  elseif redis.call('EXISTS', 'chatgate:outbox:ev:' .. seq) == 0 then
    redis.call('LPOP', q)
  else
    redis.call('ZADD', 'chatgate:outbox:due', now + tonumber(ARGV[2]), q)
    local f = redis.call('HMGET', 'chatgate:outbox:ev:' .. seq, 'id', 'type', 'target', 'ord',
      'body', 'queued_at', 'attempts')
    table.insert(out, seq)
    for _, v in ipairs(f) do table.insert(out, v) end
  end
end
return out
";

/// ARGV: seq, retry at ms ('' once delivered or given up), now ms.
/// Settles a taken event: gone, its queue's next is due now; or tried
/// again at the retry time.
pub const SETTLE_EVENT: &str = r"
local ev = 'chatgate:outbox:ev:' .. ARGV[1]
local q = redis.call('HGET', ev, 'q')
if not q then return 0 end
if ARGV[2] == '' then
  redis.call('DEL', ev)
  redis.call('ZREM', 'chatgate:outbox:all', ARGV[1])
  if redis.call('LINDEX', q, 0) == ARGV[1] then redis.call('LPOP', q) end
  if redis.call('LLEN', q) > 0 then
    redis.call('ZADD', 'chatgate:outbox:due', ARGV[3], q)
  else
    redis.call('ZREM', 'chatgate:outbox:due', q)
  end
else
  redis.call('HINCRBY', ev, 'attempts', 1)
  redis.call('ZADD', 'chatgate:outbox:due', ARGV[2], q)
end
return 1
";

/// KEYS: session. ARGV: instance, new run, ttl ms, nonce, superseded run
/// (or ''), its epoch, its decision, then the supersede's events (from 8).
/// A new run takes the session unless a live replica owns it. A paused run
/// a dead replica left on it goes; one of this replica's own is decided
/// `superseded` in the same step, fenced by its epoch.
pub const CLAIM: &str = r"
if redis.call('HEXISTS', KEYS[1], 'void:' .. ARGV[4]) == 1 then return {'void'} end
local inst = redis.call('HGET', KEYS[1], 'instance')
local old = redis.call('HGET', KEYS[1], 'run')
if inst ~= ARGV[1] then
  local beat, left = alive(inst)
  if beat then return {'owned', beat, left} end
  if ARGV[5] ~= '' then return {'moved'} end
  if old then
    unlist('chatgate:run:' .. old)
    redis.call('DEL', 'chatgate:run:' .. old)
  end
elseif ARGV[5] ~= '' then
  if old ~= ARGV[5] or redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[6] then
    return {'moved'}
  end
  local rk = 'chatgate:run:' .. ARGV[5]
  if redis.call('EXISTS', rk) == 1 then
    if redis.call('HEXISTS', rk, 'decision_nonce') == 1 then return {'decided'} end
    redis.call('HSET', rk, 'decision', ARGV[7], 'decision_nonce', ARGV[4])
    unlist(rk)
    enqueue(8)
  end
end
local epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'instance', ARGV[1], 'run', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'claimed', tostring(epoch)}
";

/// KEYS: session. ARGV: nonce, new run, instance.
/// After a claim whose outcome was unknown: whether it took the session
/// (and still holds it: then its epoch); if it did not, it never will.
pub const RESOLVE_CLAIM: &str = r"
if redis.call('HGET', KEYS[1], 'run') == ARGV[2] then
  if redis.call('HGET', KEYS[1], 'instance') == ARGV[3] then
    return {'recorded', redis.call('HGET', KEYS[1], 'epoch') or '0'}
  end
  return {'moved'}
end
redis.call('HSET', KEYS[1], 'void:' .. ARGV[1], '1')
if redis.call('PTTL', KEYS[1]) < 0 then redis.call('PEXPIRE', KEYS[1], 3600000) end
return {'void'}
";

/// KEYS: session. ARGV: instance, whether it may take the run over.
/// Where a session's run is; a run whose owner is gone becomes ours, under
/// a new epoch.
pub const TAKE_OVER: &str = r"
local inst = redis.call('HGET', KEYS[1], 'instance')
local run = redis.call('HGET', KEYS[1], 'run')
if not run then return {'none'} end
local epoch = redis.call('HGET', KEYS[1], 'epoch') or '0'
if inst == ARGV[1] then return {'mine', run, epoch} end
local rest, left = alive(inst)
if rest then return {'owned', rest, left} end
if ARGV[2] ~= '1' then return {'orphan', run} end
epoch = redis.call('HINCRBY', KEYS[1], 'epoch', 1)
redis.call('HSET', KEYS[1], 'instance', ARGV[1])
redis.call('ZREM', 'chatgate:parked', KEYS[1])
return {'taken', run, tostring(epoch)}
";

/// KEYS: run, session, the namespace's pending set. ARGV: record, ttl ms,
/// instance, run id, epoch, expiry ms, confirmation id, then events (from 8).
/// The pause is listed in its namespace's pending set (scored by its
/// expiry; the member `CONFIRMATION_ID|RUN` sorts ties as the inbox does)
/// and found by its confirmation id (`conf:ID`: the set and the member).
pub const SAVE: &str = r"
if redis.call('HGET', KEYS[2], 'instance') ~= ARGV[3]
   or redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[5] then return 0 end
unlist(KEYS[1])
redis.call('DEL', KEYS[1])
local member = ARGV[7] .. '|' .. ARGV[4]
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'session', KEYS[2],
  'pending', KEYS[3] .. ' ' .. member .. ' ' .. ARGV[7])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[6], member)
redis.call('SET', 'chatgate:conf:' .. ARGV[7], KEYS[3] .. ' ' .. ARGV[6] .. ' ' .. member, 'PX', ARGV[2])
redis.call('HSET', KEYS[2], 'run', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
enqueue(8)
return 1
";

/// KEYS: run, session. ARGV: decision, nonce, instance, epoch, ttl ms,
/// then events (from 6, queued only with the decision).
/// Only the session's owner records, only under its epoch and while its
/// heartbeat lives, and only the first decision; the same nonce again is
/// that decision (`ok`). A run whose record is gone is `not_owner` when the
/// session is another owner's now (another replica took it over, and
/// ended it), else `gone` (its session is gone too: Redis lost its data). The run now works for as long as it takes: its
/// records live on (a replica that takes it over after a crash must find
/// it, to end it `interrupted`).
pub const RECORD_DECISION: &str = r"
local owns = redis.call('HGET', KEYS[2], 'instance') == ARGV[3]
   and redis.call('HGET', KEYS[2], 'epoch') == ARGV[4]
if redis.call('EXISTS', KEYS[1]) == 0 then
  if owns or redis.call('EXISTS', KEYS[2]) == 0 then return 'gone' end
  return 'not_owner'
end
if redis.call('HEXISTS', KEYS[1], 'void:' .. ARGV[2]) == 1 then return 'void' end
local recorded = redis.call('HGET', KEYS[1], 'decision_nonce')
if recorded then
  if recorded == ARGV[2] then return 'ok' end
  return 'decided'
end
if not owns then return 'not_owner' end
if not alive(ARGV[3]) then return 'lapsed' end
redis.call('HSET', KEYS[1], 'decision', ARGV[1], 'decision_nonce', ARGV[2])
unlist(KEYS[1])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
redis.call('PEXPIRE', KEYS[2], ARGV[5])
enqueue(6)
return 'ok'
";

/// KEYS: run, session. ARGV: nonce, instance, epoch.
/// After a decision whose recording had an unknown outcome: whether it was
/// recorded; if it was not, it never will be. Only for the session's owner
/// under its epoch: a caller whose run another replica took over meanwhile
/// is `not_owner` (recorded or not, the run and its decision are the
/// other's now, and the caller must not wait on its pause again). A record
/// that is gone is `not_owner` when the session is another replica's by
/// now, else `gone`.
pub const RESOLVE: &str = r"
local owns = redis.call('HGET', KEYS[2], 'instance') == ARGV[2]
   and redis.call('HGET', KEYS[2], 'epoch') == ARGV[3]
if redis.call('EXISTS', KEYS[1]) == 0 then
  if redis.call('EXISTS', KEYS[2]) == 0 or owns then return 'gone' end
  return 'not_owner'
end
if not owns then
  redis.call('HSET', KEYS[1], 'void:' .. ARGV[1], '1')
  return 'not_owner'
end
if redis.call('HGET', KEYS[1], 'decision_nonce') == ARGV[1] then return 'recorded' end
redis.call('HSET', KEYS[1], 'void:' .. ARGV[1], '1')
return 'void'
";

/// KEYS: run, session. ARGV: run id, instance, grace ms, epoch, end, the
/// record's ended form (`PausedRecord::ended_form`), then events (from 7).
/// The run ended: its record keeps only its end, and its session stays
/// ours, for the grace (a re-attach elsewhere is sent here, where the end
/// is kept; a replica that takes the session over after this one is gone
/// shows the end from the record). A run whose session went on to another
/// run goes at once. One another replica took over is that replica's to
/// end and announce while its record lasts (it restores the record); with
/// no record the taker has nothing to restore and forgets the session, so
/// the end is announced here: the events are queued whatever the answer,
/// by exactly one of the two (#40 item 17). Its execution journal goes
/// (`chatgate:calls:RUN`), its aside pause (`chatgate:run:RUN.aside`, see
/// `aside.rs`), and its pause's progress
/// (`PROGRESS`, the fields of `keys.rs`'s `PROGRESS_FIELDS`, is defined
/// before it).
pub const END: &str = r"
local aside = KEYS[1] .. '.aside'
if redis.call('HGET', KEYS[2], 'run') ~= ARGV[1] then
  unlist(KEYS[1])
  unlist(aside)
  redis.call('DEL', KEYS[1], aside, 'chatgate:calls:' .. ARGV[1])
  enqueue(7)
  return 1
end
if redis.call('HGET', KEYS[2], 'instance') ~= ARGV[2]
   or redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[4] then
  if redis.call('EXISTS', KEYS[1]) == 0 then enqueue(7) end
  return 0
end
unlist(KEYS[1])
unlist(aside)
redis.call('DEL', aside, 'chatgate:calls:' .. ARGV[1])
if tonumber(ARGV[3]) > 0 then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    redis.call('HSET', KEYS[1], 'ended', ARGV[5], 'record', ARGV[6])
    redis.call('HDEL', KEYS[1], unpack(PROGRESS))
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  end
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
else
  redis.call('DEL', KEYS[1], KEYS[2])
end
enqueue(7)
return 1
";

/// KEYS: run, session. ARGV: run id, instance, epoch.
/// A record no client can reach goes (its aside pause too), and its
/// session if it is still ours.
pub const REMOVE: &str = r"
unlist(KEYS[1])
unlist(KEYS[1] .. '.aside')
redis.call('DEL', KEYS[1], KEYS[1] .. '.aside', 'chatgate:calls:' .. ARGV[1])
if redis.call('HGET', KEYS[2], 'run') == ARGV[1]
   and redis.call('HGET', KEYS[2], 'instance') == ARGV[2]
   and redis.call('HGET', KEYS[2], 'epoch') == ARGV[3] then
  redis.call('DEL', KEYS[2])
end
return 1
";

/// KEYS: session. ARGV: run id, instance, epoch.
/// At shutdown: the suspended run is anyone's to take over at once.
pub const HAND_BACK: &str = r"
if redis.call('HGET', KEYS[1], 'run') == ARGV[1]
   and redis.call('HGET', KEYS[1], 'instance') == ARGV[2]
   and redis.call('HGET', KEYS[1], 'epoch') == ARGV[3] then
  redis.call('HSET', KEYS[1], 'instance', '')
end
return 1
";

/// KEYS: session, the parked set. ARGV: run id, instance, epoch.
/// Parked (#46): handed back as at shutdown, and counted among the parked
/// sessions until a replica takes it over (or its data expires).
pub const PARK: &str = r"
if redis.call('HGET', KEYS[1], 'run') == ARGV[1]
   and redis.call('HGET', KEYS[1], 'instance') == ARGV[2]
   and redis.call('HGET', KEYS[1], 'epoch') == ARGV[3] then
  redis.call('HSET', KEYS[1], 'instance', '')
  local now = redis.call('TIME')
  local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('ZADD', KEYS[2], ms + math.max(redis.call('PTTL', KEYS[1]), 0), KEYS[1])
end
return 1
";

/// KEYS: session. ARGV: run id, instance, epoch.
/// A taken-over run had no record (it was working, or it ended): the
/// session has no run.
pub const FORGET: &str = r"
if redis.call('HGET', KEYS[1], 'run') == ARGV[1]
   and redis.call('HGET', KEYS[1], 'instance') == ARGV[2]
   and redis.call('HGET', KEYS[1], 'epoch') == ARGV[3] then
  redis.call('DEL', KEYS[1])
end
return 1
";

/// KEYS: heartbeat. ARGV: value.
pub const LEAVE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
";

/// The tail of a script's ARGV that queues `events` (see
/// [`ENQUEUE`]): the time now, then each event as JSON.
pub fn event_args(events: &[crate::store::OutboxEvent]) -> Vec<String> {
    if events.is_empty() {
        return Vec::new();
    }
    let mut args = vec![crate::clock::now_ms().to_string()];
    args.extend(events.iter().map(|e| {
        serde_json::json!({
            "id": e.id,
            "event_type": e.event_type,
            "target": e.target,
            "order": e.order,
            "body": e.body,
        })
        .to_string()
    }));
    args
}
