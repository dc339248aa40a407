//! A run's output as a bounded replay buffer, and the registry that finds a
//! session's log for a re-attach.
//!
//! The run pushes chunks into its [`Replay`]; the log numbers them, encodes
//! them once, and keeps the last `--replay-buffer` frames, at most
//! `--replay-buffer-bytes` of them. At most one subscriber (the client
//! currently attached, see [`super::stream`]) reads it from its own cursor.
//! The run never waits for a client: if the attached client falls so far
//! behind that an unread frame would be evicted, the run is stopped with
//! `slow_consumer`, so buffering per stream is bounded by the log's limits.
//!
//! [`ReplayRegistry`](super::registry::ReplayRegistry) maps a session to its
//! latest log, so a re-attach can find a run that is live or finished
//! within its grace.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::Waker;

use tokio::sync::Notify;

use bytes::Bytes;

use super::stop::RunStop;
use crate::protocol::{CancelReason, Chunk, ChunkType};
use crate::sse;
use crate::store::{DecidedBy, PauseNote, RanNote, RunEnd};

/// Default of `--replay-buffer`: chunks kept per run for re-attach.
pub const REPLAY_BUFFER: usize = 1024;
/// Default of `--replay-buffer-bytes`: bytes of chunks kept per run.
pub const REPLAY_BUFFER_BYTES: usize = 1024 * 1024;

/// How much of a run's output its log keeps.
#[derive(Debug, Clone, Copy)]
pub struct ReplayLimits {
    /// Frames kept (`--replay-buffer`).
    pub frames: usize,
    /// Bytes of frames kept (`--replay-buffer-bytes`); the newest frame is
    /// always kept, whatever its size.
    pub bytes: usize,
}

/// The run's output could not be attached to after `last_seen`: no chunk
/// with that sequence number has been sent yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BeyondEnd {
    /// The last sequence number sent so far (0: none).
    pub last_sent: u64,
}

/// The output of one run.
pub struct Replay {
    inner: Mutex<ReplayInner>,
    limits: ReplayLimits,
    pub(super) stop: RunStop,
    /// Woken when the run's pause ends (see [`Replay::pause_ended`]), when
    /// its final chunk is pushed and when it is suspended.
    changed: Notify,
}

/// A pause at least this long makes a run's end re-attachable for the
/// grace whatever its stream wrote (see `Replay::waited_since`). Scripts that
/// answer at once do not pay for it; people do not answer this fast.
pub const LONG_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// A run's last pauses its log keeps notes of (see [`PauseNote`]): a run
/// may pause many times (each modify round, each model turn); the oldest
/// notes go first.
pub const MAX_PAUSE_NOTES: usize = 16;
/// A run's last calls its log keeps notes of, for its outcome.
pub const MAX_RAN_NOTES: usize = 128;

pub(super) struct ReplayInner {
    pub(super) frames: VecDeque<Bytes>,
    /// Bytes in `frames`.
    bytes: usize,
    /// The sequence number the next pushed chunk gets (sequences start at 1).
    pub(super) next_seq: u64,
    /// The final chunk has been pushed.
    pub(super) finished: bool,
    /// The run is paused on an undecided pause: a client that goes away
    /// then starts no grace (a pause waits for its decision, not for its
    /// connection).
    pub(super) paused: bool,
    /// When the current pause began (`None` when not paused).
    paused_since: Option<std::time::Instant>,
    /// When the last pause that lasted [`LONG_PAUSE`] or more ended: a
    /// client attached through it may have gone without the server
    /// noticing (see `Replay::waited_since`).
    long_pause_ended: Option<std::time::Instant>,
    /// The run was suspended (see [`Replay::suspend`]): after the last frame
    /// the stream gets `trailer`, then ends, with no final chunk.
    pub(super) suspended: bool,
    pub(super) trailer: Option<Bytes>,
    pub(super) subscriber: Option<Subscriber>,
    pub(super) next_subscriber_id: u64,
    /// Restored from a store: the process that wrote the stored frames may
    /// have sent more than it stored, so a client's `Last-Event-ID` may name
    /// chunks this log never had. See [`Replay::restore`].
    pub(super) restored: Option<Restored>,
    /// The run's last [`MAX_PAUSE_NOTES`] pauses, oldest first.
    pauses: VecDeque<PauseNote>,
    /// Its last [`MAX_RAN_NOTES`] calls (`tool_output` chunks), in order.
    ran: VecDeque<RanNote>,
    /// The sequence number and pause id of the last pause request pushed
    /// (or restored): the frame the inbox lists and an escalation amends,
    /// found by number, never by reading the frames back. Only a run's
    /// latest pause is ever looked up, so one tag per log, not per frame.
    request: Option<(u64, Box<str>)>,
    /// Whether its pause may leave memory, and who came by (`park.rs`).
    pub(super) park: Parking,
}

