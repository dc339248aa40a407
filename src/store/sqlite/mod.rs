//! `--store sqlite:PATH`: paused runs in an SQLite file, for one node.
//!
//! rusqlite with SQLite bundled (no system library to install, the same
//! SQLite everywhere). The database runs in WAL mode with `synchronous =
//! FULL`: a record is on disk when a write returns, so a decision answered
//! 200 survives a `kill -9` or a power cut. Writes are small (one row per
//! paused run, its record as JSON) and run on one thread of their own,
//! which commits what has queued meanwhile in one transaction (group
//! commit, `writer.rs`): a burst of pauses and decisions shares its fsyncs,
//! and none is answered before it is on disk.
//!
//! An ended run's row keeps its end (`ended`: its final chunk, its pauses'
//! ids) until `ended_until` (milliseconds since the Unix epoch: the end
//! plus `--detach-grace`), and of its record only who the run was (its
//! frames, state, tasks and message are dropped at the end); every end
//! written, and every start, deletes the rows past theirs. A file from an
//! earlier version gets the two columns at open.

mod calls;
mod checkpoint;
mod file_lock;
mod grants;
mod outbox;
mod outcomes;
mod parked;
mod records;
mod writer;

use std::fs::{File, OpenOptions};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use rusqlite::{params, Connection, OptionalExtension};

use super::{
    compact, CallEntry, Fault, Grant, KeptOutcome, OutboxEvent, OutboxStats, Outcome,
    PauseProgress, PausedRecord, QueuedEvent, Resolution, RunEnd, Store, StoreError,
    StoredDecision,
};
use crate::session::SessionKey;

#[derive(Debug)]
pub struct SqliteStore {
    /// The thread that owns the connection the records are written on, and
    /// commits them in groups (see [`writer`]).
    writer: writer::Writer,
    /// The webhook outbox's own connection to the same file (see
    /// [`outbox`]): taking and settling events never waits on, nor delays,
    /// a run's writes.
    outbox: Arc<Mutex<Connection>>,
    /// Events taken for delivery (leases die with the process, which
    /// alone uses the file, so they are not written) and settled ones
    /// not yet written.
    ledger: Arc<Mutex<outbox::Ledger>>,
    name: String,
    path: PathBuf,
    /// The database file itself, locked (`flock`) for as long as this
    /// process keeps the store: every name of the file (a symlink, a hard
    /// link) is the same lock. The kernel lets go when the process ends,
    /// `kill -9` included.
    file: File,
    /// The last write succeeded (for `/readyz`).
    healthy: Arc<AtomicBool>,
    /// How long an ended run's end is kept (`--detach-grace`).
    grace: Duration,
    /// Copies the write-ahead log into the file, off the write path.
    _checkpointer: checkpoint::Checkpointer,
    /// Outcomes kept so far (every [`outcomes::COUNT_EVERY`]th looks at
    /// the count).
    outcomes_kept: Arc<std::sync::atomic::AtomicU64>,
}

impl SqliteStore {
    /// Opens (or creates) the store at `path`, for this process alone: a
    /// second process on the same file, under any name, would restore the
    /// same paused runs and could act on one twice, so it is refused.
    pub fn open(path: &Path, grace: Duration) -> Result<SqliteStore, String> {
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .map_err(|err| format!("{err}: {}", path.display()))?;
        file_lock::lock(&file, path)?;
        let connection = Connection::open(path).map_err(|err| err.to_string())?;
        connection
            .execute_batch(
                "PRAGMA journal_mode = WAL;
                 PRAGMA synchronous = FULL;
                 PRAGMA busy_timeout = 5000;
                 CREATE TABLE IF NOT EXISTS paused_runs (
                     run         TEXT PRIMARY KEY,
                     record      TEXT NOT NULL,
                     decision    TEXT,
                     ended       TEXT,
                     ended_until INTEGER
                 );",
            )
            .map_err(|err| err.to_string())?;
        // Checkpoints are the checkpointer's; a commit's own only should
        // it fall behind (see `checkpoint`).
        connection
            .pragma_update(None, "wal_autocheckpoint", checkpoint::BACKSTOP_PAGES)
            .map_err(|err| err.to_string())?;
        add_end_columns(&connection).map_err(|err| err.to_string())?;
        SqliteStore::add_park_columns(&connection).map_err(|err| err.to_string())?;
        outbox::create(&connection).map_err(|err| err.to_string())?;
        outcomes::create(&connection).map_err(|err| err.to_string())?;
        grants::create(&connection).map_err(|err| err.to_string())?;
        calls::create(&connection).map_err(|err| err.to_string())?;
        let outbox = outbox::open(path).map_err(|err| err.to_string())?;
        outbox
            .pragma_update(None, "wal_autocheckpoint", checkpoint::BACKSTOP_PAGES)
            .map_err(|err| err.to_string())?;
        let checkpointer = checkpoint::Checkpointer::start(path)
            .map_err(|err| format!("cannot start the store's checkpoints: {err}"))?;
        let ledger = Arc::new(Mutex::new(
            outbox::ledger(&outbox).map_err(|err| err.to_string())?,
        ));
        Ok(SqliteStore {
            writer: writer::Writer::start(connection, ledger.clone())
                .map_err(|err| format!("cannot start the store's writer: {err}"))?,
            outbox: Arc::new(Mutex::new(outbox)),
            ledger,
            name: format!("sqlite:{}", path.display()),
            path: path.to_owned(),
            file,
            healthy: Arc::new(AtomicBool::new(true)),
            grace,
            _checkpointer: checkpointer,
            outcomes_kept: Arc::default(),
        })
    }

