//! The webhook outbox of an SQLite store: the `webhook_outbox` table, in
//! the store's own file, written in the transactions of the records its
//! events announce (see [`crate::webhook`]).
//!
//! One row per event and URL. `ord` names the event's session: a row is
//! taken only when it is the oldest of its URL and session. A taken row is
//! leased to the sender in memory: leases die with the process, which is
//! the store's only user (the file is locked).
//!
//! Rows are added in the run's transactions (`synchronous = FULL`: an
//! event is on disk with what it announces). Taking reads; settling
//! deletes or reschedules on a second connection with `synchronous =
//! NORMAL` (WAL: it survives the process's crash, not the machine's): a
//! settle lost to a power cut only sends its event again, which at least
//! once allows, and the run's writes never wait on a delivery's fsync.

use std::collections::HashMap;
use std::sync::Mutex;

use rusqlite::{params, Connection};

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
             seq          INTEGER PRIMARY KEY AUTOINCREMENT,
             id           TEXT NOT NULL,
             event_type   TEXT NOT NULL,
             target       TEXT NOT NULL,
             ord          TEXT NOT NULL,
             body         TEXT NOT NULL,
             queued_at    INTEGER NOT NULL,
             attempts     INTEGER NOT NULL DEFAULT 0,
             retry_at     INTEGER NOT NULL
         );
         CREATE INDEX IF NOT EXISTS webhook_outbox_order ON webhook_outbox (target, ord, seq);",
    )
}

/// Adds `events` to the outbox, due now (in the caller's transaction).
pub(super) fn queue(c: &Connection, events: &[OutboxEvent]) -> rusqlite::Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let now = crate::store::now_ms() as i64;
    let mut insert = c.prepare_cached(
        "INSERT INTO webhook_outbox (id, event_type, target, ord, body, queued_at, retry_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?6)",
    )?;
    for e in events {
        insert.execute(params![e.id, e.event_type, e.target, e.order, e.body, now])?;
    }
    Ok(())
}

/// Takes (leases) at most `limit` due rows, each its session's oldest.
pub(super) fn take(
    c: &Connection,
    leases: &Mutex<HashMap<i64, u64>>,
    now_ms: u64,
    limit: usize,
) -> rusqlite::Result<Vec<QueuedEvent>> {
    let mut leases = leases.lock().unwrap_or_else(|p| p.into_inner());
    leases.retain(|_, until| *until > now_ms);
    let mut statement = c.prepare_cached(
        "SELECT seq, id, event_type, target, ord, body, queued_at, attempts
         FROM webhook_outbox o
         WHERE retry_at <= ?1
           AND seq = (SELECT MIN(seq) FROM webhook_outbox p
                      WHERE p.target = o.target AND p.ord = o.ord)
         ORDER BY seq LIMIT ?2",
    )?;
    let wanted = (limit + leases.len()) as i64;
    let rows = statement.query_map(params![now_ms as i64, wanted], |row| {
        Ok(QueuedEvent {
            seq: row.get(0)?,
            event: OutboxEvent {
                id: row.get(1)?,
                event_type: row.get(2)?,
                target: row.get(3)?,
                order: row.get(4)?,
                body: row.get(5)?,
            },
            queued_at_ms: row.get::<_, i64>(6)? as u64,
            attempts: row.get(7)?,
        })
    })?;
    let until = now_ms + EVENT_LEASE.as_millis() as u64;
    let mut due = Vec::new();
    for row in rows {
        let queued = row?;
        if due.len() < limit && !leases.contains_key(&queued.seq) {
            leases.insert(queued.seq, until);
            due.push(queued);
        }
    }
    Ok(due)
}

/// Taken rows, in one transaction: each gone (`None`), or tried again at
/// its retry time.
pub(super) fn settle(
    c: &Connection,
    leases: &Mutex<HashMap<i64, u64>>,
    settled: &[(i64, Option<u64>)],
) -> rusqlite::Result<()> {
    let tx = c.unchecked_transaction()?;
    for (seq, retry_at_ms) in settled {
        match retry_at_ms {
            None => tx.execute("DELETE FROM webhook_outbox WHERE seq = ?1", params![seq])?,
            Some(at) => tx.execute(
                "UPDATE webhook_outbox SET attempts = attempts + 1, retry_at = ?2 WHERE seq = ?1",
                params![seq, *at as i64],
            )?,
        };
    }
    tx.commit()?;
    let mut leases = leases.lock().unwrap_or_else(|p| p.into_inner());
    for (seq, _) in settled {
        leases.remove(seq);
    }
    Ok(())
}

pub(super) fn stats(c: &Connection) -> rusqlite::Result<OutboxStats> {
    c.query_row(
        "SELECT COUNT(*), MIN(queued_at) FROM webhook_outbox",
        [],
        |row| {
            Ok(OutboxStats {
                depth: row.get::<_, i64>(0)? as u64,
                oldest_ms: row.get::<_, Option<i64>>(1)?.map(|ms| ms as u64),
                overflowed: 0,
            })
        },
    )
}
