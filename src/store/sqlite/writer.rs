//! The store's writer: one thread owns the connection to the file and
//! commits what has queued meanwhile together (group commit).
//!
//! A write (a pause, a decision, an end, a grant, a read too) is a job: a
//! closure sent to the thread with a channel to answer on. The thread takes
//! every job that is waiting, at most [`MOST_PER_BATCH`], opens one
//! transaction, runs each job in a savepoint of its own (a job that fails is
//! rolled back alone: it did nothing, and the others stand), commits once
//! (one fsync: `synchronous = FULL`), and only then answers every job of the
//! batch. Nothing is answered before its rows are on disk; a commit that
//! fails answers every job of its batch with the failure (none of them was
//! written). One job alone is one transaction, as before: a lone decision
//! waits for no one, and a burst of them shares its fsyncs.
//!
//! Jobs wait in an unbounded channel: each belongs to a caller awaiting its
//! answer (a run, a request), so how many can wait is bounded by how many
//! runs and requests the server admits (`--max-runs`, the HTTP workers),
//! not by the channel.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rusqlite::Connection;
use tokio::sync::oneshot;

use super::outbox::{self, Ledger};
use crate::store::schedule::Slot;
use crate::store::OutboxEvent;

/// The most jobs one transaction carries (a bound on how long the first
/// of them waits for the others' work, not on memory).
pub(super) const MOST_PER_BATCH: usize = 512;

/// What a job writes with: the connection, inside its batch's
/// transaction, and the webhook events it queued.
pub(super) struct Tx<'c> {
    connection: &'c Connection,
    queued: Vec<(Arc<str>, Slot)>,
}

impl Tx<'_> {
    /// Adds `events` to the outbox with the job's rows; they join the
    /// delivery schedule once the batch has committed (and not at all if
    /// the job or the commit fails).
    pub(super) fn queue(&mut self, events: &[OutboxEvent]) -> rusqlite::Result<()> {
        let queued = outbox::queue(self.connection, events)?;
        self.queued.extend(queued);
        Ok(())
    }
}

impl std::ops::Deref for Tx<'_> {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        self.connection
    }
}

/// A job as the thread sees it: run it, then answer it.
trait Job: Send {
    /// Runs the job's work; `Some` with the events it queued when it
    /// succeeded.
    fn run(&mut self, connection: &Connection) -> Option<Vec<(Arc<str>, Slot)>>;
    /// Answers the caller: the job's own result if the batch committed.
    fn answer(self: Box<Self>, committed: Result<(), String>);
}

struct Pending<T, F> {
    work: Option<F>,
    result: Option<Result<T, String>>,
    reply: oneshot::Sender<Result<T, String>>,
}

