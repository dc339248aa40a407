//! What a run keeps of its calls for exactly-once (#44): the pause its
//! calls' idempotency keys are derived from, the keys given, and (after a
//! crash) its decided pause's execution journal. The behaviour is in
//! `exactly_once.rs`; this file only holds the state `RunContext` owns.

use std::sync::Arc;

use crate::store::CallEntry;

/// What a run keeps for its calls' keys, and (restored after a crash) the
/// journal of its decided pause not yet gone on from.
#[derive(Debug, Default)]
pub(super) struct Calls {
    /// The pause whose tasks the run's calls are: the latest plan asked
    /// (a run that asked none: an id of its own).
    pub(super) anchor: Option<Arc<str>>,
    /// The anchor is a pause a durable store keeps: only then are calls
    /// journaled (a run that never paused has nothing to go on from).
    pub(super) anchor_stored: bool,
    /// The keys given so far: a run never gives two calls one key.
    pub(super) given: Vec<String>,
    /// Restored after a crash: the journal of the decided pause.
    pub(super) journal: Vec<CallEntry>,
}

/// The most keys a run remembers (far past what a run calls: its rounds'
/// tasks and its unconfirmed calls).
pub(super) const KEYS_KEPT: usize = 4096;
