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

pub use memory::MemoryStore;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::confirmation::SessionKey;
use crate::protocol::{Action, TaskSpec};

/// A paused run as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PausedRecord {
    /// The run's id, unique across restarts.
    pub run: String,
    /// The API key's namespace (see [`Namespaces`]); `None` without keys.
    pub namespace: Option<String>,
    pub session_id: String,
    /// The engine's name and its state at the pause (see
    /// [`crate::engine::Engine::resume`]).
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

/// The stored names of the API keys' namespaces.
///
/// In memory a run's owner is its key's place in this process's list (see
/// [`SessionKey`]); that place changes when keys are added, removed or
/// reordered, between restarts or between replicas. What is stored names
/// the key instead: `k` and 32 hex digits of a SHA-256 of the key (the key
/// itself is never stored). So a stored run is only ever restored into its
/// own key's namespace, and one whose key is no longer configured is
/// reachable by nobody.
#[derive(Debug, Clone, Default)]
pub struct Namespaces {
    names: Arc<[String]>,
}

impl Namespaces {
    /// The namespaces of `keys`, in their order (the owners' indices).
    pub fn of_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Namespaces {
        use sha2::{Digest, Sha256};
        let names = keys
            .into_iter()
            .map(|key| {
                let digest = Sha256::new()
                    .chain_update(b"chatgate namespace\0")
                    .chain_update(key.as_bytes())
                    .finalize();
                let hex: String = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
                format!("k{hex}")
            })
            .collect();
        Namespaces { names }
    }

    /// The stored name of `owner`'s namespace (`None`: no keys). An owner
    /// this table does not know (no server makes one) gets a name no key's
    /// namespace has, never another key's or the keyless one.
    pub fn name(&self, owner: Option<u32>) -> Option<String> {
        owner.map(|i| {
            self.names
                .get(i as usize)
                .cloned()
                .unwrap_or_else(|| format!("unknown-{i}"))
        })
    }

    /// The owner a stored `namespace` belongs to in this process, or
    /// `None` when no client can reach it now (its key is not configured;
    /// or it was stored without keys and keys are required now, or the
    /// other way round).
    pub fn owner(&self, namespace: Option<&str>) -> Option<Option<u32>> {
        match namespace {
            None if self.names.is_empty() => Some(None),
            None => None,
            Some(name) => self
                .names
                .iter()
                .position(|n| n == name)
                .map(|i| Some(i as u32)),
        }
    }
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

/// Opens the store `url` names: `memory` or `sqlite:PATH` (`redis://` is
/// opened with its replica's settings by [`crate::cluster::Cluster::open`]).
pub fn open(url: &str) -> Result<Arc<dyn Store>, String> {
    if url == "memory" {
        return Ok(Arc::new(MemoryStore));
    }
    if let Some(path) = url.strip_prefix("sqlite:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err("--store sqlite:PATH needs a path".to_owned());
        }
        return sqlite::SqliteStore::open(std::path::Path::new(path))
            .map(|store| Arc::new(store) as Arc<dyn Store>)
            .map_err(|err| format!("--store {url}: {err}"));
    }
    Err(format!(
        "--store `{url}` is not a store: write memory, sqlite:PATH or redis://HOST:PORT/DB"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_names_its_key_whatever_the_keys_order() {
        let before = Namespaces::of_keys(["alpha-key", "beta-key"]);
        let after = Namespaces::of_keys(["gamma-key", "beta-key"]);

        let beta = before.name(Some(1)).unwrap();
        assert_eq!(after.name(Some(1)).as_deref(), Some(beta.as_str()));
        assert_eq!(after.owner(Some(&beta)), Some(Some(1)));
        // alpha-key was removed: its runs are nobody's, not gamma-key's.
        let alpha = before.name(Some(0)).unwrap();
        assert_eq!(after.owner(Some(&alpha)), None);
        assert_ne!(alpha, beta);
        assert!(beta.starts_with('k') && beta.len() == 33);
        assert!(!beta.contains("beta"), "the key is never stored");
    }

    #[test]
    fn keyless_runs_belong_to_a_server_without_keys_only() {
        let keyless = Namespaces::of_keys([]);
        let keyed = Namespaces::of_keys(["alpha-key"]);

        assert_eq!(keyless.name(None), None);
        assert_eq!(keyless.owner(None), Some(None));
        assert_eq!(keyed.owner(None), None);
        assert_eq!(keyless.owner(keyed.name(Some(0)).as_deref()), None);
        // An index no key has is never another namespace.
        assert_eq!(keyed.name(Some(7)).as_deref(), Some("unknown-7"));
    }
}
