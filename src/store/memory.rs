//! `--store memory`, the default: nothing outlives the process.

use std::collections::{BTreeMap, HashSet};
use std::sync::Mutex;

use futures_util::future::BoxFuture;

use super::{
    OutboxEvent, OutboxStats, PausedRecord, QueuedEvent, Resolution, RunEnd, Store, StoreError,
    StoredDecision, EVENT_LEASE,
};
use crate::session::SessionKey;

/// The most undelivered webhook events the memory outbox holds (one per
/// event and URL); more are dropped and counted
/// (`chatgate_webhook_deliveries_total{outcome="overflow"}`).
pub const MAX_OUTBOX_EVENTS: usize = 10_000;

/// `--store memory`: nothing is kept; a paused run lives as long as its
/// process (and is cancelled at shutdown, reason `shutdown`). Its webhook
/// outbox is in memory, bounded by [`MAX_OUTBOX_EVENTS`], and lost with
/// the process.
#[derive(Debug, Default)]
pub struct MemoryStore {
    outbox: Mutex<Outbox>,
}

#[derive(Debug, Default)]
struct Outbox {
    /// By seq: the event, and when it may be tried (ms since the epoch:
    /// its retry time, or the end of its lease while it is being sent).
    rows: BTreeMap<i64, (QueuedEvent, u64)>,
    next_seq: i64,
    overflowed: u64,
}

impl MemoryStore {
    fn queue(&self, events: &[OutboxEvent]) {
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        let now = super::now_ms();
        for event in events {
            if outbox.rows.len() >= MAX_OUTBOX_EVENTS {
                outbox.overflowed += 1;
                log::warn!(
                    "the webhook outbox is full ({MAX_OUTBOX_EVENTS} events): {} {} dropped",
                    event.event_type,
                    event.id
                );
                continue;
            }
            outbox.next_seq += 1;
            let seq = outbox.next_seq;
            let queued = QueuedEvent {
                seq,
                event: event.clone(),
                queued_at_ms: now,
                attempts: 0,
            };
            outbox.rows.insert(seq, (queued, now));
        }
    }
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
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.queue(events);
        Box::pin(async { Ok(()) })
    }

    fn remove(&self, _run: &str, _key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        Box::pin(async { Ok(()) })
    }

    fn load(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        Box::pin(async { Ok(Vec::new()) })
    }

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
        let mut heads = HashSet::new();
        let mut due = Vec::new();
        let leased_until = now_ms + EVENT_LEASE.as_millis() as u64;
        for (queued, retry_at) in outbox.rows.values_mut() {
            if due.len() >= limit {
                break;
            }
            let order = (queued.event.target.clone(), queued.event.order.clone());
            if heads.insert(order) && *retry_at <= now_ms {
                *retry_at = leased_until;
                due.push(queued.clone());
            }
        }
        Box::pin(async { Ok(due) })
    }

    fn settle_events(
        &self,
        settled: Vec<(i64, Option<u64>)>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let mut outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        for (seq, retry_at_ms) in settled {
            match retry_at_ms {
                None => {
                    outbox.rows.remove(&seq);
                }
                Some(at) => {
                    if let Some((queued, retry_at)) = outbox.rows.get_mut(&seq) {
                        queued.attempts += 1;
                        *retry_at = at;
                    }
                }
            }
        }
        Box::pin(async { Ok(()) })
    }

    fn outbox_stats(&self) -> BoxFuture<'_, Result<OutboxStats, StoreError>> {
        let outbox = self.outbox.lock().unwrap_or_else(|p| p.into_inner());
        let stats = OutboxStats {
            depth: outbox.rows.len() as u64,
            oldest_ms: outbox.rows.values().next().map(|(q, _)| q.queued_at_ms),
            overflowed: outbox.overflowed,
        };
        Box::pin(async move { Ok(stats) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let now = super::super::now_ms();

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
}
