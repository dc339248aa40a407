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
