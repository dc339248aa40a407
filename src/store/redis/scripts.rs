//! The Lua scripts every step that must not race another replica runs as:
//! Redis runs each one atomically. Keys and values are described in
//! [`super`].

/// `alive(instance)`: the owner's advertised URL and the milliseconds its
/// heartbeat has left while the heartbeat names `instance`, else nil.
/// Shared by the scripts that must tell a live owner from a dead one.
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
    return string.sub(beat, sp + 1), tostring(redis.call('PTTL', key))
  end
  return nil
end
";

/// KEYS: session. ARGV: instance, run, ttl ms.
/// A new run takes the session unless a live replica owns it. A paused run
/// a dead replica left on it is superseded: its record goes.
pub const CLAIM: &str = r"
local inst = redis.call('HGET', KEYS[1], 'instance')
local old = redis.call('HGET', KEYS[1], 'run')
if inst ~= ARGV[1] then
  local url, left = alive(inst)
  if url then return {'owned', url, left} end
  if old then redis.call('DEL', 'chatgate:run:' .. old) end
end
redis.call('HSET', KEYS[1], 'instance', ARGV[1], 'run', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {'claimed'}
";

/// KEYS: session. ARGV: instance, whether it may take the run over.
/// Where a session's run is; a run whose owner is gone becomes ours.
pub const TAKE_OVER: &str = r"
local inst = redis.call('HGET', KEYS[1], 'instance')
local run = redis.call('HGET', KEYS[1], 'run')
if not run then return {'none'} end
if inst == ARGV[1] then return {'mine', run} end
local url, left = alive(inst)
if url then return {'owned', url, left} end
if ARGV[2] ~= '1' then return {'orphan', run} end
redis.call('HSET', KEYS[1], 'instance', ARGV[1])
return {'taken', run}
";

/// KEYS: run, session. ARGV: record, ttl ms, instance, run id.
pub const SAVE: &str = r"
if redis.call('HGET', KEYS[2], 'instance') ~= ARGV[3] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'record', ARGV[1], 'session', KEYS[2])
redis.call('PEXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[2], 'run', ARGV[4])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
";

/// KEYS: run. ARGV: decision, instance, ttl ms.
/// Only the session's owner records, and only the first decision. The run
/// now works for as long as it takes: its records live on (a replica that
/// takes it over after a crash must find it, to end it `interrupted`).
pub const RECORD_DECISION: &str = r"
local session = redis.call('HGET', KEYS[1], 'session')
if not session then return 'gone' end
if redis.call('HGET', session, 'instance') ~= ARGV[2] then return 'not_owner' end
if redis.call('HEXISTS', KEYS[1], 'decision') == 1 then return 'decided' end
redis.call('HSET', KEYS[1], 'decision', ARGV[1])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', session, ARGV[3])
return 'ok'
";

/// KEYS: run, session. ARGV: run id, instance, grace ms.
/// The run ended: its record goes; its session stays ours for the grace
/// (a re-attach elsewhere is sent here, where the end is kept).
pub const REMOVE: &str = r"
redis.call('DEL', KEYS[1])
if redis.call('HGET', KEYS[2], 'run') == ARGV[1]
   and redis.call('HGET', KEYS[2], 'instance') == ARGV[2] then
  if tonumber(ARGV[3]) > 0 then
    redis.call('PEXPIRE', KEYS[2], ARGV[3])
  else
    redis.call('DEL', KEYS[2])
  end
end
return 1
";

/// KEYS: session. ARGV: run id, instance.
/// At shutdown: the suspended run is anyone's to take over at once.
pub const HAND_BACK: &str = r"
if redis.call('HGET', KEYS[1], 'run') == ARGV[1]
   and redis.call('HGET', KEYS[1], 'instance') == ARGV[2] then
  redis.call('HSET', KEYS[1], 'instance', '')
end
return 1
";

/// KEYS: session. ARGV: run id, instance.
/// A taken-over run had no record (it was working, or it ended): the
/// session has no run.
pub const FORGET: &str = r"
if redis.call('HGET', KEYS[1], 'run') == ARGV[1]
   and redis.call('HGET', KEYS[1], 'instance') == ARGV[2] then
  redis.call('DEL', KEYS[1])
end
return 1
";

/// KEYS: heartbeat. ARGV: value.
pub const LEAVE: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
";
