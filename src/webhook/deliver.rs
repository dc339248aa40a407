//! The sender: takes due events from the store's outbox and POSTs them,
//! off every request's path.
//!
//! At most [`MAX_IN_FLIGHT`] deliveries at once ([`GIVING_WAY_IN_FLIGHT`]
//! while the server works off a backlog of its own); one event per URL and
//! session at a time, the oldest first (the next waits for it: events of a
//! session arrive in order). A 2xx within [`DELIVERY_TIMEOUT`] is
//! delivered; anything else is tried again after 1 s, doubling up to
//! [`MAX_BACKOFF`] (or after the receiver's `Retry-After`), until
//! `--webhook-retry-for` has passed since it was queued: then it is
//! dropped, with a log line and a metric.
//!
//! The sender runs on threads of its own (a quarter of the cores, at least
//! one) at a lower priority ([`NICE`]):
//! every event is durable in the outbox until it is delivered, so when the
//! cores are busy the requests, the timers and the store's writer go first
//! (100,000 expiries at once are ended and stored before they are all
//! announced to a receiver on the same cores), and when they are not, it
//! sends at full speed. Its store calls run on the server's runtime, where
//! the store's connections live.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use std::future::Future;

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::{unix_now, EventType, Webhooks, DELIVERY_TIMEOUT};
use crate::clock::now_ms;
use crate::metrics::Metrics;
use crate::store::{Fault, QueuedEvent, Store, StoreError};

/// Deliveries under way at once, over every URL.
pub const MAX_IN_FLIGHT: usize = 32;
/// Deliveries under way at once while the sender gives way
/// ([`GiveWay`]).
pub const GIVING_WAY_IN_FLIGHT: usize = 2;
/// The first retry's wait; it doubles from there.
pub const FIRST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two attempts (unless `Retry-After` says more).
pub const MAX_BACKOFF: Duration = Duration::from_secs(600);
/// How often the queue gauges are brought up to date.
const STATS_EVERY: Duration = Duration::from_secs(1);
/// How often the outbox is looked at when nothing wakes the sender (a
/// retry coming due, events another writer queued).
const TICK: Duration = Duration::from_millis(500);

/// How much the sender's thread's nice value is raised (Linux):
/// background work, below the server's threads whenever the cores are
/// contended, never starved (CFS still gives a thread at +10 about a
/// tenth of the share of one at the server's).
pub const NICE: i32 = 10;

/// While held, the sender gives way: at most
/// [`GIVING_WAY_IN_FLIGHT`] deliveries at once, the rest of the
/// cores left to the work that queues its events (a sweep of parked pauses
/// that came due in more than one batch). What it queues is durable in
/// the outbox meanwhile, and goes out at full speed once it is dropped.
pub struct GiveWay(Arc<Webhooks>);

impl Drop for GiveWay {
    fn drop(&mut self) {
        if self.0.giving_way.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.wake();
        }
    }
}

impl Webhooks {
    /// The sender gives way until what this returns is dropped.
    pub fn give_way(self: &Arc<Self>) -> GiveWay {
        self.giving_way.fetch_add(1, Ordering::Relaxed);
        GiveWay(self.clone())
    }

    /// Whether the sender gives way now ([`Webhooks::give_way`]).
    pub fn giving_way(&self) -> bool {
        self.giving_way.load(Ordering::Relaxed) > 0
    }
}

/// The outcome of one attempt.
enum Attempt {
    Delivered,
    Failed {
        why: String,
        retry_after: Option<Duration>,
    },
}

pub struct Sender {
    hooks: Arc<Webhooks>,
    store: Arc<dyn Store>,
    metrics: Arc<Metrics>,
    client: reqwest::Client,
    /// The server's runtime: the store is called there.
    server: Handle,
}

impl Sender {
    pub fn new(hooks: Arc<Webhooks>, store: Arc<dyn Store>, metrics: Arc<Metrics>) -> Sender {
        let client = reqwest::Client::builder()
            .timeout(DELIVERY_TIMEOUT)
            .connect_timeout(DELIVERY_TIMEOUT)
            // A redirect is not a delivery: the URL is what was configured.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("chatgate/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a plain HTTP client builds");
        Sender {
            hooks,
            store,
            metrics,
            client,
            server: Handle::current(),
        }
    }

