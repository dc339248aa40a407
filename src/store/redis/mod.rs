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
//! - `replica:ID`: `INSTANCE URL SIGNATURE`, with a TTL of `--owner-ttl`
//!   that the replica keeps refreshing: its heartbeat. `INSTANCE` is
//!   `ID/NONCE`, new at every start, so a replica restarted under the same
//!   id does not pass for the process that held the runs before.
//!   `SIGNATURE` is an HMAC-SHA256 of `INSTANCE URL` with `--cluster-secret`:
//!   a replica forwards a client's request (its `Authorization`, and the
//!   cluster secret) only to a URL the secret signed, so whoever can write
//!   to the Redis database cannot send those to an address of their own.
//! - `session:NAMESPACE:SESSION` (`NAMESPACE`: the API key's, as
//!   [`Namespaces`] names it, or `-` without keys): a hash, `instance` (who
//!   owns the session's run; empty once handed back at shutdown), `run`
//!   (its id) and `epoch` (incremented by every claim and takeover: the
//!   fence every later script of that owner's checks), and `void:NONCE`
//!   for claims whose outcome was unknown and that must not happen any more.
//!   Together with the heartbeat this is the run's owner record: the owner
//!   is alive while its heartbeat names the same instance.
//! - `run:RUN`: a hash, `record` (the [`PausedRecord`], compressed: see
//!   [`crate::store::compact`]), `session`
//!   (its session key), once taken `decision` and `decision_nonce`,
//!   `void:NONCE` for decisions whose recording had an unknown outcome and
//!   was then found not to have happened, once the run ended `ended`
//!   (its [`RunEnd`]: the end a replica that takes the session over shows),
//!   and while its pause waits `pending` (where the inbox lists it).
//! - `pending:NAMESPACE`: a sorted set of the namespace's undecided stored
//!   pauses, `CONFIRMATION_ID|RUN` scored by expiry (the inbox's order), and
//!   `conf:CONFIRMATION_ID`: `SET SCORE MEMBER`, to page from a pause and
//!   to find a pause's run by its id. A pause leaves the set in the scripts
//!   that decide and end pauses; its `conf:` key stays until it expires
//!   (with the pause's records), so that a decided pause's id still finds
//!   its run while the run's record lasts.
//! - `run:RUN.aside`: a pause of the run that is not its record (a
//!   reconcile pause, #44), listed in `pending:` and `conf:` as a stored
//!   pause is (see `aside.rs`).
//!
//! - `outcome:NAMESPACE:SESSION`: the session's latest run's [`Outcome`](super::Outcome),
//!   for `--keep-outcome`.
//!
//! Every key expires by itself: a session record an hour after its run
//! started unless a pause extends it, a pause's records `linger` after the
//! pause's expiry, an ended run's records after `--detach-grace`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use secrecy::SecretString;
use tokio::sync::OnceCell;

mod aside;
mod calls;
mod grants;
mod inbox;
mod keys;
mod outbox;
mod outcomes;
pub mod ownership;
mod progress;
mod records;
mod scripts;
#[cfg(test)]
mod tests;
mod timers;
mod working;

use self::keys::{pending_key, progress_lua, run_key, session_key};
use self::scripts::{
    ALIVE, ANNOUNCE, CLAIM, END, ENQUEUE, FORGET, HAND_BACK, LEAVE, PARK, RECORD_DECISION, REMOVE,
    RESOLVE, RESOLVE_CLAIM, SAVE, SETTLE_EVENT, TAKE_EVENTS, TAKE_OVER, UNLIST,
};
use super::{
    CallEntry, Fault, KeptOutcome, Located, OutboxEvent, OutboxStats, PauseProgress, PausedRecord,
    QueuedEvent, Resolution, RunEnd, Store, StoreError, StoredDecision,
};
use crate::session::{Namespaces, SessionKey};

