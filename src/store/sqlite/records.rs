//! Reading records back: a row's record joined with its decision, its
//! end, its pause's progress and its calls; the loads a start makes.

use futures_util::future::BoxFuture;
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension};

use super::{calls, delete_past_ends, SqliteStore};
use crate::store::compact;
use crate::store::{PauseProgress, PausedRecord, StoreError};

/// A row's record (its JSON: `None` when this version cannot read it),
/// decision, end and progress, as read.
type Row = (
    Option<Vec<u8>>,
    Option<String>,
    Option<String>,
    Option<String>,
);

/// The JSON a row's `record` column holds: text (an earlier version's) as
/// it is, a compressed record expanded; `None` for what this version
/// cannot read.
fn record_json(value: ValueRef<'_>) -> Option<Vec<u8>> {
    match value {
        ValueRef::Text(text) => Some(text.to_vec()),
        ValueRef::Blob(blob) => compact::expand(blob),
        _ => None,
    }
}

/// Reads `record, decision, ended, approvals`.
pub(super) fn read_row(row: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    let record = record_json(row.get_ref(0)?);
    Ok((record, row.get(1)?, row.get(2)?, row.get(3)?))
}

/// The record a row holds, with its decision, its end, its pause's
/// progress and its calls; `None` (logged) when this version cannot read
/// it: not a reason to refuse to start.
pub(super) fn record_of(c: &Connection, row: Row) -> rusqlite::Result<Option<PausedRecord>> {
    let (record, decision, ended, approvals) = row;
    let Some(record) = record else {
        log::warn!("skipping a stored run this version cannot read (not a record it wrote)");
        return Ok(None);
    };
    let mut record = match serde_json::from_slice::<PausedRecord>(&record) {
        Ok(record) => record,
        Err(err) => {
            log::warn!("skipping an unreadable stored run: {err}");
            return Ok(None);
        }
    };
    record.decision = decision.and_then(|d| serde_json::from_str(&d).ok());
    record.ended = ended.and_then(|e| serde_json::from_str(&e).ok());
    // Only the progress of the pause the record holds.
    record.progress = PauseProgress::join(&record.confirmation_id, [approvals.as_deref()]);
    if record.may_have_calls() {
        record.calls = calls::of(c, &record.run, &record.confirmation_id)?;
    }
    Ok(Some(record))
}

impl SqliteStore {
    /// The records `condition` selects, ended ones within their grace
    /// first, oldest first.
    pub(super) fn load_where(
        &self,
        condition: &'static str,
    ) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        self.with(move |c| {
            delete_past_ends(c, crate::clock::now_ms_i64())?;
            let mut statement = c.prepare(&format!(
                "SELECT record, decision, ended, approvals FROM paused_runs
                 WHERE {condition} ORDER BY ended IS NULL, ended_until"
            ))?;
            let rows = statement
                .query_map([], read_row)?
                .collect::<Result<Vec<_>, _>>()?;
            let mut records = Vec::new();
            for row in rows {
                records.extend(record_of(c, row)?);
            }
            Ok(records)
        })
    }
}

impl SqliteStore {
    /// The record of `run` as JSON text (see [`compact`]), if its row is there
    /// and this version can read it.
    pub(super) fn record_text(c: &Connection, run: &str) -> rusqlite::Result<Option<String>> {
        let json = c
            .prepare_cached("SELECT record FROM paused_runs WHERE run = ?1")?
            .query_row(params![run], |row| Ok(record_json(row.get_ref(0)?)))
            .optional()?;
        Ok(json.flatten().and_then(|json| String::from_utf8(json).ok()))
    }

    /// The record of `run` as JSON, if any (for tests and inspection).
    pub fn get(&self, run: &str) -> BoxFuture<'_, Result<Option<String>, StoreError>> {
        let run = run.to_owned();
        self.with(move |c| SqliteStore::record_text(c, &run))
    }
}
