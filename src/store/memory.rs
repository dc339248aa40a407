//! `--store memory`, the default: nothing outlives the process.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;

use super::grant::MemoryGrants;
use super::schedule::{queue_of, Schedule, Slot};
use super::{
    Grant, KeptOutcome, OutboxEvent, OutboxStats, Outcome, PausedRecord, QueuedEvent, Resolution,
    RunEnd, Store, StoreError, StoredDecision, EVENT_LEASE,
};
use crate::session::SessionKey;

/// The most undelivered webhook events the memory outbox holds (one per
/// event and URL); more are dropped and counted
/// (`chatgate_webhook_deliveries_total{outcome="overflow"}`).
pub const MAX_OUTBOX_EVENTS: usize = 10_000;
/// The most bytes the memory outbox's undelivered events hold (bodies, URLs,
/// ids), so that 10,000 events of the largest pause (a 128 KiB plan) cannot
/// make it 1.3 GB; past it events are dropped and counted as above.
pub const MAX_OUTBOX_BYTES: usize = 64 * 1024 * 1024;

/// `--store memory`: nothing is kept; a paused run lives as long as its
/// process (and is cancelled at shutdown, reason `shutdown`). Its webhook
/// outbox is in memory, bounded by [`MAX_OUTBOX_EVENTS`] and
/// [`MAX_OUTBOX_BYTES`], and lost with the process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    outbox: Mutex<Outbox>,
    outcomes: Mutex<Outcomes>,
    grants: MemoryGrants,
}

/// The most run outcomes the memory store keeps (`--keep-outcome`): past
/// it the oldest go first. An outcome is at most a few KiB.
pub const MAX_KEPT_OUTCOMES: usize = 20_000;

/// A session as outcomes are kept: its namespace's stored name, its id.
type SessionAt = (Option<String>, String);
/// When a kept outcome goes: (until ms, order of keeping).
type GoesAt = (u64, u64);

/// Kept outcomes by session, and when each goes.
#[derive(Debug, Default)]
struct Outcomes {
    /// Each with its key in `until`.
    by_session: HashMap<SessionAt, (GoesAt, Outcome)>,
    /// The next to go first.
    until: BTreeMap<GoesAt, SessionAt>,
    kept: u64,
}

impl Outcomes {
    fn keep(&mut self, at: SessionAt, outcome: Outcome, until_ms: u64) {
        self.kept += 1;
        if let Some((old, _)) = self.by_session.remove(&at) {
            self.until.remove(&old);
        }
        let place = (until_ms, self.kept);
        self.until.insert(place, at.clone());
        self.by_session.insert(at, (place, outcome));
        while self.by_session.len() > MAX_KEPT_OUTCOMES {
            self.pop_first();
        }
    }

    /// Forgets what is past its time at `now_ms`.
    fn expire(&mut self, now_ms: u64) {
        while self
            .until
            .first_key_value()
            .is_some_and(|((until, _), _)| *until <= now_ms)
        {
            self.pop_first();
        }
    }

    fn pop_first(&mut self) {
        if let Some((_, at)) = self.until.pop_first() {
            self.by_session.remove(&at);
        }
    }
}

#[derive(Debug, Default)]
struct Outbox {
    /// Shared, so that what is copied of them (queued, handed to the
    /// sender) is copied outside the lock the decide path queues under.
    events: HashMap<i64, Arc<OutboxEvent>>,
    /// What `events` hold, as [`size`] counts it.
    bytes: usize,
    schedule: Schedule,
    next_seq: i64,
    overflowed: u64,
}

impl MemoryStore {
    fn keep_now(&self, namespace: Option<&str>, outcome: &Outcome, keep: Duration) {
        let now = crate::clock::now_ms();
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes.expire(now);
        let at = (namespace.map(str::to_owned), outcome.session_id.clone());
        outcomes.keep(at, outcome.clone(), now + keep.as_millis() as u64);
    }

    fn queue(&self, events: &[OutboxEvent]) {
        // Copied before the lock: the sender takes the same lock.
        let copies: Vec<Arc<OutboxEvent>> = events.iter().cloned().map(Arc::new).collect();
        let now = crate::clock::now_ms();
        let mut dropped = Vec::new();
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        for event in copies {
            if outbox.events.len() >= MAX_OUTBOX_EVENTS
                || outbox.bytes + size(&event) > MAX_OUTBOX_BYTES
            {
                outbox.overflowed += 1;
                dropped.push(event);
                continue;
            }
            outbox.bytes += size(&event);
            outbox.next_seq += 1;
            let seq = outbox.next_seq;
            let slot = Slot {
                seq,
                queued_at_ms: now,
                attempts: 0,
                retry_at_ms: now,
            };
            outbox
                .schedule
                .push(queue_of(&event.target, &event.order), slot);
            outbox.events.insert(seq, event);
        }
        drop(outbox);
        for event in dropped {
            log::warn!(
                "the webhook outbox is full ({MAX_OUTBOX_EVENTS} events or \
                 {MAX_OUTBOX_BYTES} bytes): {} {} dropped",
                event.event_type,
                event.id
            );
        }
    }
}

