//! The webhook outbox of an SQLite store: the `webhook_outbox` table, in
//! the store's own file, written in the transactions of the records its
//! events announce (see [`crate::webhook`]).
//!
//! One row per event and URL. `ord` names the event's session: a row is
//! taken only when it is the oldest of its URL and session. When each may
//! be taken is kept in memory ([`Schedule`], rebuilt from the table at
//! open): taking costs no query when nothing is due, and one lookup per
//! event taken, however many wait behind a receiver that is down. Leases
//! are in memory too: they die with the process, which is the store's
//! only user (the file is locked).
//!
//! Rows are added in the run's transactions (`synchronous = FULL`: an
//! event is on disk with what it announces). Taking reads; settling
//! deletes or reschedules on a second connection with `synchronous =
//! NORMAL` (WAL: it survives the process's crash, not the machine's),
//! together at most [`FLUSH_EVERY`] after the first: a settle lost to a
//! crash only sends its event again, which at least once allows, and the
//! run's writes never wait on a delivery's.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, Connection};

use crate::store::schedule::{queue_of, Schedule, Slot};
use crate::store::{OutboxEvent, OutboxStats, QueuedEvent, EVENT_LEASE};

/// The outbox's connection to the store's file at `path`.
pub(super) fn open(path: &std::path::Path) -> rusqlite::Result<Connection> {
    let c = Connection::open(path)?;
    c.execute_batch(
        "PRAGMA synchronous = NORMAL;
         PRAGMA busy_timeout = 5000;",
    )?;
    Ok(c)
}

/// Creates the table, if new.
pub(super) fn create(c: &Connection) -> rusqlite::Result<()> {
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS webhook_outbox (
             seq          INTEGER PRIMARY KEY,
             id           TEXT NOT NULL,
             event_type   TEXT NOT NULL,
             target       TEXT NOT NULL,
             ord          TEXT NOT NULL,
             body         TEXT NOT NULL,
             queued_at    INTEGER NOT NULL,
             attempts     INTEGER NOT NULL DEFAULT 0,
             retry_at     INTEGER NOT NULL
         );",
    )
}

/// Settles are written together, at most this long after the first.
pub(super) const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// What this process knows of the outbox beyond the table.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    schedule: Schedule,
    /// Settled, not yet written: gone (`None`) or tried again then.
    settled: HashMap<i64, Option<u64>>,
    flushed_at: u64,
}

/// The ledger of the rows a previous process left.
pub(super) fn ledger(c: &Connection) -> rusqlite::Result<Ledger> {
    let mut ledger = Ledger::default();
    let mut rows = c.prepare(
        "SELECT seq, target, ord, queued_at, attempts, retry_at FROM webhook_outbox ORDER BY seq",
    )?;
    let rows = rows.query_map([], |row| {
        let queue = queue_of(&row.get::<_, String>(1)?, &row.get::<_, String>(2)?);
        let slot = Slot {
            seq: row.get(0)?,
            queued_at_ms: row.get::<_, i64>(3)? as u64,
            attempts: row.get(4)?,
            retry_at_ms: row.get::<_, i64>(5)? as u64,
        };
        Ok((queue, slot))
    })?;
    for row in rows {
        let (queue, slot) = row?;
        ledger.schedule.push(queue, slot);
    }
    Ok(ledger)
}

/// Adds `events` to the outbox, due now (in the caller's transaction);
/// once it commits, [`scheduled`] takes what this returns.
pub(super) fn queue(
    c: &Connection,
    events: &[OutboxEvent],
) -> rusqlite::Result<Vec<(Arc<str>, Slot)>> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let now = crate::clock::now_ms();
    let mut insert = c.prepare_cached(
        "INSERT INTO webhook_outbox (id, event_type, target, ord, body, queued_at, retry_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
    )?;
    let mut queued = Vec::with_capacity(events.len());
    for e in events {
        insert.execute(params![
            e.id,
            e.event_type,
            e.target,
            e.order,
            e.body,
            now as i64
        ])?;
        let slot = Slot {
            seq: c.last_insert_rowid(),
            queued_at_ms: now,
            attempts: 0,
            retry_at_ms: now,
        };
        queued.push((queue_of(&e.target, &e.order), slot));
    }
    Ok(queued)
}