/// A paused run's parking (#46, see `park.rs`): its pause is kept whole in
/// a durable store (`parkable`), parking has begun (`parking`), and the
/// requests that came by since its client left (`visits`).
#[derive(Debug, Default)]
pub(super) struct Parking {
    pub(super) parkable: bool,
    /// The first and the next sequence of the frames the stored record
    /// holds, when known: while the log still spans exactly these, a park
    /// need not write it again.
    pub(super) stored: Option<(u64, u64)>,
    pub(super) parking: bool,
    pub(super) visits: u64,
}

/// How a restored log tells the ids it knows from the ones it cannot.
#[derive(Debug, Clone, Copy)]
pub(super) struct Restored {
    /// The sequence of the first chunk this process wrote.
    pub(super) first_own: u64,
    /// Ids at or past `first_own` are ambiguous: the run was at work when
    /// its process stopped, which may have sent chunks under them.
    pub(super) ambiguous: bool,
}

pub(super) struct Subscriber {
    pub(super) id: u64,
    /// The sequence number this subscriber sends next.
    pub(super) cursor: u64,
    /// Added to every id this subscriber is sent: a re-attach whose
    /// `Last-Event-ID` a restored log cannot place is sent the log from a
    /// known point, numbered on from that id.
    pub(super) offset: u64,
    pub(super) waker: Option<Waker>,
    /// For a subscriber that translates chunks (a face: AG-UI, A2A), the
    /// chunks pushed since it asked, typed, until it sends them: it reads
    /// them instead of parsing their frames back. At most the log's frame
    /// bound; nothing is kept for other subscribers.
    pub(super) typed: Option<VecDeque<Box<Chunk>>>,
}

impl ReplayInner {
    pub(super) fn first_retained(&self) -> u64 {
        self.next_seq - self.frames.len() as u64
    }
}

