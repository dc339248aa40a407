//! The webhook outbox in Redis, for the whole cluster (see
//! [`crate::webhook`] and [`super::scripts::ENQUEUE`]): events are queued by
//! the scripts that write what they announce; any replica takes the due
//! ones (leased for [`EVENT_LEASE`], so one replica at a time sends each)
//! and settles them.

use super::RedisStore;
use crate::clock::now_ms;
use crate::store::{OutboxEvent, OutboxStats, QueuedEvent, StoreError, EVENT_LEASE};

/// Every queued event, scored by when it was queued.
const ALL: &str = "chatgate:outbox:all";

impl RedisStore {
    /// Queues events that no record write carries.
    pub(super) async fn announce_events(&self, events: &[OutboxEvent]) -> Result<(), StoreError> {
        if events.is_empty() {
            return Ok(());
        }
        let args = super::scripts::event_args(events);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.invoke::<i64>(&self.scripts.announce, &[], &args)
            .await
            .map(drop)
    }

    /// Takes (leases) at most `limit` due events, each its queue's head.
    pub(super) async fn take_events(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> Result<Vec<QueuedEvent>, StoreError> {
        let (now, lease, limit) = (
            now_ms.to_string(),
            EVENT_LEASE.as_millis().to_string(),
            limit.to_string(),
        );
        let flat: Vec<String> = self
            .invoke(&self.scripts.take_events, &[], &[&now, &lease, &limit])
            .await?;
        Ok(flat
            .chunks_exact(8)
            .filter_map(|f| {
                Some(QueuedEvent {
                    seq: f[0].parse().ok()?,
                    event: OutboxEvent {
                        id: f[1].clone(),
                        event_type: f[2].clone(),
                        target: f[3].clone(),
                        order: f[4].clone(),
                        body: f[5].clone(),
                    },
                    queued_at_ms: f[6].parse().ok()?,
                    attempts: f[7].parse().ok()?,
                })
            })
            .collect())
    }

    /// A taken event: gone (`None`), or tried again at `retry_at_ms`.
    pub(super) async fn settle(
        &self,
        seq: i64,
        retry_at_ms: Option<u64>,
    ) -> Result<(), StoreError> {
        let seq = seq.to_string();
        let retry = retry_at_ms.map(|at| at.to_string()).unwrap_or_default();
        let now = now_ms().to_string();
        self.invoke::<i64>(&self.scripts.settle_event, &[], &[&seq, &retry, &now])
            .await
            .map(drop)
    }

    pub(super) async fn stats(&self) -> Result<OutboxStats, StoreError> {
        let mut connection = self.connection().await?;
        let (depth, oldest): (u64, Vec<(String, f64)>) = redis::pipe()
            .zcard(ALL)
            .zrange_withscores(ALL, 0, 0)
            .query_async(&mut connection)
            .await
            .map_err(|err| self.failed(&err))?;
        Ok(OutboxStats {
            depth,
            oldest_ms: oldest.first().map(|(_, at)| *at as u64),
            overflowed: 0,
        })
    }
}
