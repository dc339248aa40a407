//! Parked pauses in the file (#46): the columns and indexes that find a
//! paused run without reading its record, and the [`ParkStore`] port.
//!
//! Each row of `paused_runs` also names, in columns of their own, its
//! namespace (`ns`), session, pause id, expiry and next timer (the record
//! keeps them too; these are what the indexes read), and whether it is
//! `parked`: its run is in no process's memory. Four indexes serve the
//! lookups, none of which reads more rows than it returns:
//!
//! - a session's run (a reply, a re-attach: the wake);
//! - a pause by its id (an approver's reply, a link, a button);
//! - the pending pauses of a namespace by expiry (the inbox, paged);
//! - the parked pauses by expiry and by next timer (the one sweep).
//!
//! Every undecided paused row is parked when the file is opened: no process
//! holds its run yet. A save, a decision and an end unpark a row. A file
//! from an earlier version gets the columns, filled from the records, at
//! open.

use futures_util::future::BoxFuture;
use rusqlite::{params, Connection, OptionalExtension};

use super::records::{read_row, record_of};
use super::SqliteStore;
use crate::session::SessionKey;
use crate::store::compact;
use crate::store::{DueBatch, DueFrom, Located, ParkStore, ParkedLog, PausedRecord, StoreError};

impl SqliteStore {
    /// Adds the columns and indexes (a file of an earlier version has
    /// neither) and parks every undecided paused row: no process holds one
    /// at open.
    pub(super) fn add_park_columns(c: &Connection) -> rusqlite::Result<()> {
        let names = super::paused_columns(c)?;
        if !names.iter().any(|name| name == "parked") {
            c.execute_batch(
                "ALTER TABLE paused_runs ADD COLUMN ns TEXT;
                 ALTER TABLE paused_runs ADD COLUMN session TEXT;
                 ALTER TABLE paused_runs ADD COLUMN pause TEXT;
                 ALTER TABLE paused_runs ADD COLUMN expires_at INTEGER;
                 ALTER TABLE paused_runs ADD COLUMN timer_due INTEGER;
                 ALTER TABLE paused_runs ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
                 UPDATE paused_runs SET
                     ns = json_extract(record, '$.namespace'),
                     session = json_extract(record, '$.session_id'),
                     pause = json_extract(record, '$.confirmation_id'),
                     expires_at = json_extract(record, '$.expires_at_ms'),
                     timer_due = json_extract(record, '$.timer_due_ms');",
            )?;
        }
        c.execute_batch(
            "CREATE INDEX IF NOT EXISTS paused_runs_session ON paused_runs (session, ns);
             CREATE INDEX IF NOT EXISTS paused_runs_pause ON paused_runs (pause);
             CREATE INDEX IF NOT EXISTS paused_runs_pending ON paused_runs (ns, expires_at, pause)
                 WHERE decision IS NULL AND ended IS NULL;
             CREATE INDEX IF NOT EXISTS paused_runs_parked_expiry ON paused_runs (expires_at)
                 WHERE parked = 1;
             CREATE INDEX IF NOT EXISTS paused_runs_parked_timer ON paused_runs (timer_due)
                 WHERE parked = 1 AND timer_due IS NOT NULL;
             UPDATE paused_runs SET parked = 1
                 WHERE decision IS NULL AND ended IS NULL AND parked = 0;",
        )
    }

    /// The columns a save writes beside the record (see
    /// [`SqliteStore::add_park_columns`]).
    pub(super) fn park_columns(
        record: &PausedRecord,
    ) -> (Option<String>, String, String, i64, Option<i64>) {
        (
            record.namespace.clone(),
            record.session_id.clone(),
            record.confirmation_id.clone(),
            record.expires_at_ms as i64,
            record.timer_due_ms.map(|due| due as i64),
        )
    }
}

const RECORD_COLUMNS: &str = "record, decision, ended, approvals";

