//! Parking (#46): a paused run that no client holds leaves memory once it
//! has been detached for `--park-after`; what the durable store keeps of it
//! is all a wake needs (see `run/park.rs`).
//!
//! The log decides, under its own lock, between the two things that race:
//! parking (the run is told to stop, its pause kept in the store) and a
//! request that is about to act on the run (a reply, a re-attach, a
//! link). A request that comes by first is a *visit*: parking waits for
//! the next quiet `--park-after`. A request that comes by once parking
//! has begun waits until the run is suspended, then wakes it from the
//! store. Nothing decides a run that is halfway gone.

use super::Replay;
use crate::protocol::CancelReason;
use crate::store::ParkedLog;

/// What a request that comes by a run's log finds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visit {
    /// The run is here, and stays until the request is done with it
    /// (parking waits for the next quiet spell).
    Held,
    /// The run is being parked: wait for [`Replay::until_parked`], then
    /// wake it from the store.
    Parking,
}

/// What one try at parking did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParkTry {
    /// The run was told to stop; its pause stays in the store.
    Parked,
    /// Not now (it works, its pause is not stored whole, or a request came
    /// by): try again later.
    NotYet,
    /// Never for this detach: a client attached since, or the run ended.
    Gone,
}

impl Replay {
    /// The run's pause is kept whole in a durable store (its engine can go
    /// on from the record): once no client holds it, it may be parked.
    /// Until the pause ends. `stored`: the first and the next sequence of
    /// the frames its record holds, if they are known.
    pub fn pause_parkable(&self, stored: Option<(u64, u64)>) {
        let mut inner = self.lock();
        inner.park.parkable = true;
        inner.park.stored = stored;
    }

    /// A request is about to act on this run (see [`Visit`]).
    pub fn visit(&self) -> Visit {
        let mut inner = self.lock();
        if inner.park.parking && !inner.finished {
            return Visit::Parking;
        }
        inner.park.visits += 1;
        Visit::Held
    }

    /// Whether parking has begun: the run's stop is a park, not a shutdown.
    pub fn is_parking(&self) -> bool {
        self.lock().park.parking
    }

    /// How many requests came by so far.
    pub fn visits(&self) -> u64 {
        self.lock().park.visits
    }

    /// Parks the run if nobody attached since the detach of `detached_as`
    /// (`None`: a run restored or woken that nobody attached to yet), it
    /// waits on a pause kept whole, and no request came by since `seen`
    /// (which is moved on when one did); and only when there is `room`
    /// (`--max-parked`).
    pub fn try_park(&self, detached_as: Option<u64>, seen: &mut u64, room: bool) -> ParkTry {
        let mut inner = self.lock();
        let next = detached_as.map_or(0, |id| id + 1);
        if inner.subscriber.is_some() || inner.next_subscriber_id != next {
            return ParkTry::Gone;
        }
        if inner.finished || inner.suspended || inner.park.parking {
            return ParkTry::Gone;
        }
        if !(room && inner.paused && inner.park.parkable) {
            return ParkTry::NotYet;
        }
        if inner.park.visits != *seen {
            *seen = inner.park.visits;
            return ParkTry::NotYet;
        }
        inner.park.parking = true;
        drop(inner);
        // The pause sees a shutdown's stop: a stored pause is suspended,
        // not cancelled (`RunContext::settled`).
        self.stop.stop(CancelReason::Shutdown);
        ParkTry::Parked
    }

    /// Resolves once the run is suspended (parked) or has ended.
    pub async fn until_parked(&self) {
        self.until(|inner| inner.suspended || inner.finished).await;
    }

    /// Resolves once the run is suspended (parked, or by a shutdown).
    pub async fn until_suspended(&self) {
        self.until(|inner| inner.suspended).await;
    }

    async fn until(&self, done: impl Fn(&super::ReplayInner) -> bool) {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Interest first, then the look: a change in between is not missed.
            changed.as_mut().enable();
            if done(&self.lock()) {
                return;
            }
            changed.await;
        }
    }

    /// What a parked run's record keeps of its log: all of it.
    /// Nothing (`as_stored`) while it holds just what the record does.
    pub fn parked(&self) -> ParkedLog {
        {
            let inner = self.lock();
            let first = inner.next_seq - inner.frames.len() as u64;
            if inner.park.stored == Some((first, inner.next_seq)) {
                return ParkedLog::as_stored();
            }
        }
        let (frames, next_seq) = self.snapshot();
        let request_seq = self.lock().request.as_ref().map(|(seq, _)| *seq);
        ParkedLog {
            frames,
            next_seq,
            request_seq,
            as_stored: false,
        }
    }

    /// A woken run's log, restored from the whole log its record kept: its
    /// ids are its own, as if it had never left memory (no restore's gap
    /// rules), and its pause's request is the frame `request_seq`.
    pub fn woken(&self, request_seq: u64, confirmation_id: &str) {
        let mut inner = self.lock();
        inner.restored = None;
        inner.request = Some((request_seq, confirmation_id.into()));
    }
}
