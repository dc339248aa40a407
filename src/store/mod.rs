//! Where paused runs are kept so that they outlive their process.
//!
//! `--store URL`: `memory` (the default: nothing outlives the process, as
//! before), `sqlite:PATH` (one node: paused runs survive a restart or a
//! `kill -9`) or `redis://HOST:PORT/DB` (replicas: any of them takes any
//! reply; see [`crate::cluster`]). One [`Store`] trait; each backend in its
//! own file.
//!
//! What is stored is a [`PausedRecord`] per paused run: its session (within
//! its API key's namespace), the engine's state to resume it, the pending
//! confirmation (id, round, options, tasks, expiry), and the frames a
//! re-attach must replay with the next sequence number. It is written before
//! the `confirmation_request` chunk is sent and removed when the run ends. A
//! decision is recorded before the run acts on it
//! ([`Store::record_decision`]), so a decision answered 200 survives a crash
//! that follows: the run is then not run again but ends `interrupted`.

pub mod memory;
pub mod redis;
pub mod sqlite;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::protocol::{Action, TaskSpec};
use crate::session::SessionKey;

/// A paused run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
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
    pub tasks: Vec<TaskSpec>,
    /// When the pause times out, in milliseconds since the Unix epoch.
    pub expires_at_ms: u64,
    /// The frames a re-attach replays (the last ones kept), and the
    /// sequence number of the next chunk.
    pub frames: Vec<String>,
    pub next_seq: u64,
    /// The decision, once one was taken (`None` while the pause waits).
    pub decision: Option<Value>,
}

/// The store could not be used.
#[derive(Debug, Clone, thiserror::Error)]
#[error("the store ({store}) failed: {reason}")]
pub struct StoreError {
    pub store: String,
    pub reason: String,
    pub fault: Fault,
}

/// What went wrong with a store, for what the run does next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// It could not be used (out of reach, a failing disk): try again.
    Unreachable,
    /// Another replica owns the run now (this one's heartbeat had lapsed):
    /// the copy here must not act; its client re-attaches to the owner.
    Moved,
    /// The run's record is gone (a Redis that restarted without its data,
    /// or a new run on the session elsewhere while this replica passed for
    /// dead): the run cannot be decided any more, here or anywhere.
    Lost,
}

/// Paused runs' records. Cheap to share behind an `Arc`.
pub trait Store: Send + Sync + std::fmt::Debug {
    /// Whether records outlive the process (everything but `memory`).
    fn is_durable(&self) -> bool;
    /// Inserts or replaces the record of a paused run.
    fn save(&self, record: PausedRecord) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Records the decision of run `run`'s pause, before the run acts on it.
    fn record_decision(&self, run: &str, decision: Value) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Forgets run `run` of session `key`: it ended.
    fn remove(&self, run: &str, key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>>;
    /// Run `run` was suspended by a shutdown: its record stays, for the
    /// next process (or another replica) to restore.
    fn suspend(&self, _run: &str, _key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }
    /// Every record, to restore at start.
    fn load(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>>;
    /// `Err(name)` while the store cannot be used, for `/readyz`.
    fn health(&self) -> Result<(), String> {
        Ok(())
    }
}