impl ParkStore for SqliteStore {
    fn park<'a>(
        &'a self,
        run: &'a str,
        _key: &'a SessionKey,
        log: &'a ParkedLog,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let run = run.to_owned();
        let log = log.clone();
        // The record as saved, with the whole log in place of its last
        // frames, compacted again (see `compact`); as it is when it holds
        // that log already.
        self.with(move |c| {
            if log.as_stored {
                return c
                    .prepare_cached(
                        "UPDATE paused_runs SET parked = 1
                         WHERE run = ?1 AND decision IS NULL AND ended IS NULL",
                    )?
                    .execute(params![run])
                    .map(drop);
            }
            let Some(json) = SqliteStore::record_text(c, &run)? else {
                return Ok(());
            };
            let Ok(mut record) = serde_json::from_str::<PausedRecord>(&json) else {
                return Ok(());
            };
            (record.frames, record.next_seq) = (log.frames, log.next_seq);
            record.request_seq = log.request_seq;
            c.prepare_cached(
                "UPDATE paused_runs SET parked = 1, record = ?2
                 WHERE run = ?1 AND decision IS NULL AND ended IS NULL",
            )?
            .execute(params![run, compact::encode(&record)])
            .map(drop)
        })
    }

    fn parked_run<'a>(
        &'a self,
        namespace: Option<&'a str>,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<PausedRecord>, StoreError>> {
        let (namespace, session_id) = (namespace.map(str::to_owned), session_id.to_owned());
        self.with_outbox(move |c| {
            let row = c
                .prepare_cached(&format!(
                    "SELECT {RECORD_COLUMNS} FROM paused_runs
                     WHERE session = ?1 AND ns IS ?2 AND decision IS NULL AND ended IS NULL
                     ORDER BY rowid DESC LIMIT 1"
                ))?
                .query_row(params![session_id, namespace], read_row)
                .optional()?;
            match row {
                Some(row) => record_of(c, row),
                None => Ok(None),
            }
        })
    }

    fn unpark<'a>(&'a self, run: &'a str) -> BoxFuture<'a, Result<(), StoreError>> {
        let run = run.to_owned();
        self.with(move |c| {
            c.prepare_cached("UPDATE paused_runs SET parked = 0 WHERE run = ?1 AND parked = 1")?
                .execute(params![run])
                .map(drop)
        })
    }

    fn parked_due(
        &self,
        now_ms: u64,
        from: DueFrom,
        limit: usize,
    ) -> BoxFuture<'_, Result<DueBatch<PausedRecord>, StoreError>> {
        let (now, limit) = (now_ms as i64, limit as i64);
        self.with_outbox(move |c| {
            // One read transaction: the pages read stay cached from one
            // record to the next (each statement alone would begin its own,
            // and find the cache stale after any commit of the writer's).
            let tx = c.unchecked_transaction()?;
            // Each of the two indexes read in its order from where the look
            // before stopped, at most `limit` rows each (one query over both
            // would sort every due row for each batch), then merged.
            let mut due: Vec<(i64, i64)> = Vec::new();
            let mut next = from;
            let mut more = false;
            for (query, after) in [
                (
                    "SELECT expires_at, rowid FROM paused_runs
                         WHERE parked = 1 AND expires_at <= ?1 AND expires_at >= ?3
                             AND (expires_at > ?3 OR rowid > ?4)
                         ORDER BY expires_at, rowid LIMIT ?2",
                    &mut next.expiry,
                ),
                (
                    "SELECT timer_due, rowid FROM paused_runs
                         WHERE parked = 1 AND timer_due IS NOT NULL AND timer_due <= ?1
                             AND timer_due >= ?3 AND (timer_due > ?3 OR rowid > ?4)
                         ORDER BY timer_due, rowid LIMIT ?2",
                    &mut next.timer,
                ),
            ] {
                let (at, row) = after.unwrap_or((i64::MIN, i64::MIN));
                let mut statement = tx.prepare_cached(query)?;
                let rows = statement.query_map(params![now, limit, at, row], |row| {
                    Ok((row.get(0)?, row.get(1)?))
                })?;
                let before = due.len();
                for row in rows {
                    due.push(row?);
                }
                more |= due.len() - before == limit as usize;
                *after = due
                    .last()
                    .filter(|_| due.len() > before)
                    .copied()
                    .or(*after);
            }
            due.sort_unstable();
            let mut rowids: Vec<i64> = Vec::with_capacity(due.len());
            let mut seen = std::collections::HashSet::with_capacity(due.len());
            for (_, rowid) in due {
                if seen.insert(rowid) {
                    rowids.push(rowid);
                }
            }
            let mut statement = tx.prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS} FROM paused_runs WHERE rowid = ?1"
            ))?;
            let mut records = Vec::with_capacity(rowids.len());
            for rowid in rowids {
                let row = statement.query_row(params![rowid], read_row).optional()?;
                if let Some(record) = row.map(|row| record_of(&tx, row)).transpose()? {
                    records.extend(record);
                }
            }
            Ok(DueBatch {
                records,
                more: more.then_some(next),
            })
        })
    }

    fn parked_sessions(&self) -> BoxFuture<'_, Result<Vec<Located>, StoreError>> {
        self.with_outbox(|c| {
            let mut statement =
                c.prepare_cached("SELECT ns, session FROM paused_runs WHERE parked = 1")?;
            let rows = statement.query_map([], |row| {
                Ok((
                    row.get::<_, Option<String>>(0)?,
                    row.get::<_, Option<String>>(1)?,
                ))
            })?;
            let mut found = Vec::new();
            for row in rows {
                if let (namespace, Some(session)) = row? {
                    found.push((namespace, session));
                }
            }
            Ok(found)
        })
    }

    fn parked_count(&self) -> BoxFuture<'_, Result<u64, StoreError>> {
        self.with_outbox(|c| {
            c.prepare_cached("SELECT COUNT(*) FROM paused_runs WHERE parked = 1")?
                .query_row([], |row| row.get::<_, i64>(0))
                .map(|n| n as u64)
        })
    }

    /// Every record but the parked pauses (undecided, not ended): what
    /// was at work, what had ended within its grace.
    fn load_unparked(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        self.load_where("NOT (decision IS NULL AND ended IS NULL)")
    }
}

