//! Parked pauses (#46): a paused run that no client holds leaves memory,
//! and its durable store is what keeps it, finds it and wakes it.
//!
//! [`ParkStore`](super::ParkStore) is the port: keeping a parked run's log with its record,
//! finding a session's parked run (a reply, a re-attach), the parked pauses
//! whose expiry or timer came due (one ordered index, taken in bounded
//! batches), and how many are parked. `sqlite:` implements all of it;
//! `redis://` parks by handing the run back (its session owned by nobody:
//! any replica takes it over, and the replicas' sweep already finds its
//! expiry and timers); `memory` never parks.

/// A parked run's log as it was when it left memory: every frame a
/// re-attach replays, the sequence the next chunk gets, and the sequence
/// of its pause's request among them; or, `as_stored`, nothing: the
/// record saved at the pause holds that log already (nothing was written
/// or let go since), and a park only marks it parked.
#[derive(Debug, Clone, PartialEq)]
pub struct ParkedLog {
    pub frames: Vec<String>,
    pub next_seq: u64,
    pub request_seq: Option<u64>,
    pub as_stored: bool,
}

impl ParkedLog {
    /// The log the record saved at the pause holds.
    pub fn as_stored() -> ParkedLog {
        ParkedLog {
            frames: Vec::new(),
            next_seq: 0,
            request_seq: None,
            as_stored: true,
        }
    }
}

/// Where a look at the parked pauses that came due goes on: after the
/// last row the look before it read of each of the two ordered indexes
/// (expiry, next timer), as `(due_ms, row)`; `Default` is from the start.
/// A sweep reads its next batch while it wakes the last one, and a batch
/// it cannot wake (records it cannot read, runs held) is not read again
/// until the next pass.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DueFrom {
    pub expiry: Option<(i64, i64)>,
    pub timer: Option<(i64, i64)>,
}

/// One look at the parked pauses that came due (`R`: a paused record).
#[derive(Debug)]
pub struct DueBatch<R> {
    /// Their records, soonest due first, each once.
    pub records: Vec<R>,
    /// Where the next look goes on, when an index may hold more due rows
    /// (one of them gave as many as it was asked for); `None`: this pass
    /// has read every pause that was due.
    pub more: Option<DueFrom>,
}

impl<R> Default for DueBatch<R> {
    fn default() -> Self {
        DueBatch {
            records: Vec::new(),
            more: None,
        }
    }
}