    /// Sends on threads of its own, [`NICE`] below the server's, until `stop`; what it
    /// returns is told once the sender has stopped, what was delivered
    /// written down (await it before the process ends: else what was
    /// delivered since the last write is sent again by the next process).
    pub fn spawn(self, stop: CancellationToken) -> std::io::Result<oneshot::Receiver<()>> {
        let (stopped, told) = oneshot::channel();
        std::thread::Builder::new()
            .name("chatgate-webhooks".into())
            .spawn(move || {
                lower_priority();
                // Its deliveries spread over a quarter of the cores (at
                // least one thread), each as low as this one.
                let threads = std::thread::available_parallelism().map_or(1, |n| n.get() / 4);
                match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(threads.max(1))
                    .thread_name("chatgate-webhooks")
                    .on_thread_start(lower_priority)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime.block_on(self.run(stop)),
                    Err(err) => log::error!("webhooks: no runtime for the sender: {err}"),
                }
                let _ = stopped.send(());
            })?;
        Ok(told)
    }

    /// `call` to the store, on the server's runtime (a store's connections
    /// and their tasks stay there, at the server's priority).
    async fn store<T: Send + 'static>(
        &self,
        call: impl Future<Output = Result<T, StoreError>> + Send + 'static,
    ) -> Result<T, StoreError> {
        match self.server.spawn(call).await {
            Ok(done) => done,
            Err(err) => Err(StoreError {
                store: "the outbox".to_owned(),
                reason: format!("the server's runtime: {err}"),
                fault: Fault::Unreachable,
            }),
        }
    }

    /// Sends until `stop`; what is undelivered then stays in the outbox
    /// (a durable store's for the next process).
    pub async fn run(self, stop: CancellationToken) {
        let mut in_flight: JoinSet<(QueuedEvent, Attempt)> = JoinSet::new();
        let mut sending: HashSet<i64> = HashSet::new();
        let mut overflowed = 0;
        let mut counted = tokio::time::Instant::now() - STATS_EVERY;
        loop {
            // Refilled once half of the deliveries are done (or at once when
            // few are under way): a burst is read from the outbox in batches,
            // not one read per delivery that ends.
            let most = if self.hooks.giving_way() {
                GIVING_WAY_IN_FLIGHT
            } else {
                MAX_IN_FLIGHT
            };
            if in_flight.len() <= most / 2 {
                // What is taken is leased to this sender: all of it is sent.
                let limit = most - in_flight.len();
                let store = self.store.clone();
                let due = self.store(async move { store.due_events(now_ms(), limit).await });
                match due.await {
                    Ok(due) => {
                        for queued in due {
                            if sending.insert(queued.seq) {
                                in_flight.spawn(self.attempt(queued));
                            }
                        }
                    }
                    Err(err) => log::warn!("webhooks: {err}"),
                }
            }
            if counted.elapsed() >= STATS_EVERY {
                counted = tokio::time::Instant::now();
                let store = self.store.clone();
                if let Ok(stats) = self.store(async move { store.outbox_stats().await }).await {
                    self.metrics.webhook_queue(stats.depth, stats.oldest_ms);
                    for _ in overflowed..stats.overflowed {
                        self.metrics.webhook_delivery("unknown", "overflow");
                    }
                    overflowed = stats.overflowed;
                }
            }
            tokio::select! {
                Some(done) = in_flight.join_next() => {
                    // With whatever else has finished meanwhile: one write.
                    let mut settled = Vec::new();
                    let mut next = Some(done);
                    while let Some(done) = next {
                        if let Ok((queued, attempt)) = done {
                            sending.remove(&queued.seq);
                            settled.push((queued.seq, self.outcome(&queued, attempt)));
                        }
                        next = in_flight.try_join_next();
                    }
                    let store = self.store.clone();
                    let settle = self.store(async move { store.settle_events(settled).await });
                    if let Err(err) = settle.await {
                        // Not settled: sent again (at least once).
                        log::warn!("webhooks: {err}");
                    }
                }
                () = self.hooks.wake.notified() => {}
                () = tokio::time::sleep(TICK) => {}
                () = stop.cancelled() => {
                    let store = self.store.clone();
                    if let Err(err) = self.store(async move { store.flush_outbox().await }).await {
                        log::warn!("webhooks: {err}");
                    }
                    return;
                }
            }
        }
    }

    /// One attempt at one event.
    fn attempt(
        &self,
        queued: QueuedEvent,
    ) -> impl std::future::Future<Output = (QueuedEvent, Attempt)> + Send + 'static {
        let hooks = self.hooks.clone();
        let client = self.client.clone();
        async move {
            if !hooks.knows(&queued.event.target) {
                let why = "its URL is no longer a --webhook".to_owned();
                return (
                    queued,
                    Attempt::Failed {
                        why,
                        retry_after: None,
                    },
                );
            }
            if let Some(mailer) = hooks.mailer_for(&queued.event.target) {
                let letter =
                    serde_json::from_str::<crate::notify::mail::Letter>(&queued.event.body);
                let attempt = match letter {
                    Ok(letter) => match mailer.send(&letter).await {
                        Ok(()) => Attempt::Delivered,
                        Err(why) => Attempt::Failed {
                            why,
                            retry_after: None,
                        },
                    },
                    Err(err) => Attempt::Failed {
                        why: format!("an unreadable mail: {err}"),
                        retry_after: None,
                    },
                };
                return (queued, attempt);
            }
            let signature = hooks.signature(unix_now(), queued.event.body.as_bytes());
            let sent = client
                .post(&queued.event.target)
                .header("content-type", "application/json")
                .header("x-chatgate-signature", signature)
                .header("x-chatgate-event", &queued.event.event_type)
                .header("x-chatgate-delivery", &queued.event.id)
                .body(queued.event.body.clone())
                .send()
                .await;
            let attempt = match sent {
                Ok(response) if response.status().is_success() => Attempt::Delivered,
                Ok(response) => Attempt::Failed {
                    why: format!("answered {}", response.status()),
                    retry_after: response
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(retry_after),
                },
                Err(err) => Attempt::Failed {
                    why: crate::redact::request_error(&err),
                    retry_after: None,
                },
            };
            (queued, attempt)
        }
    }

    /// What an attempt's outcome makes of its event: gone (`None`), or
    /// tried again then.
    fn outcome(&self, queued: &QueuedEvent, attempt: Attempt) -> Option<u64> {
        let label = EventType::label(&queued.event.event_type);
        let now = now_ms();
        let deadline = queued.queued_at_ms + self.hooks.retry_for.as_millis() as u64;
        match attempt {
            Attempt::Delivered => {
                self.metrics.webhook_delivery(label, "delivered");
                None
            }
            Attempt::Failed { why, .. }
                if now >= deadline || !self.hooks.knows(&queued.event.target) =>
            {
                self.metrics.webhook_delivery(label, "dropped");
                log::warn!(
                    "webhook {} {} of {} to {} dropped after {} attempt(s): {why}",
                    queued.event.event_type,
                    queued.event.id,
                    queued.event.order,
                    crate::redact::origin(&queued.event.target),
                    queued.attempts + 1
                );
                None
            }
            Attempt::Failed { why, retry_after } => {
                self.metrics.webhook_delivery(label, "failed");
                let wait = retry_after.unwrap_or_else(|| backoff(queued.attempts));
                let at = (now + wait.as_millis() as u64).min(deadline);
                log::info!(
                    "webhook {} {} of {} to {}: {why}; again in {} ms",
                    queued.event.event_type,
                    queued.event.id,
                    queued.event.order,
                    crate::redact::origin(&queued.event.target),
                    at - now
                );
                Some(at)
            }
        }
    }
}