/// The bytes an undelivered event holds in the memory outbox.
fn size(event: &OutboxEvent) -> usize {
    event.body.len() + event.target.len() + event.id.len() + event.order.len()
}

impl Store for MemoryStore {
    fn is_durable(&self) -> bool {
        false
    }

    fn save<'a>(
        &'a self,
        _record: PausedRecord,
        events: &'a [OutboxEvent],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.queue(events);
        Box::pin(async { Ok(()) })
    }

    fn record_decision<'a>(
        &'a self,
        _run: &'a str,
        _key: &'a SessionKey,
        _decision: &'a StoredDecision,
        events: &'a [OutboxEvent],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.queue(events);
        Box::pin(async { Ok(()) })
    }

    fn resolve<'a>(
        &'a self,
        _run: &'a str,
        _key: &'a SessionKey,
        _nonce: &'a str,
    ) -> BoxFuture<'a, Result<Resolution, StoreError>> {
        // Nothing is ever unknown here: every decision was recorded.
        Box::pin(async { Ok(Resolution::Recorded) })
    }

    fn end<'a>(
        &'a self,
        _run: &'a str,
        _key: &'a SessionKey,
        _end: &'a RunEnd,
        events: &'a [OutboxEvent],
        outcome: Option<&'a KeptOutcome>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        if let Some(kept) = outcome {
            self.keep_now(kept.namespace.as_deref(), &kept.outcome, kept.keep);
        }
        self.queue(events);
        Box::pin(async { Ok(()) })
    }

    fn remove(&self, _run: &str, _key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn load(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
}

/// Keeps no journal: nothing of its runs outlives the process.
impl super::ExecutionStore for MemoryStore {}

impl super::GrantStore for MemoryStore {
    fn add_grant<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<bool, StoreError>> {
        let added = self.grants.add(grant, crate::clock::now_ms());
        Box::pin(async move { Ok(added) })
    }

    fn grants<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        let listed = self.grants.list(namespace, crate::clock::now_ms());
        Box::pin(async move { Ok(listed) })
    }

    fn take_grant_call<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u32>, StoreError>> {
        let left = self.grants.take(id, crate::clock::now_ms());
        Box::pin(async move { Ok(left) })
    }

    fn revoke_grant<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Grant>, StoreError>> {
        let revoked = self.grants.revoke(id);
        Box::pin(async move { Ok(revoked) })
    }
}

impl super::OutboxStore for MemoryStore {
    fn announce<'a>(&'a self, events: &'a [OutboxEvent]) -> BoxFuture<'a, Result<(), StoreError>> {
        self.queue(events);
        Box::pin(async { Ok(()) })
    }

    fn due_events(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<QueuedEvent>, StoreError>> {
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        let lease_until = now_ms + EVENT_LEASE.as_millis() as u64;
        let slots = outbox.schedule.take(now_ms, limit, lease_until);
        let taken: Vec<_> = slots
            .into_iter()
            .filter_map(|slot| Some((slot, outbox.events.get(&slot.seq)?.clone())))
            .collect();
        drop(outbox);
        // Their bodies copied outside the lock.
        let due = taken
            .into_iter()
            .map(|(slot, event)| QueuedEvent {
                seq: slot.seq,
                event: OutboxEvent::clone(&event),
                queued_at_ms: slot.queued_at_ms,
                attempts: slot.attempts,
            })
            .collect();
        Box::pin(async { Ok(due) })
    }

    fn settle_events(
        &self,
        settled: Vec<(i64, Option<u64>)>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        for (seq, retry_at_ms) in settled {
            outbox.schedule.settle(seq, retry_at_ms);
            if retry_at_ms.is_none() {
                if let Some(gone) = outbox.events.remove(&seq) {
                    outbox.bytes -= size(&gone);
                }
            }
        }
        Box::pin(async { Ok(()) })
    }

    fn outbox_stats(&self) -> BoxFuture<'_, Result<OutboxStats, StoreError>> {
        let outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        let stats = OutboxStats {
            depth: outbox.events.len() as u64,
            oldest_ms: outbox.schedule.oldest_ms(),
            overflowed: outbox.overflowed,
        };
        Box::pin(async move { Ok(stats) })
    }
}

impl super::OutcomeStore for MemoryStore {
    fn keep_outcome<'a>(
        &'a self,
        namespace: Option<&'a str>,
        outcome: &'a Outcome,
        keep: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.keep_now(namespace, outcome, keep);
        Box::pin(async { Ok(()) })
    }

    fn outcome<'a>(
        &'a self,
        namespace: Option<&'a str>,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Outcome>, StoreError>> {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes.expire(crate::clock::now_ms());
        let at = (namespace.map(str::to_owned), session_id.to_owned());
        let found = outcomes.by_session.get(&at).map(|(_, o)| o.clone());
        Box::pin(async { Ok(found) })
    }
}

