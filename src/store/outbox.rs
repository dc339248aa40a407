//! The webhook outbox's values (see [`crate::webhook`]): an event to
//! deliver to one URL, as queued and taken, and how full the outbox is.
//! Every store keeps them with the write they announce (`OutboxStore`).

/// How long an event taken for delivery is the taker's alone: longer
/// than a delivery may take ([`crate::webhook::DELIVERY_TIMEOUT`], 10 s).
/// A replica killed while sending leaves it to the others this long.
pub const EVENT_LEASE: std::time::Duration = std::time::Duration::from_secs(15);

/// A webhook event to deliver to one URL (see [`crate::webhook`]): written
/// to the store's outbox with the write it announces.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    /// The event's id (`X-Chatgate-Delivery`), the same for every URL.
    pub id: String,
    pub event_type: String,
    /// The URL it goes to.
    pub target: String,
    /// Events with the same `target` and `order` are delivered in order.
    pub order: String,
    /// The body, as sent on every attempt.
    pub body: String,
}

/// An undelivered event as the outbox holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct QueuedEvent {
    /// Its place in the outbox (oldest first).
    pub seq: i64,
    pub event: OutboxEvent,
    /// When it was queued, in milliseconds since the Unix epoch.
    pub queued_at_ms: u64,
    /// Failed attempts so far.
    pub attempts: u32,
}

/// How full the outbox is.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OutboxStats {
    pub depth: u64,
    /// When the oldest undelivered event was queued (ms since the epoch).
    pub oldest_ms: Option<u64>,
    /// Events refused because the (memory) outbox was full, ever.
    pub overflowed: u64,
}
