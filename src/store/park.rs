//! Parked pauses (#46): a paused run that no client holds leaves memory,
//! and its durable store is what keeps it, finds it and wakes it.
//!
//! [`ParkStore`] is the port: keeping a parked run's log with its record,
//! finding a session's parked run (a reply, a re-attach), the parked pauses
//! whose expiry or timer came due (one ordered index, taken in bounded
//! batches), and how many are parked. `sqlite:` implements all of it;
//! `redis://` parks by handing the run back (its session owned by nobody:
//! any replica takes it over, and the replicas' sweep already finds its
//! expiry and timers); `memory` never parks.

use futures_util::future::BoxFuture;

use super::{Located, PausedRecord, StoreError};
use crate::session::SessionKey;

/// A parked run's log as it was when it left memory: every frame a
/// re-attach replays, the sequence the next chunk gets, and the sequence
/// of its pause's request among them.
#[derive(Debug, Clone, PartialEq)]
pub struct ParkedLog {
    pub frames: Vec<String>,
    pub next_seq: u64,
    pub request_seq: Option<u64>,
}

/// Parked pauses: the store is all that keeps them.
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

    /// At most `limit` parked pauses whose expiry or next timer is due at
    /// `now_ms`, soonest first: their namespace and session.
    fn parked_due(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<Located>, StoreError>> {
        let _ = (now_ms, limit);
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