    /// Whether this outcome kept is one that looks at the count too
    /// (every [`outcomes::COUNT_EVERY`]).
    fn count_outcome_now(&self) -> bool {
        self.outcomes_kept
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(outcomes::COUNT_EVERY)
    }

    /// Runs `work` in the writer's next transaction (see [`writer`]): its
    /// answer once that is on disk.
    fn with<T: Send + 'static>(
        &self,
        work: impl FnOnce(&mut writer::Tx<'_>) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<'_, Result<T, StoreError>> {
        Box::pin(async move {
            let done = self.writer.run(work).await;
            self.answered(done)
        })
    }

    /// Runs `work` on the outbox's connection, off the async threads.
    fn with_outbox<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Connection) -> rusqlite::Result<T> + Send + 'static,
    ) -> BoxFuture<'_, Result<T, StoreError>> {
        let connection = self.outbox.clone();
        Box::pin(async move {
            let done = tokio::task::spawn_blocking(move || {
                // A panic elsewhere leaves the connection usable.
                let connection = connection.lock().unwrap_or_else(|p| p.into_inner());
                work(&connection).map_err(|err| err.to_string())
            })
            .await
            .unwrap_or_else(|err| Err(err.to_string()));
            self.answered(done)
        })
    }

    fn answered<T>(&self, done: Result<T, String>) -> Result<T, StoreError> {
        self.healthy.store(done.is_ok(), Ordering::Relaxed);
        // An SQLite statement that fails is rolled back: it did nothing.
        done.map_err(|reason| StoreError {
            store: self.name.clone(),
            reason,
            fault: Fault::Unreachable,
        })
    }
}

impl Store for SqliteStore {
    fn is_durable(&self) -> bool {
        true
    }

    /// Not ready while writes fail, or once the file is no longer the one
    /// this process holds (removed or replaced: what is written then is lost
    /// at the next restart), or no longer writable for this process (the
    /// next restart would fail).
    fn health(&self) -> Result<(), String> {
        let same_file = match (std::fs::metadata(&self.path), self.file.metadata()) {
            (Ok(named), Ok(held)) => named.dev() == held.dev() && named.ino() == held.ino(),
            _ => false,
        };
        let writable = nix::unistd::access(&self.path, nix::unistd::AccessFlags::W_OK).is_ok();
        match (self.healthy.load(Ordering::Relaxed), same_file, writable) {
            (true, true, true) => Ok(()),
            (false, _, _) => Err(format!("{} (writes fail)", self.name)),
            (_, false, _) => Err(format!(
                "{} (the file was removed or replaced: records written now would be lost)",
                self.name
            )),
            (_, _, false) => Err(format!("{} (the file is read-only)", self.name)),
        }
    }

