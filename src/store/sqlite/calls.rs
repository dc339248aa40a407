//! The execution journal (see [`crate::store::execution`]) in the store's
//! file: one row per call of a decided pause (by its key), its latest
//! entry. A `started`
//! is written on the writer's connection (`synchronous = FULL`: on disk
//! before the call begins); a `finished` on the outbox's (`synchronous =
//! NORMAL`, WAL): it survives a crash of the process (`kill -9`) as soon as
//! it is written, and a power cut may lose it, after which the call reads
//! as cut short: called again only when its tool is idempotent, its
//! reconcile says so, or a person chooses, never unasked. That spares a
//! call one fsync (docs/benchmarks.md). A run's rows go with its end.

use rusqlite::{params, Connection};

use crate::store::CallEntry;

/// The table, made at open.
pub fn create(c: &Connection) -> rusqlite::Result<()> {
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS calls (
             run             TEXT NOT NULL,
             key             TEXT NOT NULL,
             confirmation_id TEXT NOT NULL,
             task            INTEGER NOT NULL,
             entry           TEXT NOT NULL,
             PRIMARY KEY (run, key)
         ) WITHOUT ROWID;",
    )
}

/// Keeps `entry` of `run`, replacing the one before of its call (its key).
pub fn keep(c: &Connection, run: &str, entry: &CallEntry) -> rusqlite::Result<()> {
    let json = serde_json::to_string(entry).unwrap_or_default();
    c.prepare_cached(
        "INSERT OR REPLACE INTO calls (run, key, confirmation_id, task, entry)
         VALUES (?1, ?2, ?3, ?4, ?5)",
    )?
    .execute(params![
        run,
        entry.key,
        entry.confirmation_id,
        entry.index as i64,
        json
    ])
    .map(drop)
}

/// The entries of `run`'s pause `confirmation_id`, by task. One this
/// version cannot read counts as started and not finished (logged): its
/// call may have run, so it is never simply run again.
pub fn of(c: &Connection, run: &str, confirmation_id: &str) -> rusqlite::Result<Vec<CallEntry>> {
    let mut statement = c.prepare_cached(
        "SELECT task, entry FROM calls WHERE run = ?1 AND confirmation_id = ?2 ORDER BY task, key",
    )?;
    let rows = statement.query_map(params![run, confirmation_id], |row| {
        Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
    })?;
    let mut entries = Vec::new();
    for row in rows {
        let (task, json) = row?;
        entries.push(serde_json::from_str(&json).unwrap_or_else(|err| {
            log::warn!("run {run}: task {task}'s journal entry is unreadable ({err})");
            CallEntry::unreadable(confirmation_id, usize::try_from(task).unwrap_or(0))
        }));
    }
    Ok(entries)
}

/// Drops `run`'s entries (its end, its removal).
pub fn forget(c: &Connection, run: &str) -> rusqlite::Result<()> {
    c.prepare_cached("DELETE FROM calls WHERE run = ?1")?
        .execute(params![run])
        .map(drop)
}
