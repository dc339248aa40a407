//! The client streams that read a run's log: one HTTP response body each.
//!
//! A [`Subscription`] sends the log's frames from its own cursor, with a
//! keep-alive comment after each idle interval, and marks the first frame
//! after a hole in the replay with `gap: true`.
//!
//! When a subscription ends before delivering the final chunk (the client
//! went away), the run is *detached*: it goes on, and a POST with
//! `Last-Event-ID` may re-attach within `--detach-grace`. After the grace the
//! run is stopped (`client_gone`) and its log forgotten, unless a client
//! attached since: each grace belongs to the detach that started it. A run
//! paused on an undecided pause is not stopped by a grace: it waits for its
//! decision (or its timeout), and its grace starts again when it goes on.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::Stream;
use tokio::time::Sleep;

use super::registry::ReplayRegistry;
use super::replay::park::ParkTry;
use super::replay::{BeyondEnd, Replay};
use crate::metrics::Metrics;
use crate::protocol::CancelReason;
use crate::session::SessionKey;
use crate::sse;

/// Default of `--keep-alive`: silence before a `: keep-alive` comment.
pub const KEEP_ALIVE: Duration = Duration::from_secs(15);
/// Default of `--detach-grace`: how long a run outlives its vanished client.
pub const DETACH_GRACE: Duration = Duration::from_secs(60);
/// Default of `--park-after`: how long a paused run nobody holds stays in
/// memory with a durable store.
pub const PARK_AFTER: Duration = Duration::from_secs(30);
/// The wait before parking is tried again while `--max-parked` are.
const PARK_FULL_AGAIN: Duration = Duration::from_secs(10);
/// Default of `--max-parked`: paused runs parked at once.
pub const MAX_PARKED: usize = 1_000_000;
/// The least wait before parking is tried again, after a try that found
/// the run at work or a request coming by (`--park-after 0s` included).
const PARK_AGAIN: Duration = Duration::from_secs(1);

/// Settings of a subscription.
#[derive(Clone)]
pub struct StreamSettings {
    pub keep_alive: Duration,
    pub detach_grace: Duration,
    /// `--park-after` with a durable store: how long a paused run nobody
    /// holds stays in memory (see `park_when_idle`); `None`: always.
    pub park_after: Option<Duration>,
    /// `--max-parked`: beyond it a paused run is not parked.
    pub max_parked: usize,
    pub metrics: Arc<Metrics>,
    pub registry: ReplayRegistry,
}

/// One client's view of a run: an HTTP response body.
pub struct Subscription {
    replay: Arc<Replay>,
    key: SessionKey,
    id: u64,
    /// The first chunk sent after a hole in the replay carries `gap: true`.
    announce_gap: bool,
    delivered_final: bool,
    idle: Pin<Box<Sleep>>,
    /// Set until the first chunk is written, for the time-to-first-chunk metric.
    opened: Option<Instant>,
    /// When this client attached (see [`Replay::waited_since`]).
    attached_at: Instant,
    /// Shared by every client stream of the server.
    settings: Arc<StreamSettings>,
    /// The last frame's chunk, typed, when the log kept it for this
    /// subscription (see [`Subscription::typed`]).
    chunk: Option<Box<crate::protocol::Chunk>>,
}

impl Subscription {
    /// The first client of a run: every chunk from the start.
    pub fn open(log: Arc<Replay>, key: SessionKey, settings: Arc<StreamSettings>) -> Subscription {
        let id = log.attach_locked(log.lock(), 0, 0);
        Subscription::new(log, key, id, settings)
    }

    /// Attaches to `log`, sending every chunk after `last_seen` (0: all).
    pub fn attach(
        log: Arc<Replay>,
        key: SessionKey,
        last_seen: u64,
        settings: Arc<StreamSettings>,
    ) -> Result<Subscription, BeyondEnd> {
        let (id, gap) = log.attach(last_seen)?;
        let mut subscription = Subscription::new(log, key, id, settings);
        subscription.announce_gap = gap;
        Ok(subscription)
    }