/// Committed events join the schedule (under the connection's lock, so in
/// the order they were written).
pub(super) fn scheduled(ledger: &Mutex<Ledger>, queued: Vec<(Arc<str>, Slot)>) {
    if queued.is_empty() {
        return;
    }
    let mut ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
    for (queue, slot) in queued {
        ledger.schedule.push(queue, slot);
    }
}

/// Takes (leases) at most `limit` due events: their slots.
pub(super) fn take(ledger: &Mutex<Ledger>, now_ms: u64, limit: usize) -> Vec<Slot> {
    let mut ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
    let lease_until = now_ms + EVENT_LEASE.as_millis() as u64;
    ledger.schedule.take(now_ms, limit, lease_until)
}

/// The taken events' rows; settles noted long enough ago are written first.
pub(super) fn read(
    c: &Connection,
    ledger: &Mutex<Ledger>,
    slots: Vec<Slot>,
    now_ms: u64,
) -> rusqlite::Result<Vec<QueuedEvent>> {
    {
        let mut ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
        if !ledger.settled.is_empty()
            && (now_ms >= ledger.flushed_at + FLUSH_EVERY.as_millis() as u64
                || ledger.settled.len() >= 1024)
        {
            write_settled(c, &mut ledger, now_ms)?;
        }
    }
    let mut row = c.prepare_cached(
        "SELECT id, event_type, target, ord, body FROM webhook_outbox WHERE seq = ?1",
    )?;
    let mut due = Vec::with_capacity(slots.len());
    for slot in slots {
        let event = row.query_row(params![slot.seq], |row| {
            Ok(OutboxEvent {
                id: row.get(0)?,
                event_type: row.get(1)?,
                target: row.get(2)?,
                order: row.get(3)?,
                body: row.get(4)?,
            })
        })?;
        due.push(QueuedEvent {
            seq: slot.seq,
            event,
            queued_at_ms: slot.queued_at_ms,
            attempts: slot.attempts,
        });
    }
    Ok(due)
}

/// Notes settled events (written within [`FLUSH_EVERY`]): each gone
/// (`None`), or tried again at its retry time.
pub(super) fn settle(ledger: &Mutex<Ledger>, settled: &[(i64, Option<u64>)]) {
    let mut ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
    for (seq, retry_at_ms) in settled {
        ledger.schedule.settle(*seq, *retry_at_ms);
        ledger.settled.insert(*seq, *retry_at_ms);
    }
}

/// Writes every noted settle, in one transaction.
pub(super) fn flush(c: &Connection, ledger: &Mutex<Ledger>) -> rusqlite::Result<()> {
    let mut ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
    write_settled(c, &mut ledger, crate::clock::now_ms())
}

fn write_settled(c: &Connection, ledger: &mut Ledger, now_ms: u64) -> rusqlite::Result<()> {
    let tx = c.unchecked_transaction()?;
    for (seq, retry_at_ms) in &ledger.settled {
        match retry_at_ms {
            None => tx.execute("DELETE FROM webhook_outbox WHERE seq = ?1", params![seq])?,
            Some(at) => tx.execute(
                "UPDATE webhook_outbox SET attempts = attempts + 1, retry_at = ?2 WHERE seq = ?1",
                params![seq, *at as i64],
            )?,
        };
    }
    tx.commit()?;
    ledger.settled.clear();
    ledger.flushed_at = now_ms;
    Ok(())
}

pub(super) fn stats(ledger: &Mutex<Ledger>) -> OutboxStats {
    let ledger = ledger.lock().unwrap_or_else(|p| p.into_inner());
    OutboxStats {
        depth: ledger.schedule.len() as u64,
        oldest_ms: ledger.schedule.oldest_ms(),
        overflowed: 0,
    }
}
