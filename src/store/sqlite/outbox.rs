//! The webhook outbox of an SQLite store: the `webhook_outbox` table, in
//! the store's own file, written in the transactions of the records its
//! events announce (see [`crate::webhook`]).
//!
//! One row per event and URL. `ord` names the event's session: a row is
//! taken only when it is the oldest of its URL and session. A taken row is
//! leased (`leased_until`) to the sender; leases die with the process, which
//! is the store's only user (the file is locked).

use rusqlite::{params, Connection};

use crate::store::{OutboxEvent, OutboxStats, QueuedEvent, EVENT_LEASE};

/// Creates the table (if new) and frees the leases a previous process held.
pub(super) fn open(c: &Connection) -> rusqlite::Result<()> {
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
             retry_at     INTEGER NOT NULL,
             leased_until INTEGER
         );
         CREATE INDEX IF NOT EXISTS webhook_outbox_order ON webhook_outbox (target, ord, seq);
         UPDATE webhook_outbox SET leased_until = NULL;",
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
    now_ms: u64,
    limit: usize,
) -> rusqlite::Result<Vec<QueuedEvent>> {
    let leased_until = (now_ms + EVENT_LEASE.as_millis() as u64) as i64;
    let tx = c.unchecked_transaction()?;
    let mut statement = tx.prepare_cached(
        "SELECT seq, id, event_type, target, ord, body, queued_at, attempts
         FROM webhook_outbox o
         WHERE retry_at <= ?1 AND (leased_until IS NULL OR leased_until <= ?1)
           AND seq = (SELECT MIN(seq) FROM webhook_outbox p
                      WHERE p.target = o.target AND p.ord = o.ord)
         ORDER BY seq LIMIT ?2",
    )?;
    let rows = statement.query_map(params![now_ms as i64, limit as i64], |row| {
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
    let due: Vec<QueuedEvent> = rows.collect::<rusqlite::Result<_>>()?;
    drop(statement);
    for queued in &due {
        tx.execute(
            "UPDATE webhook_outbox SET leased_until = ?2 WHERE seq = ?1",
            params![queued.seq, leased_until],
        )?;
    }
    tx.commit()?;
    Ok(due)
}

/// A taken row: gone (`None`), or tried again at `retry_at_ms`.
pub(super) fn settle(c: &Connection, seq: i64, retry_at_ms: Option<u64>) -> rusqlite::Result<()> {
    match retry_at_ms {
        None => c.execute("DELETE FROM webhook_outbox WHERE seq = ?1", params![seq])?,
        Some(at) => c.execute(
            "UPDATE webhook_outbox SET attempts = attempts + 1, retry_at = ?2, leased_until = NULL
             WHERE seq = ?1",
            params![seq, at as i64],
        )?,
    };
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
