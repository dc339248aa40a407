//! Where paused runs are kept so that they outlive their process.
//!
//! `--store URL`: `memory` (the default: nothing outlives the process, as
//! before), `sqlite:PATH` (one node: paused runs survive a restart or a
//! `kill -9`) or `redis://HOST:PORT/DB` (replicas: any of them takes any
//! reply; see [`crate::cluster`]). Each backend in its own file serves four
//! ports: [`Store`] (paused runs: save, decide, end, restore, list), and the
//! three it builds on, [`GrantStore`] (grants), [`OutboxStore`] (webhook
//! events) and [`OutcomeStore`] (kept outcomes); a `dyn Store` is all four.
//!
//! What is stored is a [`PausedRecord`] per paused run: its session (within
//! its API key's namespace), the engine's state to resume it, the pending
//! confirmation (id, round, options, tasks, expiry), and the frames a
//! re-attach must replay with the next sequence number. It is written before
//! the `confirmation_request` chunk is sent. When the run ends, the record
//! keeps only its end ([`RunEnd`]: the last frames, the final chunk among
//! them) for `--detach-grace`, then goes: a client that had not read the
//! end when its server stopped (a restart, a `kill -9`, a replica gone)
//! still reads it from whoever restores the record within the grace. A
//! decision is recorded before the run acts on it
//! ([`Store::record_decision`]), so a decision answered 200 survives a crash
//! that follows: the run is then not run again but ends `interrupted` (or,
//! for a cancel, `cancelled` with its reason). Every decision that ends a
//! stored pause is recorded, a new message's supersede and a replica's own
//! timeout included, so an ended pause never comes back.
//!
//! A store command whose outcome is unknown (a timeout after it was sent)
//! is [`Fault::Unknown`]: recording a decision carries a nonce, so that
//! [`Store::resolve`] can learn afterwards whether it was recorded, and make
//! sure it never will be if it was not.

pub mod compact;
pub mod decision;
pub mod execution;
pub mod grant;
pub mod memory;
pub mod outbox;
pub mod park;
pub mod progress;
mod record_read;
pub mod redis;
pub mod schedule;
pub mod sqlite;

use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{Action, Ask, Chunk, Via};
use crate::session::SessionKey;
pub use decision::{Resolution, StoredDecision};
pub use execution::{CallEntry, RanNote};
pub use grant::{Grant, GrantScope};
pub use outbox::{OutboxEvent, OutboxStats, QueuedEvent, EVENT_LEASE};
pub use park::{DueBatch, DueFrom, ParkedLog};
pub use progress::{CarriedReject, DecidedTask, Escalated, PauseProgress, TaskApprovals};

/// Where a stored pause is: its namespace (`None` without keys) and its
/// session id.
pub type Located = (Option<String>, String);

