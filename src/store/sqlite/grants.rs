//! Grants in the store's file, on the decisions' connection (synced like
//! a decision: a grant a person gave survives a power cut). One row per
//! grant; the calls left are a column, spent by one conditional UPDATE.

use rusqlite::{params, Connection, OptionalExtension};

use crate::store::grant::{newest_first, Grant, MAX_GRANTS_PER_NAMESPACE};

/// The table, made at open.
pub fn create(c: &Connection) -> rusqlite::Result<()> {
    c.execute_batch(
        "CREATE TABLE IF NOT EXISTS grants (
             id         TEXT PRIMARY KEY,
             namespace  TEXT NOT NULL,
             expires_at INTEGER NOT NULL,
             calls_left INTEGER NOT NULL,
             grant_json TEXT NOT NULL
         );
         CREATE INDEX IF NOT EXISTS grants_namespace ON grants (namespace, expires_at);",
    )
}

/// Adds `grant` unless its namespace holds the most live grants already;
/// what expired or was spent goes first.
pub fn add(c: &Connection, grant: &Grant, now: i64) -> rusqlite::Result<bool> {
    // In the writer's transaction (a savepoint of its own): all or nothing.
    let tx = c;
    tx.execute(
        "DELETE FROM grants WHERE expires_at <= ?1 OR calls_left <= 0",
        params![now],
    )?;
    let live: i64 = tx.query_row(
        "SELECT COUNT(*) FROM grants WHERE namespace = ?1",
        params![grant.namespace],
        |row| row.get(0),
    )?;
    if live >= MAX_GRANTS_PER_NAMESPACE as i64 {
        return Ok(false);
    }
    tx.execute(
        "INSERT INTO grants (id, namespace, expires_at, calls_left, grant_json) \
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            grant.id,
            grant.namespace,
            grant.expires_at_ms as i64,
            grant.calls_left,
            serde_json::to_string(grant).unwrap_or_default()
        ],
    )?;
    Ok(true)
}

/// The live grants of `namespace` (`None`: all), newest first, each with
/// the calls it has left.
pub fn list(c: &Connection, namespace: Option<&str>, now: i64) -> rusqlite::Result<Vec<Grant>> {
    let mut statement = c.prepare_cached(
        "SELECT grant_json, calls_left FROM grants \
         WHERE expires_at > ?1 AND calls_left > 0 AND (?2 IS NULL OR namespace = ?2)",
    )?;
    let rows = statement.query_map(params![now, namespace], |row| {
        Ok((row.get::<_, String>(0)?, row.get::<_, u32>(1)?))
    })?;
    let mut grants = Vec::new();
    for row in rows {
        let (json, left) = row?;
        if let Ok(mut grant) = serde_json::from_str::<Grant>(&json) {
            grant.calls_left = left;
            grants.push(grant);
        }
    }
    newest_first(&mut grants);
    Ok(grants)
}

/// Uses one call of grant `id`: the calls left after it, or `None`.
pub fn take(c: &Connection, id: &str, now: i64) -> rusqlite::Result<Option<u32>> {
    c.query_row(
        "UPDATE grants SET calls_left = calls_left - 1 \
         WHERE id = ?1 AND calls_left > 0 AND expires_at > ?2 RETURNING calls_left",
        params![id, now],
        |row| row.get(0),
    )
    .optional()
}

/// Removes grant `id`; what it was, if it was there.
pub fn revoke(c: &Connection, id: &str) -> rusqlite::Result<Option<Grant>> {
    let json: Option<String> = c
        .query_row(
            "DELETE FROM grants WHERE id = ?1 RETURNING grant_json",
            params![id],
            |row| row.get(0),
        )
        .optional()?;
    Ok(json.and_then(|json| serde_json::from_str(&json).ok()))
}
