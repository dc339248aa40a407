//! Checkpoints off the write path (#46): SQLite copies its write-ahead log
//! into the file, by default, in the commit that takes the log past 1,000
//! pages, and that commit's callers wait for the copy and its fsync:
//! a decision among a million parked pauses writes pages all over the
//! file, and every hundred or so of them waited several milliseconds.
//!
//! A thread of its own runs a passive checkpoint every
//! [`EVERY`] on a connection of its own: it copies what the readers no
//! longer need, waits for nobody and makes nobody wait. The store's
//! connections keep a checkpoint of their own, at [`BACKSTOP_PAGES`], for
//! should this thread fall behind: the log stays bounded either way.

use std::path::Path;
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::Connection;

/// How often the thread checkpoints.
const EVERY: Duration = Duration::from_millis(100);

/// The log's size (pages of 4 KiB) at which a commit checkpoints itself.
pub(super) const BACKSTOP_PAGES: u32 = 10_000;

/// The checkpointing thread; stopped (and joined) on drop.
#[derive(Debug)]
pub(super) struct Checkpointer {
    stop: Arc<(Mutex<bool>, Condvar)>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    pub(super) fn start(path: &Path) -> rusqlite::Result<Checkpointer> {
        let c = Connection::open(path)?;
        c.execute_batch("PRAGMA busy_timeout = 5000;")?;
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("sqlite-checkpoint".to_owned())
            .spawn(move || run(&c, &stopping))
            .map_err(|err| rusqlite::Error::ToSqlConversionFailure(Box::new(err)))?;
        Ok(Checkpointer {
            stop,
            thread: Some(thread),
        })
    }
}

fn run(c: &Connection, stop: &(Mutex<bool>, Condvar)) {
    let (lock, wake) = stop;
    let mut stopped = lock.lock().unwrap_or_else(|poison| poison.into_inner());
    while !*stopped {
        let (guard, _) = wake
            .wait_timeout(stopped, EVERY)
            .unwrap_or_else(|poison| poison.into_inner());
        stopped = guard;
        if *stopped {
            break;
        }
        // Unlocked while it copies: a drop does not wait for the copy.
        drop(stopped);
        if let Err(err) = c.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            log::debug!("a checkpoint of the store's log failed (the next one tries again): {err}");
        }
        stopped = lock.lock().unwrap_or_else(|poison| poison.into_inner());
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        let (lock, wake) = &*self.stop;
        *lock.lock().unwrap_or_else(|poison| poison.into_inner()) = true;
        wake.notify_all();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_is_copied_into_the_file_without_a_commit_doing_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.db");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "PRAGMA journal_mode = WAL; PRAGMA wal_autocheckpoint = 0;
             CREATE TABLE t (v BLOB);",
        )
        .unwrap();
        for _ in 0..50 {
            c.execute("INSERT INTO t VALUES (zeroblob(8000))", [])
                .unwrap();
        }
        // Nothing copies the log into the file: the commits do not.
        let size = || std::fs::metadata(&path).unwrap().len();
        assert!(size() < 50 * 8000, "{}", size());
        let checkpointer = Checkpointer::start(&path).unwrap();
        // A pass comes every 100 ms; the bound only keeps a broken thread
        // from hanging the suite.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while size() < 50 * 8000 {
            assert!(std::time::Instant::now() < deadline, "never copied");
            std::thread::sleep(Duration::from_millis(20));
        }
        drop(checkpointer);
    }
}