/// Sets the calling thread's nice value to [`NICE`] above the process's
/// main thread's (Linux, where a nice value is a thread's own; elsewhere it
/// keeps the server's): the same whichever thread calls it, and again.
fn lower_priority() {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpriority and setpriority on ids of this process (its
        // main thread, this thread); no memory is passed.
        let lowered = unsafe {
            let server = libc::getpriority(libc::PRIO_PROCESS, libc::getpid() as libc::id_t);
            let nice = (server + NICE).min(19);
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, nice)
        };
        if lowered != 0 {
            log::debug!(
                "webhooks: the sender may keep the server's priority: {}",
                std::io::Error::last_os_error()
            );
        }
    }
}

/// The wait after `attempts` failed attempts before this one: 1 s, 2 s,
/// 4 s, ... up to [`MAX_BACKOFF`].
pub fn backoff(attempts: u32) -> Duration {
    FIRST_RETRY
        .checked_mul(1u32 << attempts.min(20))
        .map_or(MAX_BACKOFF, |wait| wait.min(MAX_BACKOFF))
}

/// `Retry-After`: seconds, or an HTTP date.
fn retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(at.duration_since(SystemTime::now()).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The sender's threads run [`NICE`] below the server's: whichever
    /// thread (one of them included) starts them.
    #[cfg(target_os = "linux")]
    #[test]
    fn the_sender_s_threads_run_at_a_lower_priority() {
        fn nice(stat: &str) -> i64 {
            let stat = std::fs::read_to_string(stat).unwrap();
            // After `pid (comm)`: state is field 3, nice field 19.
            let fields: Vec<&str> = stat
                .rsplit_once(')')
                .unwrap()
                .1
                .split_whitespace()
                .collect();
            fields[16].parse().unwrap()
        }
        let server = nice("/proc/self/stat");
        let lowered = (server + i64::from(NICE)).min(19);
        let (first, again, started_by_one) = std::thread::spawn(|| {
            lower_priority();
            let first = nice("/proc/thread-self/stat");
            lower_priority();
            let again = nice("/proc/thread-self/stat");
            let started_by_one = std::thread::spawn(|| {
                lower_priority();
                nice("/proc/thread-self/stat")
            })
            .join()
            .unwrap();
            (first, again, started_by_one)
        })
        .join()
        .unwrap();
        assert_eq!(
            [first, again, started_by_one],
            [lowered; 3],
            "server at {server}"
        );
        // The calling thread keeps its priority.
        assert_eq!(nice("/proc/thread-self/stat"), nice("/proc/self/stat"));
    }

    #[test]
    fn the_sender_gives_way_while_any_backlog_is_worked_off() {
        let hooks = Webhooks::new(
            vec!["http://127.0.0.1:1/a".into()],
            secrecy::SecretString::from("0123456789abcdef".to_owned()),
            None,
            Duration::from_secs(60),
            None,
            None,
        )
        .unwrap();
        assert!(!hooks.giving_way());
        let first = hooks.give_way();
        let second = hooks.give_way();
        assert!(hooks.giving_way());
        drop(first);
        assert!(hooks.giving_way(), "one backlog is still being worked off");
        drop(second);
        assert!(!hooks.giving_way());
    }

    #[test]
    fn backoff_doubles_from_a_second_to_its_cap() {
        assert_eq!(backoff(0), Duration::from_secs(1));
        assert_eq!(backoff(1), Duration::from_secs(2));
        assert_eq!(backoff(5), Duration::from_secs(32));
        assert_eq!(backoff(40), MAX_BACKOFF);
    }

    #[test]
    fn retry_after_takes_seconds_and_dates() {
        assert_eq!(retry_after("3"), Some(Duration::from_secs(3)));
        let soon = SystemTime::now() + Duration::from_secs(120);
        let date = httpdate::fmt_http_date(soon);
        let wait = retry_after(&date).unwrap();
        assert!(wait > Duration::from_secs(100) && wait <= Duration::from_secs(120));
        assert_eq!(retry_after("soon"), None);
    }
}
