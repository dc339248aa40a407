//! When each undelivered webhook event of a one-process store may be taken
//! (see [`super::OutboxStore::due_events`]), kept in memory for `memory` and
//! `sqlite:` alike (the sqlite store rebuilds it from its table at open).
//!
//! One queue per URL and session, in order; only a queue's head is
//! scheduled, by when it may be taken: queued, its retry time after a
//! failure, or the end of its lease while it is being sent. Taking, settling
//! and queueing cost O(log n) however many events wait behind a receiver
//! that is down.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

/// One undelivered event, as the schedule knows it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slot {
    pub seq: i64,
    pub queued_at_ms: u64,
    pub attempts: u32,
    /// When it may be tried (ms since the epoch).
    pub retry_at_ms: u64,
}

#[derive(Debug, Default)]
pub struct Schedule {
    /// URL and session -> its events, oldest first.
    queues: HashMap<Arc<str>, VecDeque<Slot>>,
    /// The heads, by when they may be taken.
    due: BTreeSet<(u64, i64)>,
    /// A head's seq -> when it is due, and its queue.
    heads: HashMap<i64, (u64, Arc<str>)>,
    /// Every event by seq -> when it was queued.
    all: BTreeMap<i64, u64>,
}

/// The queue an event belongs to.
pub fn queue_of(target: &str, order: &str) -> Arc<str> {
    Arc::from(format!("{target}\n{order}"))
}

impl Schedule {
    pub fn len(&self) -> usize {
        self.all.len()
    }

    pub fn is_empty(&self) -> bool {
        self.all.is_empty()
    }

    /// When the oldest undelivered event was queued.
    pub fn oldest_ms(&self) -> Option<u64> {
        self.all.values().next().copied()
    }

    /// Adds an event at the end of its queue.
    pub fn push(&mut self, queue: Arc<str>, slot: Slot) {
        self.all.insert(slot.seq, slot.queued_at_ms);
        let events = self.queues.entry(queue.clone()).or_default();
        events.push_back(slot);
        if events.len() == 1 {
            self.due.insert((slot.retry_at_ms, slot.seq));
            self.heads.insert(slot.seq, (slot.retry_at_ms, queue));
        }
    }

    /// Takes at most `limit` heads due at `now_ms`, each leased until
    /// `lease_until` (then due again unless settled).
    pub fn take(&mut self, now_ms: u64, limit: usize, lease_until: u64) -> Vec<Slot> {
        let taken: Vec<(u64, i64)> = self
            .due
            .range(..=(now_ms, i64::MAX))
            .take(limit)
            .copied()
            .collect();
        let mut slots = Vec::with_capacity(taken.len());
        for (at, seq) in taken {
            self.due.remove(&(at, seq));
            self.due.insert((lease_until, seq));
            let Some((due_at, queue)) = self.heads.get_mut(&seq) else {
                continue;
            };
            *due_at = lease_until;
            if let Some(slot) = self.queues.get(queue).and_then(VecDeque::front) {
                slots.push(*slot);
            }
        }
        slots
    }

    /// A taken head: gone (`None`: its queue's next is due at its own
    /// time), or tried again at `retry_at_ms`. Settling what is not a head
    /// (settled already) does nothing.
    pub fn settle(&mut self, seq: i64, retry_at_ms: Option<u64>) {
        let Some((due_at, queue)) = self.heads.remove(&seq) else {
            return;
        };
        self.due.remove(&(due_at, seq));
        let Some(events) = self.queues.get_mut(&queue) else {
            return;
        };
        match retry_at_ms {
            Some(at) => {
                if let Some(head) = events.front_mut() {
                    head.attempts += 1;
                    head.retry_at_ms = at;
                }
                self.due.insert((at, seq));
                self.heads.insert(seq, (at, queue));
            }
            None => {
                events.pop_front();
                self.all.remove(&seq);
                match events.front() {
                    Some(next) => {
                        self.due.insert((next.retry_at_ms, next.seq));
                        self.heads.insert(next.seq, (next.retry_at_ms, queue));
                    }
                    None => {
                        self.queues.remove(&queue);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(seq: i64) -> Slot {
        Slot {
            seq,
            queued_at_ms: 10,
            attempts: 0,
            retry_at_ms: 10,
        }
    }

    #[test]
    fn a_queue_s_events_go_one_at_a_time_in_order_and_leases_run_out() {
        let mut schedule = Schedule::default();
        let (a, b) = (queue_of("u", "a"), queue_of("u", "b"));
        schedule.push(a.clone(), slot(1));
        schedule.push(a.clone(), slot(2));
        schedule.push(b, slot(3));

        let taken: Vec<i64> = schedule.take(100, 10, 1000).iter().map(|s| s.seq).collect();
        assert_eq!(taken, [1, 3]);
        assert!(schedule.take(100, 10, 1000).is_empty(), "leased");
        schedule.settle(1, Some(500));
        schedule.settle(3, None);
        assert!(schedule.take(499, 10, 1000).is_empty(), "2 waits for 1");
        let again = schedule.take(500, 10, 1500);
        assert_eq!(again[0].seq, 1);
        assert_eq!(again[0].attempts, 1);
        schedule.settle(1, None);
        assert_eq!(schedule.take(500, 10, 1500)[0].seq, 2);
        // A lease that runs out makes it due again.
        assert_eq!(schedule.take(1500, 10, 2500)[0].seq, 2);
        assert_eq!(schedule.len(), 1);
        schedule.settle(2, None);
        schedule.settle(2, None);
        assert_eq!(schedule.len(), 0);
        assert_eq!(schedule.oldest_ms(), None);
    }
}
