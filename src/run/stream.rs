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
/// The least wait before parking is tried again, after a try that found
/// the run at work or a request coming by (`--park-after 0s` included).
const PARK_AGAIN: Duration = Duration::from_secs(1);

/// Settings of a subscription.
#[derive(Clone)]
pub struct StreamSettings {
    pub keep_alive: Duration,
    pub detach_grace: Duration,
    /// `--park-after` with a durable store: how long a paused run nobody
    /// holds stays in memory (see [`park_when_idle`]); `None`: always.
    pub park_after: Option<Duration>,
    pub metrics: Arc<Metrics>,
    pub registry: ReplayRegistry,
}

/// One client's view of a run: an HTTP response body.
pub struct Subscription {
    log: Arc<Replay>,
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
        log: Arc<Replay>,
        key: SessionKey,
        id: u64,
        settings: Arc<StreamSettings>,
    ) -> Subscription {
        settings.metrics.open_streams.inc();
        Subscription {
            log,
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
        let mut inner = self.log.lock();
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
        let log = self.log.clone();
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
            after,
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
    after: Duration,
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
        match log.try_park(detached_as, &mut seen) {
            ParkTry::Gone => return,
            ParkTry::NotYet => wait = after.max(PARK_AGAIN),
            ParkTry::Parked => {
                log.until_parked().await;
                if log.is_suspended() {
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
        let mut inner = self.log.lock();
        let was_attached = inner.subscriber.as_ref().is_some_and(|s| s.id == self.id);
        if was_attached {
            inner.subscriber = None;
        }
        drop(inner);
        if !was_attached {
            return; // Taken over by a re-attach; the run is someone else's now.
        }
        if self.delivered_final && !self.log.waited_since(self.attached_at) {
            // The normal end: nothing left to re-attach to.
            self.settings.registry.forget(&self.key, &self.log);
            return;
        }
        // The client went away early, or its run waited on a pause long
        // enough for it to have gone unnoticed (the final chunk was written
        // to a socket, which says nothing of a reader): its end is kept.
        detached(
            self.log.clone(),
            self.key.clone(),
            &self.settings,
            Some(self.id),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::Chunk;
    use crate::protocol::ChunkType;
    use crate::run::replay::ReplayLimits;
    use crate::run::stop::RunStop;
    use futures_util::StreamExt;

    fn chunk(text: &str) -> Chunk {
        Chunk::new(ChunkType::Status, text, "s", 0)
    }

    fn settings(grace: Duration) -> Arc<StreamSettings> {
        Arc::new(StreamSettings {
            keep_alive: Duration::from_secs(3600),
            detach_grace: grace,
            park_after: None,
            metrics: Arc::new(Metrics::new()),
            registry: ReplayRegistry::default(),
        })
    }

    fn frames(frames: usize) -> ReplayLimits {
        ReplayLimits {
            frames,
            bytes: usize::MAX,
        }
    }

    fn key() -> SessionKey {
        SessionKey::new(None, "s")
    }

    async fn next_chunk(sub: &mut Subscription) -> Chunk {
        let frame = sub.next().await.unwrap().unwrap();
        let text = std::str::from_utf8(&frame).unwrap();
        let json = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
        serde_json::from_str(json).unwrap()
    }

    #[tokio::test]
    async fn a_typed_subscription_reads_the_chunks_pushed_after_it_asked_as_their_frames_say() {
        let log = Replay::new(frames(3), RunStop::default());
        log.push(chunk("before"));
        let mut sub = Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO))
            .unwrap()
            .typed();
        for text in ["a", "b"] {
            log.push(chunk(text));
        }
        // Pushed before it asked: only its frame.
        assert_eq!(next_chunk(&mut sub).await.chunk, "before");
        assert!(sub.chunk().is_none());
        for _ in 0..2 {
            let frame = next_chunk(&mut sub).await;
            assert_eq!(
                sub.chunk(),
                Some(Box::new(frame)),
                "the typed chunk is its frame's"
            );
            assert!(sub.chunk().is_none(), "given once");
        }
        // Unread, the kept chunks stay within the log's frame bound, and
        // those of frames gone with a gap are not given.
        for n in 0..10 {
            log.push(chunk(&n.to_string()));
        }
        let kept = log
            .lock()
            .subscriber
            .as_ref()
            .unwrap()
            .typed
            .as_ref()
            .unwrap()
            .len();
        assert!(kept <= 3, "{kept}");
        let after_gap = next_chunk(&mut sub).await;
        assert!(after_gap.metadata["gap"] == true && sub.chunk().is_none());
        let next = next_chunk(&mut sub).await;
        assert_eq!(sub.chunk(), Some(Box::new(next)));
        // Another subscriber's log keeps nothing typed.
        let plain = Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO));
        log.push(chunk("x"));
        assert!(log.lock().subscriber.as_ref().unwrap().typed.is_none());
        drop(plain);
    }

    #[tokio::test]
    async fn the_log_numbers_chunks_and_a_late_reader_gets_them_all() {
        let log = Replay::new(frames(8), RunStop::default());
        for text in ["a", "b"] {
            log.push(chunk(text));
        }
        let mut sub =
            Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO)).unwrap();

        assert_eq!(next_chunk(&mut sub).await.sequence, 1);
        log.push(chunk("c").finished());
        assert_eq!(next_chunk(&mut sub).await.chunk, "b");
        let last = next_chunk(&mut sub).await;
        assert_eq!((last.sequence, last.finished), (3, true));
        assert!(
            sub.next().await.is_none(),
            "the stream ends after the final chunk"
        );
    }

    #[tokio::test]
    async fn a_re_attach_replays_after_last_event_id_and_announces_a_gap() {
        let log = Replay::new(frames(2), RunStop::default());
        for text in ["1", "2", "3", "4"] {
            log.push(chunk(text));
        }

        let mut in_buffer =
            Subscription::attach(log.clone(), key(), 2, settings(Duration::from_secs(60))).unwrap();
        let first = next_chunk(&mut in_buffer).await;
        let mut with_hole =
            Subscription::attach(log.clone(), key(), 0, settings(Duration::from_secs(60))).unwrap();
        let after_gap = next_chunk(&mut with_hole).await;

        assert_eq!((first.sequence, first.metadata.get("gap")), (3, None));
        assert_eq!(after_gap.sequence, 3, "1 and 2 were evicted");
        assert_eq!(after_gap.metadata["gap"], true);
        assert!(
            in_buffer.next().await.is_none(),
            "taken over by the re-attach"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_leaves_early_detaches_the_run_until_the_grace_ends() {
        let stop = RunStop::default();
        let log = Replay::new(frames(8), stop.clone());
        let settings = settings(Duration::from_secs(60));
        settings.registry.publish(key(), log.clone());
        log.push(chunk("paused"));

        drop(Subscription::attach(log.clone(), key(), 0, settings.clone()).unwrap());
        assert!(log.is_detached());
        assert_eq!(settings.registry.detached(), 1);
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(stop.reason(), None, "still within the grace");
        tokio::time::sleep(Duration::from_secs(2)).await;

        assert_eq!(stop.reason(), Some(CancelReason::ClientGone));
        assert!(settings.registry.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_re_attach_within_the_grace_keeps_the_run() {
        let stop = RunStop::default();
        let log = Replay::new(frames(8), stop.clone());
        let settings = settings(Duration::from_secs(60));
        settings.registry.publish(key(), log.clone());
        log.push(chunk("paused"));
        drop(Subscription::attach(log.clone(), key(), 0, settings.clone()).unwrap());

        let _back = Subscription::attach(log.clone(), key(), 1, settings.clone()).unwrap();
        tokio::time::sleep(Duration::from_secs(120)).await;

        assert_eq!(stop.reason(), None);
        assert_eq!(settings.registry.len(), 1);
    }

    #[tokio::test]
    async fn delivering_the_final_chunk_forgets_the_log() {
        let log = Replay::new(frames(8), RunStop::default());
        let settings = settings(Duration::from_secs(60));
        settings.registry.publish(key(), log.clone());
        log.push(chunk("done").finished());

        let mut sub = Subscription::attach(log.clone(), key(), 0, settings.clone()).unwrap();
        next_chunk(&mut sub).await;
        assert!(sub.next().await.is_none());
        drop(sub);

        assert!(settings.registry.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn each_grace_belongs_to_the_detach_that_started_it() {
        let stop = RunStop::default();
        let log = Replay::new(frames(8), stop.clone());
        let settings = settings(Duration::from_secs(6));
        settings.registry.publish(key(), log.clone());
        log.push(chunk("paused"));

        // Detach at t=0, re-attach at 0.5, detach again at 2.7.
        drop(Subscription::attach(log.clone(), key(), 0, settings.clone()).unwrap());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let back = Subscription::attach(log.clone(), key(), 1, settings.clone()).unwrap();
        tokio::time::sleep(Duration::from_millis(2200)).await;
        drop(back);
        tokio::time::sleep(Duration::from_millis(4000)).await; // t=6.7: the first grace is over

        assert_eq!(stop.reason(), None, "only the second detach's grace counts");
        tokio::time::sleep(Duration::from_millis(2100)).await; // t=8.8: the second is over
        assert_eq!(stop.reason(), Some(CancelReason::ClientGone));
    }

    #[tokio::test]
    async fn an_id_beyond_the_last_sent_is_refused_and_takes_nothing_over() {
        let log = Replay::new(frames(8), RunStop::default());
        log.push(chunk("1"));
        log.push(chunk("2"));
        let mut reader =
            Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO)).unwrap();

        let beyond = Subscription::attach(log.clone(), key(), 3, settings(Duration::ZERO));
        let overflow = Subscription::attach(log.clone(), key(), u64::MAX, settings(Duration::ZERO));

        assert_eq!(beyond.err(), Some(BeyondEnd { last_sent: 2 }));
        assert_eq!(overflow.err(), Some(BeyondEnd { last_sent: 2 }));
        assert_eq!(
            next_chunk(&mut reader).await.sequence,
            1,
            "still the reader's"
        );
        let at_end = Subscription::attach(log.clone(), key(), 2, settings(Duration::ZERO));
        assert!(at_end.is_ok(), "the last id sent is fine");
    }

    #[tokio::test]
    async fn a_gap_is_announced_whatever_the_chunk_holds() {
        let mut nested = serde_json::json!("deep");
        for _ in 0..300 {
            nested = serde_json::json!([nested]);
        }
        let tricky = Chunk::new(ChunkType::Status, "text with \"metadata\":{ inside", "s", 0)
            .with_meta("args", nested);
        let log = Replay::new(frames(1), RunStop::default());
        log.push(chunk("evicted"));
        log.push(tricky);

        let mut sub =
            Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO)).unwrap();
        let frame = sub.next().await.unwrap().unwrap();
        let text = std::str::from_utf8(&frame).unwrap();

        assert!(text.starts_with("id: 2\n"), "{text}");
        assert!(
            text.contains("\"metadata\":{\"gap\":true,\"args\":[[["),
            "{text}"
        );
        let empty = sse::with_gap(&sse::encode(&chunk("plain")));
        assert!(std::str::from_utf8(&empty)
            .unwrap()
            .contains("\"metadata\":{\"gap\":true}"));
        let with_text = sse::with_gap(&sse::encode(&Chunk::new(
            ChunkType::Status,
            "\"metadata\":{",
            "s",
            1,
        )));
        let json = std::str::from_utf8(&with_text)
            .unwrap()
            .lines()
            .nth(1)
            .unwrap();
        let back: Chunk = serde_json::from_str(json.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(back.chunk, "\"metadata\":{");
        assert_eq!(back.metadata["gap"], true);
    }
}