impl Replay {
    pub fn new(limits: ReplayLimits, stop: RunStop) -> Arc<Replay> {
        Arc::new(Replay {
            inner: Mutex::new(ReplayInner {
                frames: VecDeque::new(),
                bytes: 0,
                next_seq: 1,
                finished: false,
                paused: false,
                paused_since: None,
                long_pause_ended: None,
                suspended: false,
                trailer: None,
                subscriber: None,
                next_subscriber_id: 0,
                restored: None,
                pauses: VecDeque::new(),
                ran: VecDeque::new(),
                request: None,
                park: Parking::default(),
            }),
            limits: ReplayLimits {
                frames: limits.frames.max(1),
                bytes: limits.bytes,
            },
            stop,
            changed: Notify::new(),
        })
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, ReplayInner> {
        // Plain data; a panic elsewhere leaves it consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Numbers, encodes and appends `chunk`; wakes the attached client.
    /// Returns the sequence number given.
    pub fn push(&self, chunk: Chunk) -> u64 {
        self.push_framed(chunk, None)
    }

    /// [`Replay::push`], with `frame`, `chunk` encoded at a sequence number,
    /// used as it is when that is the number `chunk` gets (the frame a
    /// stored record has: encoded once).
    pub fn push_framed(&self, mut chunk: Chunk, frame: Option<(u64, Bytes)>) -> u64 {
        let mut inner = self.lock();
        let seq = inner.next_seq;
        chunk.sequence = seq;
        if chunk.chunk_type == ChunkType::ToolOutput {
            if inner.ran.len() == MAX_RAN_NOTES {
                inner.ran.pop_front();
            }
            inner.ran.push_back(RanNote::of(&chunk));
        }
        if let Some(pause) = &chunk.confirmation_data {
            inner.request = Some((seq, pause.confirmation_id().into()));
        }
        let frame = match frame {
            Some((numbered, frame)) if numbered == seq => frame,
            _ => sse::encode(&chunk),
        };
        inner.bytes += frame.len();
        inner.frames.push_back(frame);
        let finished = chunk.finished;
        let bound = self.limits.frames;
        if let Some(typed) = inner.subscriber.as_mut().and_then(|s| s.typed.as_mut()) {
            if typed.len() >= bound {
                typed.pop_front();
            }
            typed.push_back(Box::new(chunk));
        }
        inner.next_seq += 1;
        let mut overflowed = false;
        while inner.frames.len() > self.limits.frames
            || (inner.bytes > self.limits.bytes && inner.frames.len() > 1)
        {
            let evicted = inner.first_retained();
            if let Some(frame) = inner.frames.pop_front() {
                inner.bytes -= frame.len();
            }
            overflowed |= inner
                .subscriber
                .as_ref()
                .is_some_and(|s| s.cursor <= evicted);
        }
        // The typed chunks of frames no longer kept go with them.
        let first = inner.first_retained();
        if let Some(typed) = inner.subscriber.as_mut().and_then(|s| s.typed.as_mut()) {
            while typed.front().is_some_and(|c| c.sequence < first) {
                typed.pop_front();
            }
        }
        inner.finished |= finished;
        let waker = inner.subscriber.as_mut().and_then(|s| s.waker.take());
        drop(inner);
        if finished {
            self.changed.notify_waiters();
        }
        if overflowed {
            // The attached client could not keep up: stop rather than buffer more.
            self.stop.stop(CancelReason::SlowConsumer);
        }
        if let Some(waker) = waker {
            waker.wake();
        }
        seq
    }

    /// The frames kept, as text, and the next sequence number: what a store
    /// keeps so that a re-attach after a restart replays the same.
    pub fn snapshot(&self) -> (Vec<String>, u64) {
        let inner = self.lock();
        let frames = inner
            .frames
            .iter()
            .map(|frame| String::from_utf8_lossy(frame).into_owned())
            .collect();
        (frames, inner.next_seq)
    }

    /// A log restored from a store: `frames` (the last ones kept) and the
    /// sequence number the next chunk gets. `at_work`: the run's decision
    /// was recorded and its process stopped while it acted on it, so that
    /// process may have sent chunks past the stored ones, under the ids this
    /// log gives its own; a re-attach naming such an id is sent this log's
    /// own chunks from the first, renumbered past it, with the gap announced.
    /// `pause`: the stored pause whose request is the last frame.
    pub fn restore(
        limits: ReplayLimits,
        stop: RunStop,
        frames: Vec<String>,
        next_seq: u64,
        at_work: bool,
        pause: Option<&str>,
    ) -> Arc<Replay> {
        let log = Replay::new(limits, stop);
        {
            let mut inner = log.lock();
            for frame in frames {
                inner.bytes += frame.len();
                inner.frames.push_back(Bytes::from(frame));
            }
            inner.next_seq = next_seq.max(inner.frames.len() as u64 + 1);
            if !inner.frames.is_empty() {
                inner.request = pause.map(|id| (inner.next_seq - 1, id.into()));
            }
            inner.restored = Some(Restored {
                first_own: inner.next_seq,
                ambiguous: at_work,
            });
        }
        log
    }

    /// The log of a run that had ended when its process stopped, restored
    /// from the end its store kept: its final chunk is among `end`'s frames.
    pub fn restore_ended(limits: ReplayLimits, stop: RunStop, end: RunEnd) -> Arc<Replay> {
        let log = Replay::restore(limits, stop, end.frames, end.next_seq, false, None);
        let mut inner = log.lock();
        inner.finished = true;
        inner.pauses = end.pauses.into();
        drop(inner);
        log
    }

    /// Notes the pause `confirmation_id` (asked now, or restored).
    pub fn note_pause(&self, confirmation_id: &str) {
        let mut inner = self.lock();
        if inner
            .pauses
            .back()
            .is_some_and(|last| last.confirmation_id == confirmation_id)
        {
            return;
        }
        if inner.pauses.len() == MAX_PAUSE_NOTES {
            inner.pauses.pop_front();
        }
        inner.pauses.push_back(PauseNote {
            confirmation_id: confirmation_id.to_owned(),
            decided: None,
        });
    }

    /// Notes that a reply decided the pause `confirmation_id` (once it is
    /// recorded and on its way to the run).
    pub fn note_decided(&self, confirmation_id: &str, decided: DecidedBy) {
        let mut inner = self.lock();
        let latest = inner
            .pauses
            .back()
            .is_some_and(|note| note.confirmation_id == confirmation_id);
        if let Some(note) = inner
            .pauses
            .iter_mut()
            .rev()
            .find(|note| note.confirmation_id == confirmation_id)
        {
            note.decided = Some(decided);
        }
        // Its wait is over from this instant, before the reply is answered:
        // a client that re-attaches once it has the answer did not sit
        // through it, however late the run gets to it (`waited_since`).
        if latest {
            end_pause(&mut inner);
            drop(inner);
            self.changed.notify_waiters();
        }
    }

    /// The decided pause `confirmation_id` names (`None`: the latest
    /// pause), with what decided it; `None` when it is not noted as
    /// decided by a reply.
    pub fn decided(&self, confirmation_id: Option<&str>) -> Option<PauseNote> {
        let inner = self.lock();
        let note = match confirmation_id {
            Some(id) => inner
                .pauses
                .iter()
                .rev()
                .find(|note| note.confirmation_id == id),
            None => inner.pauses.back(),
        };
        note.filter(|note| note.decided.is_some()).cloned()
    }

    /// The notes of the pauses this log's run asked (the last few).
    pub fn pause_notes(&self) -> Vec<PauseNote> {
        self.lock().pauses.iter().cloned().collect()
    }

    /// The ids of the pauses this log's run asked (the last few).
    pub fn pause_ids(&self) -> Vec<String> {
        self.lock()
            .pauses
            .iter()
            .map(|note| note.confirmation_id.clone())
            .collect()
    }

    /// Whether this log's run asked the pause `confirmation_id`.
    pub(super) fn names_pause(&self, confirmation_id: &str) -> bool {
        self.lock()
            .pauses
            .iter()
            .any(|note| note.confirmation_id == confirmation_id)
    }

    /// Ends the log without a final chunk: the run goes on in the next
    /// process. The client stream gets `trailer` (a `retry:` line), then
    /// closes, and its client re-attaches.
    pub fn suspend(&self, trailer: Bytes) {
        let mut inner = self.lock();
        inner.trailer = Some(trailer);
        inner.suspended = true;
        let waker = inner.subscriber.as_mut().and_then(|s| s.waker.take());
        drop(inner);
        self.changed.notify_waiters();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// A paused run's request (for the inbox): the newest frame that
    /// names `confirmation_id`, among the last few (a quorum's progress
    /// chunks follow the request).
    pub fn last_frame(&self, confirmation_id: &str) -> Option<Bytes> {
        request_frame(&mut self.lock(), confirmation_id).map(|frame| frame.clone())
    }

    /// Writes `field` (`"key":value`) into the metadata of the request of
    /// the pause `confirmation_id` as this log replays it (an escalation:
    /// a re-attached client's `confirmation_request` says
    /// `escalated_to`). Frames already sent are not touched.
    pub fn amend_request(&self, confirmation_id: &str, field: &[u8]) {
        let mut inner = self.lock();
        if let Some(frame) = request_frame(&mut inner, confirmation_id) {
            let amended = crate::sse::with_meta_first(frame, field);
            let grown = amended.len() - frame.len();
            *frame = amended;
            inner.bytes += grown;
        }
    }

    /// The run paused: until [`Replay::pause_ended`], a client that goes
    /// away starts no grace.
    pub fn pause_started(&self) {
        let mut inner = self.lock();
        inner.paused = true;
        inner.paused_since = Some(std::time::Instant::now());
    }

    /// The run's pause was decided (or the run stopped): a detached run's
    /// grace may run again.
    pub fn pause_ended(&self) {
        let mut inner = self.lock();
        end_pause(&mut inner);
        drop(inner);
        self.changed.notify_waiters();
    }

    /// Whether a client attached at `attached_at` sat through a pause of
    /// [`LONG_PAUSE`] or more. One that left during it is noticed only when
    /// a write to it fails, which the run's last chunks may not cause: its
    /// end is kept for a grace even when its stream wrote the final chunk
    /// (see [`crate::run::stream`]).
    pub(super) fn waited_since(&self, attached_at: std::time::Instant) -> bool {
        self.lock()
            .long_pause_ended
            .is_some_and(|ended| ended > attached_at)
    }

    /// Whether the run waits on an undecided pause.
    pub(super) fn is_paused(&self) -> bool {
        let inner = self.lock();
        inner.paused && !inner.finished
    }

    /// Whether the run was suspended (it goes on elsewhere or later).
    pub fn is_suspended(&self) -> bool {
        self.lock().suspended
    }

    /// True when no client is attached and the run has not delivered its end.
    pub fn is_detached(&self) -> bool {
        let inner = self.lock();
        inner.subscriber.is_none() && !inner.finished
    }

    /// Attaches a new subscriber that starts after `last_seen` (0: from the
    /// start). A previous subscriber is detached and its stream ends. A
    /// `last_seen` beyond the last chunk sent is refused and takes nothing
    /// over, unless the log was restored (see [`Replay::restore`]): then the
    /// subscriber is sent the log from the chunk it can be sure of (this
    /// process's first, or the last stored one: the pause), numbered on from
    /// `last_seen`, the gap announced. Returns the subscriber's id and
    /// whether a gap is to be announced.
    pub(super) fn attach(&self, last_seen: u64) -> Result<(u64, bool), BeyondEnd> {
        let inner = self.lock();
        let last_sent = inner.next_seq - 1;
        let unplaced = match inner.restored {
            Some(restored) if restored.ambiguous && last_seen >= restored.first_own => {
                Some(restored.first_own)
            }
            Some(restored) if last_seen > last_sent => Some(if last_sent >= restored.first_own {
                restored.first_own
            } else {
                last_sent.max(1)
            }),
            None if last_seen > last_sent => return Err(BeyondEnd { last_sent }),
            _ => None,
        };
        Ok(match unplaced {
            Some(from) => {
                let offset = last_seen + 1 - from;
                (self.attach_locked(inner, from - 1, offset), true)
            }
            None => (self.attach_locked(inner, last_seen, 0), false),
        })
    }

    pub(super) fn attach_locked(
        &self,
        mut inner: MutexGuard<'_, ReplayInner>,
        last_seen: u64,
        offset: u64,
    ) -> u64 {
        let id = inner.next_subscriber_id;
        inner.next_subscriber_id += 1;
        let previous = inner.subscriber.replace(Subscriber {
            id,
            cursor: last_seen + 1,
            offset,
            waker: None,
            typed: None,
        });
        drop(inner);
        if let Some(waker) = previous.and_then(|s| s.waker) {
            waker.wake();
        }
        id
    }
}

/// The request of the pause `confirmation_id`, if it is the log's latest
/// and still kept.
fn request_frame<'a>(inner: &'a mut ReplayInner, confirmation_id: &str) -> Option<&'a mut Bytes> {
    let (seq, id) = inner.request.as_ref()?;
    if **id != *confirmation_id {
        return None;
    }
    let index = seq.checked_sub(inner.first_retained())?;
    inner.frames.get_mut(usize::try_from(index).ok()?)
}

/// The run's pause is over (decided, or the run stopped): a pause of
/// [`LONG_PAUSE`] or more notes when it ended. Once per pause: the first
/// of its decision and the run's own wake-up counts.
fn end_pause(inner: &mut ReplayInner) {
    inner.paused = false;
    inner.park.parkable = false;
    if inner
        .paused_since
        .take()
        .is_some_and(|since| since.elapsed() >= LONG_PAUSE)
    {
        inner.long_pause_ended = Some(std::time::Instant::now());
    }
}

mod kept;
pub mod park;
#[cfg(test)]
mod tests;