/// A paused run as stored (read through
/// [`crate::protocol::record::RecordFields`], see there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "crate::protocol::record::RecordFields<RunEnd>")]
pub struct PausedRecord {
    /// The run's id, unique across restarts.
    pub run: String,
    /// The API key's namespace (see [`crate::session::Namespaces`]); `None` without keys.
    pub namespace: Option<String>,
    pub session_id: String,
    /// The engine's name and its state at the pause (see
    /// [`crate::run::Engine::resume`]).
    pub engine: String,
    pub state: Value,
    pub message: String,
    pub confirmation_id: String,
    pub round: u32,
    pub options: Vec<Action>,
    /// What the pause asked: a plan's tasks, or questions (records of
    /// older versions: approvals).
    #[serde(flatten)]
    pub asked: Ask,
    /// When the pause times out, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
    /// When it was asked (0 in records of older versions).
    #[serde(default)]
    pub asked_at_ms: u64,
    /// The frames a re-attach replays (the last ones kept), and the
    /// sequence number of the next chunk.
    pub frames: Vec<String>,
    pub next_seq: u64,
    /// The decision, once one was taken (`None` while the pause waits).
    pub decision: Option<Value>,
    /// Once the run ended: its end, kept for the grace (see [`Store::end`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<RunEnd>,
    /// The pause's state lives in its process's memory only (an MCP
    /// server's question, the openai engine's missing value: `state` is
    /// null). It is kept so that every replica lists it, finds it by its
    /// id and forwards to its owner (see [`Store::indexes_every_pause`]);
    /// a replica that takes it over, or a restart, ends it `interrupted`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub in_memory: bool,
    /// When its first timer (a reminder, an escalation) is due (ms since
    /// the Unix epoch), if it has one: a store replicas share indexes it,
    /// so that a timer of a pause whose owner died fires on another
    /// replica (see `run/expiry.rs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timer_due_ms: Option<u64>,
    /// Parked (#46): `frames` are its whole log as it was, and this is the
    /// sequence of its pause's request among them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_seq: Option<u64>,
    /// What happened to its pause while it waited (approvals, reminder,
    /// escalation), kept apart from the record by
    /// [`Store::record_progress`] and joined to it on load.
    #[serde(skip)]
    pub progress: Option<PauseProgress>,
    /// The execution journal of its pause (see [`execution`]): the calls
    /// its decision let run, as far as they got. Kept apart from the
    /// record and joined to it on load.
    #[serde(skip)]
    pub calls: Vec<CallEntry>,
}

impl PausedRecord {
    /// The frame of its pause's request: the last one, or the one
    /// `request_seq` names in a parked run's whole log.
    pub fn request_frame(&self) -> Option<&String> {
        let Some(seq) = self.request_seq else {
            return self.frames.last();
        };
        let first = self.next_seq.checked_sub(self.frames.len() as u64)?;
        self.frames
            .get(usize::try_from(seq.checked_sub(first)?).ok()?)
    }

    /// Whether its pause may have an execution journal: it was decided,
    /// or some of its tasks started while it waited (`decide`), and the
    /// run has not ended.
    pub fn may_have_calls(&self) -> bool {
        self.ended.is_none()
            && (self.decision.is_some()
                || self
                    .progress
                    .as_ref()
                    .is_some_and(|p| !p.started.is_empty()))
    }

    /// What a store keeps of an ended run's record beside its [`RunEnd`]:
    /// who the run was (its id, namespace, session, last pause), not what it
    /// paused on (frames, engine state, tasks, message), so that an ended
    /// run costs a small constant for its grace.
    pub fn ended_form(
        run: &str,
        namespace: Option<String>,
        session_id: &str,
        end: &RunEnd,
    ) -> PausedRecord {
        PausedRecord {
            run: run.to_owned(),
            namespace,
            session_id: session_id.to_owned(),
            engine: String::new(),
            state: Value::Null,
            message: String::new(),
            confirmation_id: end
                .pauses
                .last()
                .map(|pause| pause.confirmation_id.clone())
                .unwrap_or_default(),
            round: 0,
            options: Vec::new(),
            asked: Ask::default(),
            expires_at_ms: 0,
            asked_at_ms: 0,
            frames: Vec::new(),
            next_seq: end.next_seq,
            decision: None,
            ended: None,
            in_memory: false,
            timer_due_ms: None,
            request_seq: None,
            progress: None,
            calls: Vec::new(),
        }
    }
}

/// An ended run as its record keeps it for the grace: the frames a
/// re-attach replays (the final chunk alone: a small constant per ended
/// run, whatever the run sent), and the sequence number past it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunEnd {
    pub frames: Vec<String>,
    pub next_seq: u64,
    /// The run's last pauses (see [`PauseNote`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pauses: Vec<PauseNote>,
}

/// One of a run's pauses as its log (and its end) keeps it: its id, and
/// once a reply decided it, what and who. A retry of that reply is told
/// what was decided; an approver finds the run by the id.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PauseNote {
    pub confirmation_id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decided: Option<DecidedBy>,
}