    fn new(
        replay: Arc<Replay>,
        key: SessionKey,
        id: u64,
        settings: Arc<StreamSettings>,
    ) -> Subscription {
        settings.metrics.open_streams.inc();
        Subscription {
            replay,
            key,
            id,
            announce_gap: false,
            delivered_final: false,
            idle: Box::pin(tokio::time::sleep(settings.keep_alive)),
            opened: Some(Instant::now()),
            attached_at: Instant::now(),
            settings,
            chunk: None,
        }
    }

    /// This subscription translates chunks (a face): from now on the log
    /// keeps each chunk it pushes, typed, until this subscription sends
    /// it, and [`Subscription::chunk`] gives it beside its frame.
    pub fn typed(self) -> Subscription {
        let mut inner = self.replay.lock();
        if let Some(me) = inner.subscriber.as_mut().filter(|s| s.id == self.id) {
            me.typed.get_or_insert_with(Default::default);
        }
        drop(inner);
        self
    }

    /// The chunk of the frame last sent, typed, when the log kept it (a
    /// typed subscription, a chunk pushed after it asked, sent as it
    /// was pushed: not renumbered, not after a gap); else parse the frame.
    pub fn chunk(&mut self) -> Option<Box<crate::protocol::Chunk>> {
        self.chunk.take()
    }

