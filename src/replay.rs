//! A run's output as a bounded replay log, and the client streams that read it.
//!
//! The run pushes chunks into its [`RunLog`]; the log numbers them, encodes
//! them once, and keeps the last `--replay-buffer` frames. At most one
//! [`Subscription`] (the HTTP response of the client currently attached)
//! reads the log from its own cursor, with a keep-alive comment after each
//! idle interval.
//!
//! - The run never waits for a client. If the attached client falls so far
//!   behind that an unread frame would be evicted, the run is stopped with
//!   `slow_consumer`: buffering per stream is bounded by the log's capacity.
//! - When a subscription ends before delivering the final chunk (the client
//!   went away), the run is *detached*: it goes on, and a POST with
//!   `Last-Event-ID` may re-attach within `--detach-grace-secs`. After the
//!   grace the run is stopped (`client_gone`) and its log forgotten.
//! - [`LogRegistry`] maps a session to its latest log, so a re-attach can find
//!   a run that is live or finished within the grace.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::Stream;
use tokio::time::Sleep;
use tokio_util::sync::CancellationToken;

use crate::confirmation::SessionKey;
use crate::metrics::Metrics;
use crate::protocol::{CancelReason, Chunk};
use crate::sse;

/// Tells a run to stop, and why. The first reason given wins.
///
/// A run's stop is a child of the server's shutdown token, so a run waits on
/// one token for every reason to stop; a stop that comes from shutdown
/// carries no reason of its own and reads as `Shutdown`.
#[derive(Clone, Default)]
pub struct RunStop {
    token: CancellationToken,
    reason: Arc<OnceLock<CancelReason>>,
}

impl RunStop {
    /// A stop that also fires when `shutdown` is cancelled.
    pub fn under(shutdown: &CancellationToken) -> RunStop {
        RunStop {
            token: shutdown.child_token(),
            reason: Arc::default(),
        }
    }

    pub fn stop(&self, reason: CancelReason) {
        // Once stopped (by shutdown, say) a later reason must not rename it.
        if !self.token.is_cancelled() {
            let _ = self.reason.set(reason);
        }
        self.token.cancel();
    }

    pub fn reason(&self) -> Option<CancelReason> {
        self.token.is_cancelled().then(|| self.reason_given())
    }

    /// Resolves with the reason once the run is told to stop.
    pub async fn stopped(&self) -> CancelReason {
        self.token.cancelled().await;
        self.reason_given()
    }

    fn reason_given(&self) -> CancelReason {
        self.reason.get().copied().unwrap_or(CancelReason::Shutdown)
    }
}

/// The output of one run.
pub struct RunLog {
    inner: Mutex<LogInner>,
    capacity: usize,
    stop: RunStop,
}

struct LogInner {
    frames: VecDeque<Bytes>,
    /// The sequence number the next pushed chunk gets (sequences start at 1).
    next_seq: u64,
    /// The final chunk has been pushed.
    finished: bool,
    subscriber: Option<Subscriber>,
    next_subscriber_id: u64,
}

struct Subscriber {
    id: u64,
    /// The sequence number this subscriber sends next.
    cursor: u64,
    waker: Option<Waker>,
}

impl LogInner {
    fn first_retained(&self) -> u64 {
        self.next_seq - self.frames.len() as u64
    }
}

impl RunLog {
    pub fn new(capacity: usize, stop: RunStop) -> Arc<RunLog> {
        Arc::new(RunLog {
            inner: Mutex::new(LogInner {
                frames: VecDeque::new(),
                next_seq: 1,
                finished: false,
                subscriber: None,
                next_subscriber_id: 0,
            }),
            capacity: capacity.max(1),
            stop,
        })
    }

    fn lock(&self) -> MutexGuard<'_, LogInner> {
        // Plain data; a panic elsewhere leaves it consistent.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Numbers, encodes and appends `chunk`; wakes the attached client.
    /// Returns the sequence number given.
    pub fn push(&self, mut chunk: Chunk) -> u64 {
        let mut inner = self.lock();
        let seq = inner.next_seq;
        chunk.sequence = seq;
        let frame = sse::encode(&chunk);
        let mut overflowed = false;
        if inner.frames.len() == self.capacity {
            let evicted = inner.first_retained();
            inner.frames.pop_front();
            overflowed = inner
                .subscriber
                .as_ref()
                .is_some_and(|s| s.cursor <= evicted);
        }
        inner.frames.push_back(frame);
        inner.next_seq += 1;
        inner.finished |= chunk.finished;
        let waker = inner.subscriber.as_mut().and_then(|s| s.waker.take());
        drop(inner);
        if overflowed {
            // The attached client could not keep up: stop rather than buffer more.
            self.stop.stop(CancelReason::SlowConsumer);
        }
        if let Some(waker) = waker {
            waker.wake();
        }
        seq
    }