/// A run's outcome, kept after its end for `--keep-outcome` (an agent
/// that comes back later reads how its run ended): small by design, at
/// most a few KiB. One per session, the latest run's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    pub session_id: String,
    /// The final chunk as it was sent, its text cut to
    /// [`MAX_OUTCOME_TEXT`] bytes.
    pub final_chunk: Chunk,
    /// When the run ended (ms since the Unix epoch).
    pub ended_at_ms: u64,
    /// Its last pauses, and who decided them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pauses: Vec<PauseNote>,
    /// What ran (or was skipped), task by task.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ran: Vec<RanNote>,
}

/// An outcome to keep, where and for how long (`--keep-outcome`).
#[derive(Debug, Clone)]
pub struct KeptOutcome {
    /// The API key's namespace, as stored.
    pub namespace: Option<String>,
    pub outcome: Outcome,
    pub keep: Duration,
}

/// Bytes of a kept outcome's final chunk text (the rest is cut).
pub const MAX_OUTCOME_TEXT: usize = 2 * 1024;

/// What a reply decided, and who.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecidedBy {
    pub action: Action,
    /// The key's label (`key-1`, `approver-2`, `anonymous`).
    pub by: String,
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// A quorum's confirm: every label that approved, in order (empty for
    /// a decision of one person).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub approved_by: Vec<String>,
    /// The door the decision came through (none kept: the chat endpoint).
    #[serde(default, skip_serializing_if = "Via::is_chat")]
    pub via: Via,
}

/// The store could not be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the store ({store}) failed: {reason}")]
pub struct StoreError {
    pub store: String,
    pub reason: String,
    pub fault: Fault,
}

impl StoredDecision {
    /// A stored run's decision, if its record has a readable one.
    pub fn of(record: &PausedRecord) -> Option<StoredDecision> {
        record
            .decision
            .as_ref()
            .and_then(|value| serde_json::from_value(value.clone()).ok())
    }
}

impl StoreError {
    /// The same failure, counted as `fault`.
    pub fn with_fault(mut self, fault: Fault) -> StoreError {
        self.fault = fault;
        self
    }
}

/// What went wrong with a store, for what the run does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// It could not be used (out of reach, a failing disk) and did nothing:
    /// try again.
    Unreachable,
    /// The command was sent and no answer came in time: it may have been
    /// carried out, now or later. A decision's is learnt with
    /// [`Store::resolve`].
    Unknown,
    /// Another replica owns the run now (this one's heartbeat had lapsed):
    /// the copy here must not act; its client re-attaches to the owner.
    Moved,
    /// The run's record is gone (a Redis that restarted without its data,
    /// or a new run on the session elsewhere while this replica passed for
    /// dead): the run cannot be decided any more, here or anywhere.
    Lost,
}

