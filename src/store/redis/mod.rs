//! `--store redis://HOST:PORT/DB`: paused runs in Redis, for replicas.
//!
//! The client is redis-rs with its tokio `ConnectionManager`: one
//! multiplexed connection per process that reconnects by itself, every
//! command bounded by a response timeout. Every step that must not race
//! another replica (claiming a session, taking over a run, recording a
//! decision) is one Lua script, which Redis runs atomically. A standalone
//! Redis (or a primary with replicas): the scripts touch keys they compute,
//! which Redis Cluster does not allow.
//!
//! Keys (all under `chatgate:`):
//! - `replica:ID`: `INSTANCE URL`, with a TTL of `--owner-ttl` that the
//!   replica keeps refreshing: its heartbeat. `INSTANCE` is `ID/NONCE`, new
//!   at every start, so a replica restarted under the same id does not pass
//!   for the process that held the runs before.
//! - `session:NAMESPACE:SESSION` (`NAMESPACE`: the API key's, as
//!   [`Namespaces`] names it, or `-` without keys): a hash, `instance` (who
//!   owns the session's run; empty once handed back at shutdown) and `run`
//!   (its id). Together with the heartbeat this is the run's owner record:
//!   the owner is alive while its heartbeat names the same instance.
//! - `run:RUN`: a hash, `record` (the [`PausedRecord`] as JSON), `session`
//!   (its session key) and, once taken, `decision`.
//!
//! Every key expires by itself: a session record an hour after its run
//! started unless a pause extends it, a pause's records `linger` after the
//! pause's expiry, an ended run's session record after `--detach-grace`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use serde_json::Value;
use tokio::sync::OnceCell;

mod scripts;

use self::scripts::{
    ALIVE, CLAIM, FORGET, HAND_BACK, LEAVE, RECORD_DECISION, REMOVE, SAVE, TAKE_OVER,
};
use super::{Fault, PausedRecord, Store, StoreError};
use crate::session::Namespaces;
use crate::session::SessionKey;

/// How long a session record lives while its run works (from its start,
/// and again from each decision): a run that works for longer without
/// pausing loses its owner record (a reply or re-attach elsewhere then
/// finds no run).
const STREAMING_TTL: Duration = Duration::from_secs(3600);
/// Bound on every Redis command and connection attempt.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);

/// A live replica that owns a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remote {
    /// Its advertised URL.
    pub url: String,
    /// How long its heartbeat has left: if it cannot be reached, its runs
    /// can be taken over once this has passed.
    pub lease: Duration,
}

impl Remote {
    fn parse(url: &str, left_ms: Option<&String>) -> Remote {
        let left = left_ms.and_then(|ms| ms.parse::<u64>().ok()).unwrap_or(0);
        Remote {
            url: url.to_owned(),
            lease: Duration::from_millis(left),
        }
    }
}

/// Whether a new run may take its session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    Claimed,
    /// A live replica owns the session.
    Owned(Remote),
}

/// Where a session's run is, as [`RedisStore::take_over`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// No run on the session.
    Nobody,
    /// This process owns it (if it is not here, it has ended).
    Mine(String),
    /// A live replica owns it.
    Elsewhere(Remote),
    /// Its owner was gone: it is this process's now.
    TakenOver(String),
    /// Its owner is gone, and this process may not take it over.
    Orphan,
}

/// What a heartbeat found in its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Beat {
    /// This process's previous beat.
    Kept,
    /// Nothing: the heartbeat had expired.
    Lapsed,
    /// Another process's beat (`INSTANCE URL`): at start, this replica's
    /// previous process; later, another process with the same replica id.
    Replaced(String),
}

/// What the store needs to know of its replica.
#[derive(Debug, Clone)]
pub struct ReplicaSettings {
    pub replica_id: String,
    pub advertise_url: String,
    /// How long an ended run's session stays ours (`--detach-grace`).
    pub grace: Duration,
    /// How long a pause's records outlive its expiry: the grace and the
    /// owner TTL, so that a replica taking it over late still sees its end.
    pub linger: Duration,
    /// The API keys' namespaces as keys in Redis name them (the same on
    /// every replica, whatever the order of its keys).
    pub namespaces: Namespaces,
}

pub struct RedisStore {
    client: redis::Client,
    connection: OnceCell<ConnectionManager>,
    /// The URL without its password, for messages.
    name: String,
    /// `REPLICA/NONCE`: this process.
    instance: Arc<str>,
    replica: ReplicaSettings,
    /// The last command succeeded (for `/readyz`).
    healthy: AtomicBool,
    scripts: Scripts,
}

