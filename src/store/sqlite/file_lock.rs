//! The file's lock: one process per `sqlite:` file (see
//! [`SqliteStore::file`](super::SqliteStore)).

use std::fs::{File, TryLockError};
use std::path::Path;
use std::time::Duration;

/// How long [`lock`] waits for a lock held elsewhere before it says so.
///
/// A lock is the open file's, so a child forked by this process (a command
/// tool, an MCP server, between its fork and its exec) holds it for a
/// moment after the store that took it is gone; so does a process that is
/// still exiting. A store that is really in use stays locked far longer.
const LOCK_WAIT: Duration = Duration::from_secs(5);

/// Takes the file's lock (see `SqliteStore::file`), waiting at most
/// [`LOCK_WAIT`] for a holder that is letting go.
pub(super) fn lock(file: &File, path: &Path) -> Result<(), String> {
    let mut waited = Duration::ZERO;
    let step = Duration::from_millis(20);
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(()),
            Err(TryLockError::WouldBlock) if waited < LOCK_WAIT => {
                std::thread::sleep(step);
                waited += step;
            }
            Err(TryLockError::WouldBlock) => {
                return Err(format!(
                    "another chatgate process uses this store ({} is locked, under this name \
                     or another); one process per sqlite: file (replicas share redis:// instead)",
                    path.display()
                ))
            }
            Err(TryLockError::Error(err)) => return Err(format!("{err}: {}", path.display())),
        }
    }
}