impl SqliteStore {
    /// Where the pause `confirmation_id` is, while its row lasts and it has
    /// not ended.
    pub(super) fn locate_pause(
        &self,
        confirmation_id: &str,
    ) -> BoxFuture<'_, Result<Option<Located>, StoreError>> {
        let confirmation_id = confirmation_id.to_owned();
        self.with_outbox(move |c| {
            c.prepare_cached(
                "SELECT ns, session FROM paused_runs WHERE pause = ?1 AND ended IS NULL
                 ORDER BY rowid DESC LIMIT 1",
            )?
            .query_row(params![confirmation_id], |row| {
                Ok((row.get::<_, Option<String>>(0)?, row.get::<_, String>(1)?))
            })
            .optional()
        })
    }

    /// The undecided pauses of `namespace` not past their expiry, soonest
    /// expiry first (then by id), those after the pause `after` while it is
    /// pending: at most `limit`.
    pub(super) fn pending_page(
        &self,
        namespace: Option<&str>,
        after: Option<&str>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        let (namespace, after) = (namespace.map(str::to_owned), after.map(str::to_owned));
        let (now, limit) = (crate::clock::now_ms_i64(), limit as i64);
        self.with_outbox(move |c| {
            let from: Option<(i64, String)> = match &after {
                Some(after) => c
                    .prepare_cached(
                        "SELECT expires_at, pause FROM paused_runs WHERE pause = ?1
                             AND ns IS ?2 AND decision IS NULL AND ended IS NULL LIMIT 1",
                    )?
                    .query_row(params![after, namespace], |row| {
                        Ok((row.get(0)?, row.get(1)?))
                    })
                    .optional()?,
                None => None,
            };
            let (from_at, from_pause) = from.unwrap_or((now, String::new()));
            let mut statement = c.prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS} FROM paused_runs
                 WHERE ns IS ?1 AND decision IS NULL AND ended IS NULL AND expires_at > ?4
                     AND (expires_at > ?2 OR (expires_at = ?2 AND pause > ?3))
                 ORDER BY expires_at, pause LIMIT ?5"
            ))?;
            let rows = statement
                .query_map(
                    params![namespace, from_at, from_pause, now, limit],
                    read_row,
                )?
                .collect::<Result<Vec<_>, _>>()?;
            let mut records = Vec::with_capacity(rows.len());
            for row in rows {
                records.extend(record_of(c, row)?);
            }
            Ok(records)
        })
    }
}