    /// True when no client is attached and the run has not delivered its end.
    pub fn is_detached(&self) -> bool {
        let inner = self.lock();
        inner.subscriber.is_none() && !inner.finished
    }

    /// Attaches a new subscriber that starts after `last_seen` (0: from the
    /// start). A previous subscriber is detached and its stream ends.
    fn attach(&self, last_seen: u64) -> u64 {
        let mut inner = self.lock();
        let id = inner.next_subscriber_id;
        inner.next_subscriber_id += 1;
        let previous = inner.subscriber.replace(Subscriber {
            id,
            cursor: last_seen + 1,
            waker: None,
        });
        drop(inner);
        if let Some(waker) = previous.and_then(|s| s.waker) {
            waker.wake();
        }
        id
    }
}

/// Sessions' latest logs, for re-attach. Cheap-clone handle.
#[derive(Clone, Default)]
pub struct LogRegistry {
    logs: Arc<Mutex<HashMap<SessionKey, Arc<RunLog>>>>,
}

impl LogRegistry {
    fn lock(&self) -> MutexGuard<'_, HashMap<SessionKey, Arc<RunLog>>> {
        self.logs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `log` the one a re-attach to `key` finds.
    pub fn publish(&self, key: SessionKey, log: Arc<RunLog>) {
        self.lock().insert(key, log);
    }

    pub fn find(&self, key: &SessionKey) -> Option<Arc<RunLog>> {
        self.lock().get(key).cloned()
    }

    /// Forgets `log` if it is still the one registered for `key`.
    fn forget(&self, key: &SessionKey, log: &Arc<RunLog>) {
        let mut logs = self.lock();
        if logs
            .get(key)
            .is_some_and(|current| Arc::ptr_eq(current, log))
        {
            logs.remove(key);
        }
    }

    /// Logs held (live runs plus finished ones within their grace).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Runs whose client went away and that may still be re-attached.
    pub fn detached(&self) -> usize {
        let logs: Vec<Arc<RunLog>> = self.lock().values().cloned().collect();
        logs.iter().filter(|log| log.is_detached()).count()
    }
}

/// Settings of a subscription.
#[derive(Clone)]
pub struct StreamSettings {
    pub keep_alive: Duration,
    pub detach_grace: Duration,
    pub metrics: Arc<Metrics>,
    pub registry: LogRegistry,
}

/// One client's view of a run: an HTTP response body.
pub struct Subscription {
    log: Arc<RunLog>,
    key: SessionKey,
    id: u64,
    /// The first chunk sent after a hole in the replay carries `gap: true`.
    announce_gap: bool,
    delivered_final: bool,
    idle: Pin<Box<Sleep>>,
    /// Set until the first chunk is written, for the time-to-first-chunk metric.
    opened: Option<Instant>,
    settings: StreamSettings,
}