    fn save<'a>(
        &'a self,
        record: PausedRecord,
        events: &'a [OutboxEvent],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let packed = compact::encode(&record);
        let (ns, session, pause, expires_at, timer_due) = SqliteStore::park_columns(&record);
        let events = events.to_vec();
        self.with(move |tx| {
            tx.prepare_cached(
                "INSERT INTO paused_runs (run, record, decision, ns, session, pause, expires_at,
                     timer_due, parked)
                 VALUES (?1, ?2, NULL, ?3, ?4, ?5, ?6, ?7, 0)
                 ON CONFLICT(run) DO UPDATE SET record = excluded.record, decision = NULL,
                     ended = NULL, ended_until = NULL, ns = excluded.ns,
                     session = excluded.session, pause = excluded.pause,
                     expires_at = excluded.expires_at, timer_due = excluded.timer_due, parked = 0",
            )?
            .execute(params![
                record.run, packed, ns, session, pause, expires_at, timer_due
            ])?;
            tx.queue(&events)
        })
    }

    fn record_decision<'a>(
        &'a self,
        run: &'a str,
        _key: &'a SessionKey,
        decision: &'a StoredDecision,
        events: &'a [OutboxEvent],
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let run = run.to_owned();
        let json = serde_json::to_string(decision).unwrap_or_default();
        let events = events.to_vec();
        let updating = self.with(move |tx| {
            let updated = tx
                .prepare_cached("UPDATE paused_runs SET decision = ?2, parked = 0 WHERE run = ?1")?
                .execute(params![run, json])?;
            if updated > 0 {
                tx.queue(&events)?;
            }
            Ok(updated)
        });
        Box::pin(async move {
            match updating.await? {
                0 => Err(StoreError {
                    store: self.name.clone(),
                    reason: "the run's record is gone".to_owned(),
                    fault: Fault::Lost,
                }),
                _ => Ok(()),
            }
        })
    }

    fn resolve<'a>(
        &'a self,
        run: &'a str,
        _key: &'a SessionKey,
        nonce: &'a str,
    ) -> BoxFuture<'a, Result<Resolution, StoreError>> {
        // SQLite's answers are never unknown; this only reads what is there.
        let run = run.to_owned();
        let reading = self.with(move |c| {
            c.query_row(
                "SELECT decision FROM paused_runs WHERE run = ?1",
                params![run],
                |row| row.get::<_, Option<String>>(0),
            )
            .optional()
        });
        let nonce = nonce.to_owned();
        Box::pin(async move {
            let decided = reading.await?.flatten();
            let ours = decided
                .and_then(|d| serde_json::from_str::<StoredDecision>(&d).ok())
                .is_some_and(|d| d.nonce == nonce);
            Ok(if ours {
                Resolution::Recorded
            } else {
                Resolution::Void
            })
        })
    }

    fn end<'a>(
        &'a self,
        run: &'a str,
        key: &'a SessionKey,
        end: &'a RunEnd,
        events: &'a [OutboxEvent],
        outcome: Option<&'a KeptOutcome>,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        // Kept in the end's transaction: a burst of ends shares the writer's
        // commits, where the outbox's connection would wait for its lock.
        let outcome = outcome.map(|kept| (kept.clone(), self.count_outcome_now()));
        let run = run.to_owned();
        let json = serde_json::to_string(end).unwrap_or_default();
        let now = crate::clock::now_ms_i64();
        let grace = self.grace;
        let until = now + grace.as_millis() as i64;
        let events = events.to_vec();
        let (session, end) = (key.session_id.clone(), end.clone());
        self.with(move |tx| {
            if let Some((kept, count_now)) = &outcome {
                let until = now + kept.keep.as_millis() as i64;
                let namespace = kept.namespace.as_deref();
                outcomes::write(tx, namespace, &kept.outcome, now, until, *count_now)?;
            }
            calls::forget(tx, &run)?;
            if grace.is_zero() {
                tx.prepare_cached("DELETE FROM paused_runs WHERE run = ?1")?
                    .execute(params![run])?;
            } else {
                // The record keeps who the run was, not what it paused on
                // (its frames, its engine's state, its tasks, its message):
                // an ended run costs the file and a restart a small constant.
                // Its ended form, as Redis keeps it, as text: written without
                // reading the record.
                let namespace: Option<Option<String>> = tx
                    .prepare_cached("SELECT ns FROM paused_runs WHERE run = ?1")?
                    .query_row(params![run], |row| row.get(0))
                    .optional()?;
                if let Some(namespace) = namespace {
                    let record = PausedRecord::ended_form(&run, namespace, &session, &end);
                    let record = serde_json::to_string(&record).unwrap_or_default();
                    tx.prepare_cached(
                        "UPDATE paused_runs SET ended = ?2, ended_until = ?3, parked = 0,
                             record = ?4, approvals = NULL
                         WHERE run = ?1",
                    )?
                    .execute(params![run, json, until, record])?;
                }
                delete_past_ends(tx, now)?;
            }
            tx.queue(&events)
        })
    }

    fn record_progress<'a>(
        &'a self,
        run: &'a str,
        _key: &'a SessionKey,
        step: &'a PauseProgress,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let run = run.to_owned();
        let step = step.clone();
        let timer = step.is_timer_step().then_some(step.next_timer_ms);
        let expires_at = step.expires_at_ms;
        // Read, step and written on the store's one connection: steps of
        // one pause (an approval, its reminder) never overwrite each other.
        self.with(move |c| {
            let kept: Option<Option<String>> = c
                .query_row(
                    "SELECT approvals FROM paused_runs WHERE run = ?1",
                    params![run],
                    |row| row.get(0),
                )
                .optional()?;
            let Some(kept) = kept else {
                return Ok(());
            };
            let progress = match PauseProgress::join(&step.confirmation_id, [kept.as_deref()]) {
                Some(kept) => kept.then(step),
                None => step,
            };
            let json = serde_json::to_string(&progress).unwrap_or_default();
            c.execute(
                "UPDATE paused_runs SET approvals = ?2 WHERE run = ?1",
                params![run, json],
            )?;
            // A timer's step moves the next timer (and an escalation the
            // expiry) that the sweep of parked pauses reads.
            if let Some(due) = timer {
                let due = due.map(|due| due as i64);
                c.execute(
                    "UPDATE paused_runs SET timer_due = ?2 WHERE run = ?1",
                    params![run, due],
                )?;
            }
            if let Some(expires_at) = expires_at {
                c.execute(
                    "UPDATE paused_runs SET expires_at = ?2 WHERE run = ?1",
                    params![run, expires_at as i64],
                )?;
            }
            Ok(())
        })
    }

    fn remove(&self, run: &str, _key: &SessionKey) -> BoxFuture<'_, Result<(), StoreError>> {
        let run = run.to_owned();
        self.with(move |c| {
            calls::forget(c, &run)?;
            c.execute("DELETE FROM paused_runs WHERE run = ?1", params![run])
                .map(drop)
        })
    }

    /// Every record, ended ones within their grace first, oldest first: a
    /// session's paused run is restored after (and so over) its ended ones.
    fn load(&self) -> BoxFuture<'_, Result<Vec<PausedRecord>, StoreError>> {
        self.load_where("1")
    }

    fn locate<'a>(
        &'a self,
        confirmation_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<super::Located>, StoreError>> {
        self.locate_pause(confirmation_id)
    }

    fn pending<'a>(
        &'a self,
        namespace: Option<&'a str>,
        after: Option<&'a str>,
        limit: usize,
    ) -> BoxFuture<'a, Result<Vec<PausedRecord>, StoreError>> {
        self.pending_page(namespace, after, limit)
    }
}