/// Paused runs' records. Cheap to share behind an `Arc`.
pub trait Store:
    GrantStore + OutboxStore + OutcomeStore + ExecutionStore + ParkStore + Send + Sync + std::fmt::Debug
{
    /// Whether records outlive the process (everything but `memory`).
    fn is_durable(&self) -> bool;

    /// Whether every pause is kept, one whose state lives only in memory
    /// included ([`PausedRecord::in_memory`]): a store replicas share,
    /// whose inbox and pause index are the cluster's.
    fn indexes_every_pause(&self) -> bool {
        false
    }

    /// Inserts or replaces the record of a paused run, and queues `events`
    /// (its webhook events) with it: both or neither.
    fn save<'a>(
        &'a self,
        record: PausedRecord,
        events: &'a [OutboxEvent],
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Records the decision of run `run`'s pause (of session `key`), before
    /// the run acts on it. Recording the same nonce again is not an error:
    /// it is one decision. `events` are queued with it: both or neither.
    fn record_decision<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        decision: &'a StoredDecision,
        events: &'a [OutboxEvent],
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// After [`Fault::Unknown`]: whether the decision of `nonce` was
    /// recorded; if it was not, it never will be.
    fn resolve<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        nonce: &'a str,
    ) -> BoxFuture<'a, Result<Resolution, StoreError>>;

    /// Run `run` of session `key` ended: its record keeps only `end` for
    /// the store's grace (`--detach-grace`), then goes; with no grace it
    /// goes at once. A restore within the grace shows the end as it was.
    /// `events` are queued with it, and its `outcome` kept
    /// (`--keep-outcome`, see [`OutcomeStore::keep_outcome`]): all or
    /// nothing, in one write where the store can.
    fn end<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        end: &'a RunEnd,
        events: &'a [OutboxEvent],
        outcome: Option<&'a KeptOutcome>,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Forgets run `run` of session `key` at once (a record no client can
    /// reach any more).
    fn remove(&self, run: &str, key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Run `run` was suspended by a shutdown: its record stays, for the
    /// next process (or another replica) to restore.
    fn suspend(&self, _run: &str, _key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    /// Where the stored pause `confirmation_id` is, across the cluster: its
    /// namespace and session id (an approver's reply names only the pause),
    /// undecided, or decided while its run's record lasts. A store of one
    /// process finds none (its registry and logs do).
    fn locate<'a>(
        &'a self,
        confirmation_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Located>, StoreError>> {
        let _ = confirmation_id;
        Box::pin(async { Ok(None) })
    }

    /// Every record, to restore at start.
    fn load(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>>;

    /// The records of the pauses of `namespace` nobody has decided yet,
    /// across the cluster (the inbox with replicas), oldest expiry first:
    /// at most `limit`, those after the pause `after` when it is still
    /// pending. A store of one process lists none: its pauses are all in
    /// the process's registry.
    fn pending<'a>(
        &'a self,
        namespace: Option<&'a str>,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<PausedRecord>, StoreError>> {
        let _ = (namespace, after, limit);
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Keeps a step of the progress of run `run`'s pause (see
    /// [`PauseProgress`]), before it is announced, so that a restart or a
    /// takeover keeps it. Only the run's owner writes it, while the pause
    /// waits. A store that restores no run keeps none.
    fn record_progress<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        step: &'a PauseProgress,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = (run, key, step);
        Box::pin(async { Ok(()) })
    }

    /// `Err(name)` while the store cannot be used, for `/readyz`.
    fn health(&self) -> Result<(), String> {
        Ok(())
    }
}

/// Grants (see `crate::store::grant`), the same for every replica at once.
pub trait GrantStore: Send + Sync {
    /// Keeps `grant`, unless its namespace holds
    /// [`grant::MAX_GRANTS_PER_NAMESPACE`] live grants already (`false`).
    fn add_grant<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<bool, StoreError>>;

    /// The live grants of `namespace` (`None`: every namespace), newest
    /// first.
    fn grants<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>>;

    /// Uses one call of grant `id`, atomically for every replica: the calls
    /// left after it, or `None` when it is gone, expired or spent.
    fn take_grant_call<'a>(&'a self, id: &'a str)
        -> BoxFuture<'a, Result<Option<u32>, StoreError>>;

    /// Removes grant `id` for every replica at once: what it was, if it
    /// was there.
    fn revoke_grant<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Grant>, StoreError>>;
}

/// The webhook events' outbox: queued with the records that cause them,
/// taken, settled.
pub trait OutboxStore: Send + Sync {
    /// Queues webhook events that no record write carries.
    fn announce<'a>(&'a self, events: &'a [OutboxEvent]) -> BoxFuture<'a, Result<(), StoreError>>;

    /// Takes the undelivered events to send now: at most `limit`, oldest
    /// first, each the oldest of its URL and session (the next of a session
    /// waits for it), due at `now_ms` (its last failure's retry time
    /// passed) and not taken in the last [`EVENT_LEASE`] by anyone (this
    /// process or, with replicas, another): what is taken is the taker's to
    /// send and settle. A taker that dies leaves its events to be taken
    /// again when the lease ends (at least once).
    fn due_events(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<QueuedEvent>, StoreError>>;

    /// Events were sent: each `(seq, retry_at_ms)` delivered (or given
    /// up) goes (`None`); failed, it is tried again at `retry_at_ms`. In
    /// one write where the store can.
    fn settle_events(
        &self,
        settled: Vec<(i64, Option<u64>)>,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Writes what [`OutboxStore::settle_events`] noted and has not written yet
    /// (at shutdown: nothing delivered is sent again by the next process).
    fn flush_outbox(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    /// How full the outbox is.
    fn outbox_stats(&self) -> BoxFuture<'_, Result<OutboxStats, StoreError>>;
}

/// Each session's latest run's outcome, kept for `--keep-outcome`.
/// Where the execution journal is kept ([`execution`]): every durable
/// store; the memory store keeps none (the defaults).
pub trait ExecutionStore: Send + Sync {
    /// Keeps `entry` (replacing the one before of its pause and index) for
    /// the run `run` of `key`; answered once it is durable.
    fn journal_call<'a>(
        &'a self,
        _run: &'a str,
        _key: &'a SessionKey,
        _entry: &'a CallEntry,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    /// Lists `Some(record)`, a pause of the run `run` of `key` that is not
    /// its record (a reconcile: the record keeps the decided plan), where
    /// every replica finds it; `None` drops it. Only a store replicas
    /// share lists (elsewhere the process's registry does).
    fn list_aside<'a>(
        &'a self,
        _run: &'a str,
        _key: &'a SessionKey,
        _record: Option<&'a PausedRecord>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
}

pub trait OutcomeStore: Send + Sync {
    /// Keeps `outcome`, the latest run's of session `session_id` in
    /// `namespace` (its stored name), for `keep` (replacing the one before).
    fn keep_outcome<'a>(
        &'a self,
        namespace: Option<&'a str>,
        outcome: &'a Outcome,
        keep: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The kept outcome of session `session_id` in `namespace`, if its time
    /// is not over.
    fn outcome<'a>(
        &'a self,
        namespace: Option<&'a str>,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Outcome>, StoreError>>;
}

/// Parked pauses (see [`park`]): the store is all that keeps them.
pub trait ParkStore: Send + Sync {
    /// Run `run`'s pause, still waiting, leaves memory: its record keeps
    /// `log`, and it is found again by [`ParkStore::parked_run`] and, once
    /// its expiry or next timer is due, by [`ParkStore::parked_due`].
    fn park<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        log: &'a ParkedLog,
    ) -> BoxFuture<'a, Result<(), StoreError>>;

    /// The undecided paused run of session `session_id` in `namespace`
    /// that no process holds (parked, or kept by a process that stopped).
    fn parked_run<'a>(
        &'a self,
        namespace: Option<&'a str>,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<PausedRecord>, StoreError>> {
        let _ = (namespace, session_id);
        Box::pin(async { Ok(None) })
    }

    /// Run `run` was woken: no longer parked (not awaited by the wake: a
    /// decision, which follows, unparks it too).
    fn unpark<'a>(&'a self, run: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let _ = run;
        Box::pin(async { Ok(()) })
    }

    /// The parked pauses whose expiry or next timer is due at `now_ms`,
    /// from `from` on in each of the two orders (at most `limit` of each),
    /// soonest first: their records, read together (a record this version
    /// cannot read is left out).
    fn parked_due(
        &self,
        now_ms: u64,
        from: DueFrom,
        limit: usize,
    ) -> BoxFuture<'_, Result<DueBatch<PausedRecord>, StoreError>> {
        let _ = (now_ms, from, limit);
        Box::pin(async { Ok(DueBatch::default()) })
    }

    /// Where every parked pause is (its namespace and session), read once
    /// at a start.
    fn parked_sessions(&self) -> BoxFuture<'_, Result<Vec<Located>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    /// How many pauses are parked (`chatgate_parked_runs`).
    fn parked_count(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        Box::pin(async { Ok(0) })
    }

    /// The records a start restores: every one but the parked pauses,
    /// which stay in the store until something wakes them.
    fn load_unparked(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>>;
}