struct Scripts {
    claim: Script,
    take_over: Script,
    save: Script,
    record_decision: Script,
    remove: Script,
    hand_back: Script,
    forget: Script,
    leave: Script,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("name", &self.name)
            .field("instance", &self.instance)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Checks `url`; connects on first use (a Redis that is down at start
    /// is a store that is unavailable for now, not a reason not to start).
    pub fn open(url: &str, replica: ReplicaSettings) -> Result<RedisStore, String> {
        let client = redis::Client::open(url).map_err(|err| err.to_string())?;
        let info = client.get_connection_info();
        let name = format!("redis://{}/{}", info.addr(), info.redis_settings().db());
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let with_alive = |body: &str| Script::new(&format!("{ALIVE}{body}"));
        Ok(RedisStore {
            client,
            connection: OnceCell::new(),
            name,
            instance: Arc::from(format!("{}/{}", replica.replica_id, &nonce[..12])),
            replica,
            healthy: AtomicBool::new(true),
            scripts: Scripts {
                claim: with_alive(CLAIM),
                take_over: with_alive(TAKE_OVER),
                save: Script::new(SAVE),
                record_decision: Script::new(RECORD_DECISION),
                remove: Script::new(REMOVE),
                hand_back: Script::new(HAND_BACK),
                forget: Script::new(FORGET),
                leave: Script::new(LEAVE),
            },
        })
    }

    /// This process: `REPLICA/NONCE`.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(COMMAND_TIMEOUT))
            .set_response_timeout(Some(COMMAND_TIMEOUT))
            .set_number_of_retries(2)
            .set_max_delay(Duration::from_millis(500));
        let client = self.client.clone();
        self.connection
            .get_or_try_init(|| ConnectionManager::new_with_config(client, config))
            .await
            .cloned()
            .map_err(|err| self.failed(&err))
    }

    fn failed(&self, err: &redis::RedisError) -> StoreError {
        self.healthy.store(false, Ordering::Relaxed);
        StoreError {
            store: self.name.clone(),
            reason: err.to_string(),
            fault: Fault::Unreachable,
        }
    }

    /// The run cannot be used from here: `fault` says why.
    fn refused(&self, fault: Fault, reason: &str) -> StoreError {
        StoreError {
            store: self.name.clone(),
            reason: reason.to_owned(),
            fault,
        }
    }

    /// Runs `script` with `keys` and `args`.
    async fn invoke<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&str],
    ) -> Result<T, StoreError> {
        let mut connection = self.connection().await?;
        let mut invocation = script.prepare_invoke();
        for key in keys {
            invocation.key(*key);
        }
        for arg in args {
            invocation.arg(*arg);
        }
        let value = invocation
            .invoke_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        self.healthy.store(true, Ordering::Relaxed);
        Ok(value)
    }

    /// A new run `run` takes `key`, unless a live replica owns it.
    pub async fn claim(&self, key: &SessionKey, run: &str) -> Result<Claim, StoreError> {
        let ttl = STREAMING_TTL.as_millis().to_string();
        let answer: Vec<String> = self
            .invoke(
                &self.scripts.claim,
                &[&self.session_key(key)],
                &[&self.instance, run, &ttl],
            )
            .await?;
        Ok(match answer.as_slice() {
            [owned, url, rest @ ..] if owned == "owned" => {
                Claim::Owned(Remote::parse(url, rest.first()))
            }
            _ => Claim::Claimed,
        })
    }

    /// Where the run of `key` is; one whose owner is gone becomes ours if
    /// `may_take` (not while this process shuts down).
    pub async fn take_over(&self, key: &SessionKey, may_take: bool) -> Result<Owner, StoreError> {
        let may_take = if may_take { "1" } else { "0" };
        let answer: Vec<String> = self
            .invoke(
                &self.scripts.take_over,
                &[&self.session_key(key)],
                &[&self.instance, may_take],
            )
            .await?;
        Ok(match answer.as_slice() {
            [what, run] if what == "mine" => Owner::Mine(run.clone()),
            [what, url, rest @ ..] if what == "owned" => {
                Owner::Elsewhere(Remote::parse(url, rest.first()))
            }
            [what, run] if what == "taken" => Owner::TakenOver(run.clone()),
            [what, _] if what == "orphan" => Owner::Orphan,
            _ => Owner::Nobody,
        })
    }

    /// The stored record of `run`, with its decision if one was taken.
    pub async fn get(&self, run: &str) -> Result<Option<PausedRecord>, StoreError> {
        let mut connection = self.connection().await?;
        let (record, decision): (Option<String>, Option<String>) = redis::cmd("HMGET")
            .arg(run_key(run))
            .arg("record")
            .arg("decision")
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        self.healthy.store(true, Ordering::Relaxed);
        let Some(record) = record else {
            return Ok(None);
        };
        match serde_json::from_str::<PausedRecord>(&record) {
            Ok(mut record) => {
                record.decision = decision.and_then(|d| serde_json::from_str(&d).ok());
                Ok(Some(record))
            }
            Err(err) => {
                log::warn!("skipping an unreadable stored run {run}: {err}");
                Ok(None)
            }
        }
    }

    /// The instance that owns each of `keys` (`None`: nobody).
    pub async fn instances(&self, keys: &[SessionKey]) -> Result<Vec<Option<String>>, StoreError> {
        let mut connection = self.connection().await?;
        let mut pipe = redis::pipe();
        for key in keys {
            pipe.cmd("HGET").arg(self.session_key(key)).arg("instance");
        }
        let owners: Vec<Option<String>> = pipe
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        self.healthy.store(true, Ordering::Relaxed);
        Ok(owners)
    }

    /// A run taken over had no record: its session has no run any more.
    pub async fn forget(&self, key: &SessionKey, run: &str) -> Result<(), StoreError> {
        self.invoke::<i64>(
            &self.scripts.forget,
            &[&self.session_key(key)],
            &[run, &self.instance],
        )
        .await
        .map(drop)
    }

    /// Refreshes this replica's heartbeat for `ttl`. Returns what it
    /// replaced: this process's own beat, nothing (it had lapsed: another
    /// replica may have taken runs over), or another process's.
    pub async fn heartbeat(&self, ttl: Duration) -> Result<Beat, StoreError> {
        let mut connection = self.connection().await?;
        let previous: Option<String> = redis::cmd("SET")
            .arg(self.heartbeat_key())
            .arg(self.heartbeat_value())
            .arg("PX")
            .arg(ttl.as_millis() as u64)
            .arg("GET")
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        self.healthy.store(true, Ordering::Relaxed);
        Ok(match previous {
            None => Beat::Lapsed,
            Some(previous) if previous == self.heartbeat_value() => Beat::Kept,
            Some(previous) => Beat::Replaced(previous),
        })
    }

    /// Deletes this process's heartbeat: its runs are anyone's at once.
    pub async fn leave(&self) -> Result<(), StoreError> {
        self.invoke::<i64>(
            &self.scripts.leave,
            &[&self.heartbeat_key()],
            &[&self.heartbeat_value()],
        )
        .await
        .map(drop)
    }

    /// The Redis key of `key`'s session record.
    fn session_key(&self, key: &SessionKey) -> String {
        let namespace = self.replica.namespaces.name(key.owner);
        session_key(namespace.as_deref(), &key.session_id)
    }

    fn heartbeat_key(&self) -> String {
        format!("chatgate:replica:{}", self.replica.replica_id)
    }

    fn heartbeat_value(&self) -> String {
        format!("{} {}", self.instance, self.replica.advertise_url)
    }
}