impl super::ExecutionStore for SqliteStore {
    fn journal_call<'a>(
        &'a self,
        run: &'a str,
        _key: &'a SessionKey,
        entry: &'a CallEntry,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let run = run.to_owned();
        let entry = entry.clone();
        if entry.finished.is_some() {
            // Durable against a crash of the process once written (WAL);
            // a power cut may lose it, and the call then reads as cut
            // short, which never runs it again unasked (`calls.rs`).
            return self.with_outbox(move |c| calls::keep(c, &run, &entry));
        }
        self.with(move |c| calls::keep(c, &run, &entry))
    }
}

impl super::GrantStore for SqliteStore {
    fn add_grant<'a>(&'a self, grant: &'a Grant) -> BoxFuture<'a, Result<bool, StoreError>> {
        let grant = grant.clone();
        let now = crate::clock::now_ms_i64();
        self.with(move |c| grants::add(c, &grant, now))
    }

    fn grants<'a>(
        &'a self,
        namespace: Option<&'a str>,
    ) -> BoxFuture<'a, Result<Vec<Grant>, StoreError>> {
        let namespace = namespace.map(str::to_owned);
        let now = crate::clock::now_ms_i64();
        self.with(move |c| grants::list(c, namespace.as_deref(), now))
    }

    fn take_grant_call<'a>(
        &'a self,
        id: &'a str,
    ) -> BoxFuture<'a, Result<Option<u32>, StoreError>> {
        let id = id.to_owned();
        let now = crate::clock::now_ms_i64();
        self.with(move |c| grants::take(c, &id, now))
    }

    fn revoke_grant<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Option<Grant>, StoreError>> {
        let id = id.to_owned();
        self.with(move |c| grants::revoke(c, &id))
    }
}