    fn next_frame(&mut self, cx: &Context<'_>) -> Poll<Option<Bytes>> {
        let log = self.replay.clone();
        let mut guard = log.lock();
        let inner = &mut *guard;
        let first = inner.first_retained();
        let next_seq = inner.next_seq;
        let finished = inner.finished;
        let Some(me) = inner.subscriber.as_mut().filter(|s| s.id == self.id) else {
            // Another client re-attached: this stream ends here.
            return Poll::Ready(None);
        };
        if me.cursor < first {
            me.cursor = first;
            self.announce_gap = true;
        }
        if me.cursor < next_seq {
            let index = (me.cursor - first) as usize;
            let sequence = me.cursor;
            me.cursor += 1;
            let typed = me.typed.as_mut().and_then(|typed| {
                while typed.front().is_some_and(|c| c.sequence < sequence) {
                    typed.pop_front();
                }
                typed
                    .front()
                    .is_some_and(|c| c.sequence == sequence)
                    .then(|| typed.pop_front())
                    .flatten()
            });
            let frame = inner.frames[index].clone();
            let last = finished && me.cursor == next_seq;
            let offset = me.offset;
            drop(guard);
            self.delivered_final |= last;
            self.chunk = typed.filter(|_| offset == 0 && !self.announce_gap);
            let frame = if offset == 0 {
                frame
            } else {
                sse::renumber(&frame, sequence + offset)
            };
            return Poll::Ready(Some(if std::mem::take(&mut self.announce_gap) {
                sse::with_gap(&frame)
            } else {
                frame
            }));
        }
        if finished {
            return Poll::Ready(None);
        }
        if inner.suspended {
            // A suspended run's stream ends with its trailer, once.
            return Poll::Ready(inner.trailer.take());
        }
        me.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// A run nobody has attached to yet (restored from a store at start) gets
/// the same grace as a client that left.
pub fn expire_unclaimed(log: Arc<Replay>, key: SessionKey, settings: Arc<StreamSettings>) {
    detached(log, key, &settings, None);
}

/// A run whose client went away (`detached_as`: that client's id; `None`:
/// a restored run nobody attached to yet) is re-attachable for the grace;
/// then, if nobody attached since, it is stopped (`client_gone`) and its log
/// forgotten. A paused run waits for its decision, not for its client: the
/// grace does not end it; it goes on to its end when decided, and its end
/// stays re-attachable for a grace after that. Each grace belongs to the
/// detach that started it: attach ids only grow, so "nobody attached since"
/// is "the next id is still ours + 1".
fn detached(
    log: Arc<Replay>,
    key: SessionKey,
    settings: &StreamSettings,
    detached_as: Option<u64>,
) {
    let registry = settings.registry.clone();
    let grace = settings.detach_grace;
    if let Some(after) = settings.park_after {
        let parking = park_when_idle(
            log.clone(),
            key.clone(),
            registry.clone(),
            (after, settings.max_parked),
            detached_as,
        );
        tokio::spawn(parking);
    }
    let claimed = move |log: &Replay| {
        let inner = log.lock();
        let next = detached_as.map_or(0, |id| id + 1);
        inner.subscriber.is_some() || inner.next_subscriber_id != next
    };
    if grace.is_zero() && !log.is_paused() {
        if !claimed(&log) {
            registry.forget(&key, &log);
            log.stop.stop(CancelReason::ClientGone);
        }
        return;
    }
    tokio::spawn(async move {
        tokio::select! {
            () = tokio::time::sleep(grace) => {}
            // Parked: it left memory, and nothing of it is kept here.
            () = log.until_suspended() => return,
        }
        if claimed(&log) {
            return;
        }
        if !log.is_paused() {
            registry.forget(&key, &log);
            log.stop.stop(CancelReason::ClientGone);
            return;
        }
        // Paused: it ends by its decision or its timeout; its end is then
        // kept for a grace, for its client to come back and read it. A
        // parked one left memory: nothing is kept here.
        log.until_parked().await;
        if log.is_suspended() {
            return;
        }
        tokio::time::sleep(grace).await;
        if !claimed(&log) {
            registry.forget(&key, &log);
        }
    });
}

/// Parks the run of `log` once it has waited `after` on a pause kept whole
/// with nobody attached and no request coming by (each one that does moves
/// the wait on), and forgets its log once it is parked: the store keeps
/// what a wake needs. Ends when a client attaches or the run ends.
async fn park_when_idle(
    log: Arc<Replay>,
    key: SessionKey,
    registry: ReplayRegistry,
    (after, max_parked): (Duration, usize),
    detached_as: Option<u64>,
) {
    let mut seen = log.visits();
    // A run restored or woken that nobody attached to stays a moment at
    // least: what woke it (a timer that came due) acts first.
    let mut wait = match detached_as {
        Some(_) => after,
        None => after.max(PARK_AGAIN),
    };
    loop {
        tokio::time::sleep(wait).await;
        // As many as `--max-parked` are: this one stays held for now (and
        // the loop still ends when a client attaches or the run ends).
        let room = registry.parked_count() < max_parked;
        match log.try_park(detached_as, &mut seen, room) {
            ParkTry::Gone => return,
            ParkTry::NotYet if !room => wait = after.max(PARK_FULL_AGAIN),
            ParkTry::NotYet => wait = after.max(PARK_AGAIN),
            ParkTry::Parked => {
                registry.note_parked(&key);
                log.until_parked().await;
                if log.is_suspended() {
                    // Its record written: noted again, so that a look at
                    // the store begun before reads it again (`park.rs`).
                    registry.note_parked(&key);
                    registry.forget(&key, &log);
                }
                return;
            }
        }
    }
}

impl Stream for Subscription {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.next_frame(cx) {
            Poll::Ready(Some(frame)) => {
                if let Some(opened) = this.opened.take() {
                    this.settings.metrics.first_chunk_after(opened.elapsed());
                }
                let deadline = tokio::time::Instant::now() + this.settings.keep_alive;
                this.idle.as_mut().reset(deadline);
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    let deadline = tokio::time::Instant::now() + this.settings.keep_alive;
                    this.idle.as_mut().reset(deadline);
                    Poll::Ready(Some(Ok(Bytes::from_static(sse::KEEP_ALIVE_COMMENT))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.settings.metrics.open_streams.dec();
        let mut inner = self.replay.lock();
        let was_attached = inner.subscriber.as_ref().is_some_and(|s| s.id == self.id);
        if was_attached {
            inner.subscriber = None;
        }
        drop(inner);
        if !was_attached {
            return; // Taken over by a re-attach; the run is someone else's now.
        }
        if self.delivered_final && !self.replay.waited_since(self.attached_at) {
            // The normal end: nothing left to re-attach to.
            self.settings.registry.forget(&self.key, &self.replay);
            return;
        }
        // The client went away early, or its run waited on a pause long
        // enough for it to have gone unnoticed (the final chunk was written
        // to a socket, which says nothing of a reader): its end is kept.
        detached(
            self.replay.clone(),
            self.key.clone(),
            &self.settings,
            Some(self.id),
        );
    }
}

#[cfg(test)]
mod tests;