/// How long a session record lives while its run works (from its start,
/// and again from each decision): a run that works for longer without
/// pausing loses its owner record (a reply or re-attach elsewhere then
/// finds no run).
const STREAMING_TTL: Duration = Duration::from_secs(3600);
/// Bound on every Redis command and connection attempt.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(2);
/// What the store needs to know of its replica.
#[derive(Debug, Clone)]
pub struct ReplicaSettings {
    pub replica_id: String,
    pub advertise_url: String,
    /// Signs this replica's heartbeat, and checks the others'.
    pub secret: SecretString,
    /// How long an ended run's session stays ours (`--detach-grace`).
    pub grace: Duration,
    /// How long a pause's records outlive its expiry: the grace and the
    /// owner TTL, so that a replica taking it over late still sees its end.
    pub linger: Duration,
    /// The API keys' namespaces as keys in Redis name them (the same on
    /// every replica, whatever the order of its keys).
    pub namespaces: Namespaces,
    /// Records are written compressed (`--redis-records`); either form is
    /// read.
    pub compress_records: bool,
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
    /// The epoch under which this process holds each of its runs (set by a
    /// claim or a takeover, gone with the run): every script that changes
    /// a run is fenced by it.
    epochs: Mutex<HashMap<String, String>>,
    scripts: Scripts,
}

