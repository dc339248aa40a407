//! Kept run outcomes (`--keep-outcome`) in the store's file: one row per
//! session, the latest run's, until its time is over.
//!
//! A stored run's outcome is written in its end's transaction (the
//! writer's: a burst of ends shares its commits; on the outbox's
//! connection each would wait for the writer's lock, and every read there
//! behind it). A run that never paused has no record to end: its outcome
//! is written on the outbox's connection (`synchronous = NORMAL`, a
//! convenience a power cut may lose, not a decision). Bounded by time (rows past `until` go at every
//! write) and by count ([`MAX_KEPT_OUTCOMES`], looked at every
//! [`COUNT_EVERY`] writes, the oldest going first).

use rusqlite::{params, Connection, OptionalExtension};

use crate::store::Outcome;

/// The most outcomes the file keeps.
pub const MAX_KEPT_OUTCOMES: i64 = 1_000_000;
/// Writes between two looks at the count.
pub const COUNT_EVERY: u64 = 1024;

/// The table, made at open.
pub fn create(c: &Connection) -> rusqlite::Result<()> {
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS outcomes (
             namespace TEXT NOT NULL,
             session   TEXT NOT NULL,
             outcome   TEXT NOT NULL,
             until     INTEGER NOT NULL,
             PRIMARY KEY (namespace, session)
         ) WITHOUT ROWID;
         CREATE INDEX IF NOT EXISTS outcomes_until ON outcomes (until);",
    )
}

/// `None` (no keys) as the column stores it.
fn column(namespace: Option<&str>) -> &str {
    namespace.unwrap_or("-")
}

/// Keeps `outcome` until `until` (ms), replacing the session's last;
/// what is past its time at `now` goes, and past the count the oldest.
/// Inside a transaction the caller holds (a run's end's, or its own).
pub fn write(
    c: &Connection,
    namespace: Option<&str>,
    outcome: &Outcome,
    now: i64,
    until: i64,
    count_now: bool,
) -> rusqlite::Result<()> {
    let json = serde_json::to_string(outcome).unwrap_or_default();
    c.prepare_cached(
        "INSERT OR REPLACE INTO outcomes (namespace, session, outcome, until) \
         VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![column(namespace), outcome.session_id, json, until])?;
    c.prepare_cached("DELETE FROM outcomes WHERE until <= ?1")?
        .execute(params![now])?;
    if count_now {
        let rows: i64 = c.query_row("SELECT COUNT(*) FROM outcomes", [], |row| row.get(0))?;
        if rows > MAX_KEPT_OUTCOMES {
            c.execute(
                "DELETE FROM outcomes WHERE (namespace, session) IN \
                 (SELECT namespace, session FROM outcomes ORDER BY until LIMIT ?1)",
                params![rows - MAX_KEPT_OUTCOMES],
            )?;
        }
    }
    Ok(())
}

/// The session's kept outcome, if its time is not over at `now`.
pub fn find(
    c: &Connection,
    namespace: Option<&str>,
    session: &str,
    now: i64,
) -> rusqlite::Result<Option<Outcome>> {
    let json: Option<String> = c
        .query_row(
            "SELECT outcome FROM outcomes WHERE namespace = ?1 AND session = ?2 AND until > ?3",
            params![column(namespace), session, now],
            |row| row.get(0),
        )
        .optional()?;
    Ok(json.and_then(|json| serde_json::from_str(&json).ok()))
}