impl Store for RedisStore {
    fn is_durable(&self) -> bool {
        true
    }

    fn health(&self) -> Result<(), String> {
        if self.healthy.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(self.name.clone())
        }
    }

    fn save(&self, record: PausedRecord) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            let now_ms = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let ttl = record.expires_at_ms.saturating_sub(now_ms)
                + self.replica.linger.as_millis() as u64;
            let json = serde_json::to_string(&record).unwrap_or_default();
            let session = session_key(record.namespace.as_deref(), &record.session_id);
            let saved: i64 = self
                .invoke(
                    &self.scripts.save,
                    &[&run_key(&record.run), &session],
                    &[&json, &ttl.to_string(), &self.instance, &record.run],
                )
                .await?;
            if saved == 1 {
                Ok(())
            } else {
                Err(self.refused(Fault::Moved, "another replica owns this session now"))
            }
        })
    }

    fn record_decision(&self, run: &str, decision: Value) -> BoxFuture<'_, Result<(), StoreError>> {
        let run = run_key(run);
        Box::pin(async move {
            let ttl = STREAMING_TTL.as_millis().to_string();
            let answer: String = self
                .invoke(
                    &self.scripts.record_decision,
                    &[&run],
                    &[&decision.to_string(), &self.instance, &ttl],
                )
                .await?;
            match answer.as_str() {
                "ok" => Ok(()),
                "not_owner" => Err(self.refused(Fault::Moved, "another replica owns this run now")),
                "decided" => {
                    Err(self.refused(Fault::Moved, "this pause was decided on another replica"))
                }
                _ => Err(self.refused(Fault::Lost, "the run's record is gone")),
            }
        })
    }

    fn remove(&self, run: &str, key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        let (run, session) = (run.to_owned(), self.session_key(key));
        Box::pin(async move {
            let grace = self.replica.grace.as_millis().to_string();
            self.invoke::<i64>(
                &self.scripts.remove,
                &[&run_key(&run), &session],
                &[&run, &self.instance, &grace],
            )
            .await
            .map(drop)
        })
    }

    fn suspend(&self, run: &str, key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        let (run, session) = (run.to_owned(), self.session_key(key));
        Box::pin(async move {
            self.invoke::<i64>(
                &self.scripts.hand_back,
                &[&session],
                &[&run, &self.instance],
            )
            .await
            .map(drop)
        })
    }

    fn load(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        // Replicas restore lazily: a run is taken over by the replica that
        // gets its next reply or re-attach (see `crate::run::Runs::place`).
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// `chatgate:session:NAMESPACE:SESSION`, `-` for the namespace without keys.
fn session_key(namespace: Option<&str>, session_id: &str) -> String {
    format!("chatgate:session:{}:{session_id}", namespace.unwrap_or("-"))
}

fn run_key(run: &str) -> String {
    format!("chatgate:run:{run}")
}