struct Scripts {
    claim: Script,
    resolve_claim: Script,
    take_over: Script,
    save: Script,
    record_decision: Script,
    resolve: Script,
    end: Script,
    remove: Script,
    hand_back: Script,
    park: Script,
    forget: Script,
    leave: Script,
    announce: Script,
    take_events: Script,
    settle_event: Script,
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
        let with_alive = |body: &str| Script::new(&format!("{ALIVE}{UNLIST}{ENQUEUE}{body}"));
        let with_unlist = |body: &str| Script::new(&format!("{UNLIST}{ENQUEUE}{body}"));
        Ok(RedisStore {
            client,
            connection: OnceCell::new(),
            name,
            instance: Arc::from(format!("{}/{}", replica.replica_id, &nonce[..12])),
            replica,
            healthy: AtomicBool::new(true),
            epochs: Mutex::default(),
            scripts: Scripts {
                claim: with_alive(CLAIM),
                resolve_claim: Script::new(RESOLVE_CLAIM),
                take_over: with_alive(TAKE_OVER),
                save: with_unlist(SAVE),
                record_decision: with_alive(RECORD_DECISION),
                resolve: Script::new(RESOLVE),
                end: with_unlist(&format!("{}{END}", progress_lua())),
                remove: with_unlist(REMOVE),
                hand_back: Script::new(HAND_BACK),
                park: Script::new(PARK),
                forget: Script::new(FORGET),
                leave: Script::new(LEAVE),
                announce: Script::new(&format!("{ENQUEUE}{ANNOUNCE}")),
                take_events: Script::new(TAKE_EVENTS),
                settle_event: Script::new(SETTLE_EVENT),
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

    /// A command failed. Refused connections did nothing; anything else
    /// (a timeout above all) may have been carried out, now or later.
    fn failed(&self, err: &redis::RedisError) -> StoreError {
        self.healthy.store(false, Ordering::Relaxed);
        let fault = if err.is_connection_refusal() {
            Fault::Unreachable
        } else {
            Fault::Unknown
        };
        StoreError {
            store: self.name.clone(),
            reason: err.to_string(),
            fault,
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
        let args: Vec<&[u8]> = args.iter().map(|arg| arg.as_bytes()).collect();
        self.invoke_raw(script, keys, &args).await
    }

    /// [`RedisStore::invoke`] with arguments that are bytes (a record,
    /// compressed).
    pub(super) async fn invoke_raw<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        keys: &[&str],
        args: &[&[u8]],
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

    /// The epoch this process holds run `run` under ("" if none: every
    /// fenced script then refuses).
    fn epoch(&self, run: &str) -> String {
        self.epochs_lock().get(run).cloned().unwrap_or_default()
    }

    fn hold(&self, run: &str, epoch: &str) {
        self.epochs_lock().insert(run.to_owned(), epoch.to_owned());
    }

    fn let_go(&self, run: &str) {
        self.epochs_lock().remove(run);
    }

    fn epochs_lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, String>> {
        // Plain data; a panic elsewhere leaves it consistent.
        self.epochs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The Redis key of `key`'s session record.
    fn session_key(&self, key: &SessionKey) -> String {
        let namespace = self.replica.namespaces.name(key.owner);
        session_key(namespace.as_deref(), &key.session_id)
    }
}

impl Store for RedisStore {
    fn is_durable(&self) -> bool {
        true
    }

    fn indexes_every_pause(&self) -> bool {
        true
    }

    fn health(&self) -> Result<(), String> {
        if self.healthy.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(self.name.clone())
        }
    }

    fn save<'a>(
        &'a self,
        record: PausedRecord,
        events: &'a [OutboxEvent],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let now_ms = crate::clock::now_ms();
            let ttl = record.expires_at_ms.saturating_sub(now_ms)
                + self.replica.linger.as_millis() as u64;
            let packed = self.encode(&record);
            let session = session_key(record.namespace.as_deref(), &record.session_id);
            let epoch = self.epoch(&record.run);
            let pending = pending_key(record.namespace.as_deref());
            let ttl = ttl.to_string();
            let expiry = record.expires_at_ms.to_string();
            let mut args: Vec<&[u8]> = vec![
                &packed,
                ttl.as_bytes(),
                self.instance.as_bytes(),
                record.run.as_bytes(),
                epoch.as_bytes(),
                expiry.as_bytes(),
                record.confirmation_id.as_bytes(),
            ];
            let events = scripts::event_args(events);
            args.extend(events.iter().map(String::as_bytes));
            let saved: i64 = self
                .invoke_raw(
                    &self.scripts.save,
                    &[&run_key(&record.run), &session, &pending],
                    &args,
                )
                .await?;
            if saved == 1 {
                self.timer_saved(&record).await;
                Ok(())
            } else {
                Err(self.refused(Fault::Moved, "another replica owns this session now"))
            }
        })
    }

    fn record_decision<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        decision: &'a StoredDecision,
        events: &'a [OutboxEvent],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            let ttl = STREAMING_TTL.as_millis().to_string();
            let json = serde_json::to_string(decision).unwrap_or_default();
            let epoch = self.epoch(run);
            let mut args = vec![json.as_str(), &decision.nonce, &self.instance, &epoch, &ttl];
            let events = scripts::event_args(events);
            args.extend(events.iter().map(String::as_str));
            let answer: String = self
                .invoke(
                    &self.scripts.record_decision,
                    &[&run_key(run), &self.session_key(key)],
                    &args,
                )
                .await?;
            match answer.as_str() {
                "ok" => {
                    // At work now: a replica finds it if this one dies (#44).
                    self.index_working(run, key).await;
                    Ok(())
                }
                "not_owner" => Err(self.refused(Fault::Moved, "another replica owns this run now")),
                "decided" => Err(self.refused(Fault::Moved, "this pause was decided elsewhere")),
                // This replica's heartbeat has expired in Redis: until it
                // beats again nothing is decided here, nor taken over.
                "lapsed" => Err(self.refused(
                    Fault::Unreachable,
                    "this replica's heartbeat has lapsed; it decides nothing until it beats again",
                )),
                "void" => Err(self.refused(Fault::Unreachable, "this attempt was given up on")),
                _ => Err(self.refused(Fault::Lost, "the run's record is gone")),
            }
        })
    }

    fn resolve<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        nonce: &'a str,
    ) -> BoxFuture<'a, Result<Resolution, StoreError>> {
        Box::pin(async move {
            let answer: String = self
                .invoke(
                    &self.scripts.resolve,
                    &[&run_key(run), &self.session_key(key)],
                    &[nonce, &self.instance, &self.epoch(run)],
                )
                .await?;
            match answer.as_str() {
                "recorded" => Ok(Resolution::Recorded),
                "void" => Ok(Resolution::Void),
                "not_owner" => Err(self.refused(Fault::Moved, "another replica owns this run now")),
                _ => Err(self.refused(Fault::Lost, "the run's record is gone")),
            }
        })
    }

    fn end<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        end: &'a RunEnd,
        events: &'a [OutboxEvent],
        outcome: Option<&'a KeptOutcome>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            if let Some(kept) = outcome {
                self.keep_outcome_now(kept.namespace.as_deref(), &kept.outcome, kept.keep)
                    .await?;
            }
            let grace = self.replica.grace.as_millis().to_string();
            let json = serde_json::to_string(end).unwrap_or_default();
            let namespace = self.replica.namespaces.name(key.owner);
            let record = PausedRecord::ended_form(run, namespace, &key.session_id, end);
            let record = self.encode(&record);
            let epoch = self.epoch(run);
            let mut args: Vec<&[u8]> = vec![
                run.as_bytes(),
                self.instance.as_bytes(),
                grace.as_bytes(),
                epoch.as_bytes(),
                json.as_bytes(),
                &record,
            ];
            let events = scripts::event_args(events);
            args.extend(events.iter().map(String::as_bytes));
            self.invoke_raw::<i64>(
                &self.scripts.end,
                &[&run_key(run), &self.session_key(key)],
                &args,
            )
            .await?;
            self.let_go(run);
            Ok(())
        })
    }

    fn remove(&self, run: &str, key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        let (run, session) = (run.to_owned(), self.session_key(key));
        Box::pin(async move {
            let epoch = self.epoch(&run);
            self.invoke::<i64>(
                &self.scripts.remove,
                &[&run_key(&run), &session],
                &[&run, &self.instance, &epoch],
            )
            .await?;
            self.let_go(&run);
            Ok(())
        })
    }

    fn suspend(&self, run: &str, key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        let (run, session) = (run.to_owned(), self.session_key(key));
        Box::pin(self.let_go_with(&self.scripts.hand_back, run, session, &[]))
    }

    fn pending<'a>(
        &'a self,
        namespace: Option<&'a str>,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<PausedRecord>, StoreError>> {
        Box::pin(self.pending_page(namespace, after, limit))
    }

    fn locate<'a>(
        &'a self,
        confirmation_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Located>, StoreError>> {
        Box::pin(self.locate_pause(confirmation_id))
    }

    fn record_progress<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        step: &'a PauseProgress,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.record_step(run, key, step))
    }

    fn load(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        // Replicas restore lazily: a run is taken over by the replica that
        // gets its next reply or re-attach (see `crate::run::place`).
        Box::pin(async { Ok(Vec::new()) })
    }
}

impl super::ExecutionStore for RedisStore {
    fn journal_call<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        entry: &'a CallEntry,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.keep_call(run, key, entry))
    }

    fn list_aside<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        record: Option<&'a PausedRecord>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async move {
            match record {
                Some(record) => self.list_aside_record(record, key).await,
                None => self.drop_aside(run, key).await,
            }
        })
    }
}

impl super::OutboxStore for RedisStore {
    fn announce<'a>(&'a self, events: &'a [OutboxEvent]) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(self.announce_events(events))
    }

    fn due_events(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<QueuedEvent>, StoreError>> {
        Box::pin(self.take_events(now_ms, limit))
    }

    fn settle_events(
        &self,
        settled: Vec<(i64, Option<u64>)>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async move {
            for (seq, retry_at_ms) in settled {
                self.settle(seq, retry_at_ms).await?;
            }
            Ok(())
        })
    }

    fn outbox_stats(&self) -> BoxFuture<'_, Result<OutboxStats, StoreError>> {
        Box::pin(self.stats())
    }
}