impl<T, F> Job for Pending<T, F>
where
    T: Send,
    F: FnOnce(&mut Tx<'_>) -> rusqlite::Result<T> + Send,
{
    fn run(&mut self, connection: &Connection) -> Option<Vec<(Arc<str>, Slot)>> {
        let work = self.work.take()?;
        let mut tx = Tx {
            connection,
            queued: Vec::new(),
        };
        // A job that panics failed: the thread, and every other job, go on.
        let result = match catch_unwind(AssertUnwindSafe(|| work(&mut tx))) {
            Ok(result) => result.map_err(|err| err.to_string()),
            Err(_) => Err("a store write panicked".to_owned()),
        };
        let queued = result.is_ok().then_some(tx.queued);
        self.result = Some(result);
        queued
    }

    fn answer(self: Box<Self>, committed: Result<(), String>) {
        let result = match (committed, self.result) {
            (Ok(()), Some(result)) => result,
            (Err(reason), _) => Err(reason),
            (Ok(()), None) => Err("the write did not run".to_owned()),
        };
        let _ = self.reply.send(result);
    }
}

/// The handle: sends jobs; dropping it lets the thread finish what was
/// sent, then waits for it.
#[derive(Debug)]
pub(super) struct Writer {
    jobs: Option<mpsc::Sender<Box<dyn Job>>>,
    thread: Option<JoinHandle<()>>,
    /// Transactions begun so far (read by the tests: how jobs were
    /// grouped; counting costs one relaxed add per batch).
    #[cfg_attr(not(test), allow(dead_code))]
    batches: Arc<AtomicU64>,
}

impl Writer {
    /// Starts the thread that owns `connection`; committed events join
    /// `ledger`'s schedule in the order they were written.
    pub(super) fn start(
        connection: Connection,
        ledger: Arc<Mutex<Ledger>>,
    ) -> std::io::Result<Writer> {
        let (jobs, waiting) = mpsc::channel::<Box<dyn Job>>();
        let batches = Arc::new(AtomicU64::new(0));
        let counted = batches.clone();
        let thread = std::thread::Builder::new()
            .name("sqlite-writer".to_owned())
            .spawn(move || write(connection, waiting, ledger, counted))?;
        Ok(Writer {
            jobs: Some(jobs),
            thread: Some(thread),
            batches,
        })
    }

    /// How many transactions the writer has begun.
    #[cfg(test)]
    pub(super) fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Queues `work` for the next batch at once (in call order); the
    /// future is its answer once the batch is on disk.
    pub(super) fn run<T, F>(
        &self,
        work: F,
    ) -> impl std::future::Future<Output = Result<T, String>> + Send + 'static
    where
        T: Send + 'static,
        F: FnOnce(&mut Tx<'_>) -> rusqlite::Result<T> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let job = Box::new(Pending {
            work: Some(work),
            result: None,
            reply,
        });
        let sent = self.jobs.as_ref().map(|jobs| jobs.send(job));
        let sent = matches!(sent, Some(Ok(())));
        async move {
            let stopped = || Err("the store's writer has stopped".to_owned());
            if !sent {
                return stopped();
            }
            answer.await.unwrap_or_else(|_| stopped())
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread: batches until every sender is gone.
fn write(
    connection: Connection,
    waiting: mpsc::Receiver<Box<dyn Job>>,
    ledger: Arc<Mutex<Ledger>>,
    batches: Arc<AtomicU64>,
) {
    while let Ok(first) = waiting.recv() {
        batches.fetch_add(1, Ordering::Relaxed);
        let mut batch = vec![first];
        while batch.len() < MOST_PER_BATCH {
            match waiting.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        let committed =
            commit(&connection, &mut batch).map(|queued| outbox::scheduled(&ledger, queued));
        for job in batch {
            job.answer(committed.clone());
        }
    }
}

/// One transaction for `batch`, a savepoint per job: the events the jobs
/// that succeeded queued, once it has committed.
fn commit(c: &Connection, batch: &mut [Box<dyn Job>]) -> Result<Vec<(Arc<str>, Slot)>, String> {
    c.execute_batch("BEGIN IMMEDIATE")
        .map_err(|err| err.to_string())?;
    let mut queued = Vec::new();
    let mut run = || -> rusqlite::Result<()> {
        for job in batch.iter_mut() {
            c.execute_batch("SAVEPOINT job")?;
            match job.run(c) {
                Some(events) => {
                    c.execute_batch("RELEASE job")?;
                    queued.extend(events);
                }
                None => c.execute_batch("ROLLBACK TO job; RELEASE job")?,
            }
        }
        c.execute_batch("COMMIT")
    };
    match run() {
        Ok(()) => Ok(queued),
        Err(err) => {
            // Nothing of the batch stays: every job is answered with this.
            let _ = c.execute_batch("ROLLBACK");
            Err(err.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer on a fresh file, with `schema` made first.
    fn writer(dir: &tempfile::TempDir, schema: &str) -> Writer {
        let c = Connection::open(dir.path().join("w.db")).unwrap();
        c.execute_batch(schema).unwrap();
        Writer::start(c, Arc::default()).unwrap()
    }

    /// Holds the writer's thread until the returned sender is dropped: what
    /// is sent meanwhile waits, and goes in one batch.
    fn hold(writer: &Arc<Writer>) -> (mpsc::Sender<()>, tokio::task::JoinHandle<()>) {
        let (release, held) = mpsc::channel::<()>();
        let holding = writer.run(move |_| Ok(held.recv()));
        let holding = tokio::spawn(async move {
            let _ = holding.await;
        });
        (release, holding)
    }

    /// Waits until `n` batches have begun.
    async fn begun(writer: &Writer, n: u64) {
        while writer.batches() < n {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
    }

    fn insert(
        value: &'static str,
    ) -> impl FnOnce(&mut Tx<'_>) -> rusqlite::Result<usize> + Send + 'static {
        move |tx| tx.execute("INSERT INTO t (v) VALUES (?1)", [value])
    }

    fn rows(dir: &tempfile::TempDir) -> Vec<String> {
        let c = Connection::open(dir.path().join("w.db")).unwrap();
        let mut rows = c.prepare("SELECT v FROM t ORDER BY v").unwrap();
        let rows = rows.query_map([], |row| row.get(0)).unwrap();
        rows.collect::<Result<_, _>>().unwrap()
    }

    #[tokio::test]
    async fn what_queues_meanwhile_is_one_transaction_and_a_failing_job_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Arc::new(writer(&dir, "CREATE TABLE t (v TEXT PRIMARY KEY);"));
        let (release, holding) = hold(&writer);
        begun(&writer, 1).await;
        // Each is queued behind the held one as it is called.
        let jobs: Vec<_> = ["a", "b", "a", "c"]
            .into_iter()
            .map(|value| tokio::spawn(writer.run(insert(value))))
            .collect();
        drop(release);
        holding.await.unwrap();
        let mut answers = Vec::new();
        for job in jobs {
            answers.push(job.await.unwrap());
        }

        assert_eq!(writer.batches(), 2, "the held job, then one batch of four");
        let failed: Vec<_> = answers.iter().filter(|a| a.is_err()).collect();
        assert_eq!(failed.len(), 1, "{answers:?}");
        assert!(
            failed[0].as_ref().unwrap_err().contains("UNIQUE"),
            "{answers:?}"
        );
        assert_eq!(rows(&dir), ["a", "b", "c"], "the others stand");
    }

    #[tokio::test]
    async fn a_commit_that_fails_answers_every_job_of_its_batch_and_keeps_none() {
        let dir = tempfile::tempdir().unwrap();
        // A deferred foreign key fails at COMMIT, not in the job.
        let writer = Arc::new(writer(
            &dir,
            "PRAGMA foreign_keys = ON;
             CREATE TABLE p (id INTEGER PRIMARY KEY);
             CREATE TABLE t (v TEXT PRIMARY KEY,
                 p INTEGER REFERENCES p (id) DEFERRABLE INITIALLY DEFERRED);",
        ));
        let (release, holding) = hold(&writer);
        begun(&writer, 1).await;
        let good = tokio::spawn(writer.run(insert("kept?")));
        let dangling =
            tokio::spawn(writer.run(|tx| tx.execute("INSERT INTO t (v, p) VALUES ('x', 7)", [])));
        drop(release);
        holding.await.unwrap();
        let good = good.await.unwrap();
        let dangling = dangling.await.unwrap();

        assert_eq!(writer.batches(), 2);
        assert!(
            good.as_ref().unwrap_err().contains("FOREIGN KEY"),
            "{good:?}"
        );
        assert!(dangling.is_err(), "{dangling:?}");
        assert!(rows(&dir).is_empty(), "nothing of the batch was kept");
        // The writer goes on.
        writer.run(insert("later")).await.unwrap();
        assert_eq!(rows(&dir), ["later"]);
    }

    #[tokio::test]
    async fn a_job_that_panics_fails_alone_and_the_writer_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let writer = writer(&dir, "CREATE TABLE t (v TEXT PRIMARY KEY);");
        let panicked = writer
            .run(|tx| -> rusqlite::Result<()> {
                tx.execute("INSERT INTO t (v) VALUES ('half')", [])?;
                panic!("a bug in a job")
            })
            .await;
        assert!(panicked.unwrap_err().contains("panicked"));
        writer.run(insert("after")).await.unwrap();
        assert_eq!(
            rows(&dir),
            ["after"],
            "the panicking job's row was rolled back"
        );
    }
}