impl Subscription {
    /// Attaches to `log`, sending every chunk after `last_seen` (0: all).
    pub fn attach(
        log: Arc<RunLog>,
        key: SessionKey,
        last_seen: u64,
        settings: StreamSettings,
    ) -> Subscription {
        let id = log.attach(last_seen);
        settings.metrics.open_streams.inc();
        Subscription {
            log,
            key,
            id,
            announce_gap: false,
            delivered_final: false,
            idle: Box::pin(tokio::time::sleep(settings.keep_alive)),
            opened: Some(Instant::now()),
            settings,
        }
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
            me.cursor += 1;
            let frame = inner.frames[index].clone();
            let last = finished && me.cursor == next_seq;
            drop(guard);
            self.delivered_final |= last;
            return Poll::Ready(Some(if std::mem::take(&mut self.announce_gap) {
                with_gap(&frame)
            } else {
                frame
            }));
        }
        if finished {
            return Poll::Ready(None);
        }
        me.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// Re-encodes a frame with `metadata.gap = true`.
fn with_gap(frame: &Bytes) -> Bytes {
    let json = frame
        .split(|&b| b == b'\n')
        .find_map(|line| line.strip_prefix(b"data: "));
    match json.and_then(|json| serde_json::from_slice::<Chunk>(json).ok()) {
        Some(chunk) => sse::encode(&chunk.with_meta("gap", true)),
        None => frame.clone(),
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
        if self.delivered_final {
            // The normal end: nothing left to re-attach to.
            self.settings.registry.forget(&self.key, &self.log);
            return;
        }
        // The client went away early: detach, and give it the grace to return.
        let (log, key, registry) = (
            self.log.clone(),
            self.key.clone(),
            self.settings.registry.clone(),
        );
        let grace = self.settings.detach_grace;
        let expire = move || {
            if log.lock().subscriber.is_none() {
                registry.forget(&key, &log);
                log.stop.stop(CancelReason::ClientGone);
            }
        };
        if grace.is_zero() {
            expire();
        } else {
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                expire();
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ChunkType;
    use futures_util::StreamExt;

    fn chunk(text: &str) -> Chunk {
        Chunk::new(ChunkType::Status, text, "s", 0)
    }

    fn settings(grace: Duration) -> StreamSettings {
        StreamSettings {
            keep_alive: Duration::from_secs(3600),
            detach_grace: grace,
            metrics: Arc::new(Metrics::new()),
            registry: LogRegistry::default(),
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
    async fn shutdown_stops_every_run_and_its_reason_is_not_renamed_later() {
        let shutdown = CancellationToken::new();
        let stop = RunStop::under(&shutdown);
        assert_eq!(stop.reason(), None);

        shutdown.cancel();
        stop.stop(CancelReason::ClientGone);

        assert_eq!(stop.stopped().await, CancelReason::Shutdown);
        assert_eq!(stop.reason(), Some(CancelReason::Shutdown));
    }

    #[tokio::test]
    async fn the_first_reason_given_wins() {
        let stop = RunStop::under(&CancellationToken::new());
        stop.stop(CancelReason::SlowConsumer);
        stop.stop(CancelReason::ClientGone);
        assert_eq!(stop.reason(), Some(CancelReason::SlowConsumer));
    }

    #[tokio::test]
    async fn the_log_numbers_chunks_and_a_late_reader_gets_them_all() {
        let log = RunLog::new(8, RunStop::default());
        for text in ["a", "b"] {
            log.push(chunk(text));
        }
        let mut sub = Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO));

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
        let log = RunLog::new(2, RunStop::default());
        for text in ["1", "2", "3", "4"] {
            log.push(chunk(text));
        }

        let mut in_buffer =
            Subscription::attach(log.clone(), key(), 2, settings(Duration::from_secs(60)));
        let first = next_chunk(&mut in_buffer).await;
        let mut with_hole =
            Subscription::attach(log.clone(), key(), 0, settings(Duration::from_secs(60)));
        let after_gap = next_chunk(&mut with_hole).await;

        assert_eq!((first.sequence, first.metadata.get("gap")), (3, None));
        assert_eq!(after_gap.sequence, 3, "1 and 2 were evicted");
        assert_eq!(after_gap.metadata["gap"], true);
        assert!(
            in_buffer.next().await.is_none(),
            "taken over by the re-attach"
        );
    }

    #[tokio::test]
    async fn an_attached_reader_that_falls_a_whole_buffer_behind_stops_the_run() {
        let stop = RunStop::default();
        let log = RunLog::new(4, stop.clone());
        let _reader = Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO));

        for i in 0..4 {
            log.push(chunk(&i.to_string()));
        }
        assert_eq!(stop.reason(), None, "a full buffer is still fine");
        log.push(chunk("one too many"));

        assert_eq!(stop.reason(), Some(CancelReason::SlowConsumer));
    }

    #[tokio::test]
    async fn without_a_reader_old_chunks_are_evicted_and_nothing_stops() {
        let stop = RunStop::default();
        let log = RunLog::new(2, stop.clone());
        for i in 0..10 {
            log.push(chunk(&i.to_string()));
        }
        assert_eq!(stop.reason(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_reader_that_leaves_early_detaches_the_run_until_the_grace_ends() {
        let stop = RunStop::default();
        let log = RunLog::new(8, stop.clone());
        let settings = settings(Duration::from_secs(60));
        settings.registry.publish(key(), log.clone());
        log.push(chunk("paused"));

        drop(Subscription::attach(
            log.clone(),
            key(),
            0,
            settings.clone(),
        ));
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
        let log = RunLog::new(8, stop.clone());
        let settings = settings(Duration::from_secs(60));
        settings.registry.publish(key(), log.clone());
        log.push(chunk("paused"));
        drop(Subscription::attach(
            log.clone(),
            key(),
            0,
            settings.clone(),
        ));

        let _back = Subscription::attach(log.clone(), key(), 1, settings.clone());
        tokio::time::sleep(Duration::from_secs(120)).await;

        assert_eq!(stop.reason(), None);
        assert_eq!(settings.registry.len(), 1);
    }

    #[tokio::test]
    async fn delivering_the_final_chunk_forgets_the_log() {
        let log = RunLog::new(8, RunStop::default());
        let settings = settings(Duration::from_secs(60));
        settings.registry.publish(key(), log.clone());
        log.push(chunk("done").finished());

        let mut sub = Subscription::attach(log.clone(), key(), 0, settings.clone());
        next_chunk(&mut sub).await;
        assert!(sub.next().await.is_none());
        drop(sub);

        assert!(settings.registry.is_empty());
    }
}