impl super::OutboxStore for SqliteStore {
    fn announce<'a>(&'a self, events: &'a [OutboxEvent]) -> BoxFuture<'a, Result<(), StoreError>> {
        let events = events.to_vec();
        self.with(move |tx| tx.queue(&events))
    }

    fn due_events(
        &self,
        now_ms: u64,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<QueuedEvent>, StoreError>> {
        let slots = outbox::take(&self.ledger, now_ms, limit);
        if slots.is_empty() {
            return Box::pin(async { Ok(Vec::new()) });
        }
        let ledger = self.ledger.clone();
        self.with_outbox(move |c| outbox::read(c, &ledger, slots, now_ms))
    }

    fn settle_events(
        &self,
        settled: Vec<(i64, Option<u64>)>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        outbox::settle(&self.ledger, &settled);
        Box::pin(async { Ok(()) })
    }

    fn flush_outbox(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let ledger = self.ledger.clone();
        self.with_outbox(move |c| outbox::flush(c, &ledger))
    }

    fn outbox_stats(&self) -> BoxFuture<'_, Result<OutboxStats, StoreError>> {
        let stats = outbox::stats(&self.ledger);
        Box::pin(async move { Ok(stats) })
    }
}

impl super::OutcomeStore for SqliteStore {
    fn keep_outcome<'a>(
        &'a self,
        namespace: Option<&'a str>,
        outcome: &'a Outcome,
        keep: Duration,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        let namespace = namespace.map(str::to_owned);
        let outcome = outcome.clone();
        let now = crate::clock::now_ms_i64();
        let until = now + keep.as_millis() as i64;
        let count_now = self.count_outcome_now();
        self.with_outbox(move |c| {
            let tx = c.unchecked_transaction()?;
            outcomes::write(&tx, namespace.as_deref(), &outcome, now, until, count_now)?;
            tx.commit()
        })
    }

    fn outcome<'a>(
        &'a self,
        namespace: Option<&'a str>,
        session_id: &'a str,
    ) -> BoxFuture<'a, Result<Option<Outcome>, StoreError>> {
        let namespace = namespace.map(str::to_owned);
        let session_id = session_id.to_owned();
        let now = crate::clock::now_ms_i64();
        self.with_outbox(move |c| outcomes::find(c, namespace.as_deref(), &session_id, now))
    }
}

/// Deletes the ended runs whose grace is over.
fn delete_past_ends(c: &Connection, now: i64) -> rusqlite::Result<()> {
    c.prepare_cached("DELETE FROM paused_runs WHERE ended_until IS NOT NULL AND ended_until <= ?1")?
        .execute(params![now])
        .map(drop)
}

/// The names of `paused_runs`' columns (an earlier version's lacks some).
fn paused_columns(c: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut columns = c.prepare("SELECT name FROM pragma_table_info('paused_runs')")?;
    let names = columns.query_map([], |row| row.get(0))?;
    names.collect()
}

/// A table an earlier version made lacks the end's columns.
fn add_end_columns(c: &Connection) -> rusqlite::Result<()> {
    let names = paused_columns(c)?;
    if !names.iter().any(|name| name == "ended") {
        c.execute_batch(
            "ALTER TABLE paused_runs ADD COLUMN ended TEXT;
             ALTER TABLE paused_runs ADD COLUMN ended_until INTEGER;",
        )?;
    }
    // What happened to the pause while it waited (a `PauseProgress`; the
    // column's name is from when it held only a quorum's approvals).
    if !names.iter().any(|name| name == "approvals") {
        c.execute_batch("ALTER TABLE paused_runs ADD COLUMN approvals TEXT;")?;
    }
    c.execute_batch(
        "CREATE INDEX IF NOT EXISTS paused_runs_ended_until ON paused_runs (ended_until)",
    )
}

#[cfg(test)]
mod tests;