/// What it keeps is memory: nothing parks.
impl super::ParkStore for MemoryStore {
    fn park<'a>(
        &'a self,
        _run: &'a str,
        _key: &'a SessionKey,
        _log: &'a super::ParkedLog,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn load_unparked(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        super::Store::load(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{OutboxStore, OutcomeStore};

    fn event(order: &str, n: u32) -> OutboxEvent {
        OutboxEvent {
            id: format!("{order}-{n}"),
            event_type: "run.ended".into(),
            target: "http://127.0.0.1:1/".into(),
            order: order.into(),
            body: "{}".into(),
        }
    }

    #[tokio::test]
    async fn one_session_s_events_go_in_order_and_a_failed_one_holds_the_rest() {
        let store = MemoryStore::default();
        store
            .announce(&[event("a", 1), event("a", 2), event("b", 1)])
            .await
            .unwrap();
        let now = crate::clock::now_ms();

        let due = store.due_events(now, 10).await.unwrap();
        let ids: Vec<_> = due.iter().map(|q| q.event.id.as_str()).collect();
        assert_eq!(ids, ["a-1", "b-1"]);
        assert!(store.due_events(now, 10).await.unwrap().is_empty(), "taken");

        store
            .settle_events(vec![(due[0].seq, Some(now + 60_000))])
            .await
            .unwrap();
        store.settle_events(vec![(due[1].seq, None)]).await.unwrap();
        assert!(
            store.due_events(now, 10).await.unwrap().is_empty(),
            "a-2 waits for a-1"
        );
        let later = store.due_events(now + 60_000, 10).await.unwrap();
        assert_eq!(later[0].event.id, "a-1");
        assert_eq!(later[0].attempts, 1);
        assert_eq!(store.outbox_stats().await.unwrap().depth, 2);
    }

    fn outcome(session: &str) -> Outcome {
        Outcome {
            session_id: session.into(),
            final_chunk: crate::protocol::Chunk::failed(
                session,
                crate::protocol::ErrorType::TaskFailed,
                "x".into(),
            ),
            ended_at_ms: 1,
            pauses: vec![],
            ran: vec![],
        }
    }

    #[tokio::test]
    async fn outcomes_are_kept_per_session_bounded_in_count_and_time() {
        let store = MemoryStore::default();
        let day = Duration::from_secs(86_400);
        for n in 0..=MAX_KEPT_OUTCOMES {
            store
                .keep_outcome(None, &outcome(&format!("s{n}")), day)
                .await
                .unwrap();
        }
        // The oldest went first; the others stay.
        assert_eq!(store.outcome(None, "s0").await.unwrap(), None);
        assert!(store.outcome(None, "s1").await.unwrap().is_some());
        // Another namespace's session is another outcome (the oldest goes);
        // a later run of a session replaces its outcome (none goes).
        store
            .keep_outcome(Some("k1"), &outcome("s1"), day)
            .await
            .unwrap();
        assert_eq!(store.outcome(None, "s1").await.unwrap(), None);
        assert!(store.outcome(Some("k1"), "s1").await.unwrap().is_some());
        store.keep_outcome(None, &outcome("s2"), day).await.unwrap();
        assert!(store.outcome(None, "s3").await.unwrap().is_some());
        let len = store.outcomes.lock().unwrap().by_session.len();
        assert_eq!(len, MAX_KEPT_OUTCOMES);
        // Past its time it is gone.
        store
            .keep_outcome(None, &outcome("brief"), Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(store.outcome(None, "brief").await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_full_outbox_drops_and_counts() {
        let store = MemoryStore::default();
        let events: Vec<_> = (0..MAX_OUTBOX_EVENTS as u32 + 3)
            .map(|n| event("a", n))
            .collect();
        store.announce(&events).await.unwrap();
        let stats = store.outbox_stats().await.unwrap();
        assert_eq!(stats.depth, MAX_OUTBOX_EVENTS as u64);
        assert_eq!(stats.overflowed, 3);
    }

    #[tokio::test]
    async fn the_outbox_is_bounded_in_bytes_too_and_delivered_events_free_theirs() {
        let store = MemoryStore::default();
        let big = |n: u32| OutboxEvent {
            body: "x".repeat(128 * 1024),
            ..event("a", n)
        };
        let fit = (MAX_OUTBOX_BYTES / size(&big(0))) as u32;
        let events: Vec<_> = (0..fit + 2).map(big).collect();
        store.announce(&events).await.unwrap();
        let stats = store.outbox_stats().await.unwrap();
        assert_eq!(stats.depth, u64::from(fit));
        assert_eq!(stats.overflowed, 2);
        // One delivered: room for one more.
        let due = store.due_events(u64::MAX / 2, 1).await.unwrap();
        store.settle_events(vec![(due[0].seq, None)]).await.unwrap();
        store.announce(&[big(fit + 2), big(fit + 3)]).await.unwrap();
        let stats = store.outbox_stats().await.unwrap();
        assert_eq!(stats.depth, u64::from(fit));
        assert_eq!(stats.overflowed, 3);
    }
}
