//! The logs a re-attach searches: each session's latest run's, live or
//! ended within its grace; and the sessions of the last
//! [`REMEMBERED_PAUSES`] pauses of runs whose logs went, so that a
//! decision link (which names only its pause) still finds whom to ask for
//! the run's kept outcome: who decided it.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::replay::Replay;
use crate::session::SessionKey;

/// Pauses of forgotten logs whose sessions are remembered (each entry a
/// pause id and a session key: a few hundred bytes at most, so at most
/// about 1 MiB).
pub const REMEMBERED_PAUSES: usize = 4096;

/// Sessions' latest logs, for re-attach. Cheap-clone handle.
#[derive(Clone, Default)]
pub struct ReplayRegistry {
    logs: Arc<Mutex<HashMap<SessionKey, Arc<Replay>>>>,
    remembered: Arc<Mutex<VecDeque<(String, SessionKey)>>>,
    wakes: Arc<Turns>,
    /// A hash of each session whose run may be parked (#46): a request
    /// about any other session does not ask the store (8 bytes a pause).
    parked: Arc<Mutex<HashSet<u64>>>,
}

/// One lock per stripe of sessions: one wake of a parked run at a time
/// per session (see `run/park.rs`).
struct Turns(Box<[tokio::sync::Mutex<()>]>);

/// Stripes of [`Turns`].
const TURNS: usize = 64;

impl Default for Turns {
    fn default() -> Turns {
        Turns((0..TURNS).map(|_| tokio::sync::Mutex::new(())).collect())
    }
}

impl ReplayRegistry {
    fn lock(&self) -> MutexGuard<'_, HashMap<SessionKey, Arc<Replay>>> {
        self.logs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lock a wake of `key`'s parked run takes (one session always
    /// maps to one stripe).
    pub fn turn(&self, key: &SessionKey) -> &tokio::sync::Mutex<()> {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::hash::DefaultHasher::new();
        key.hash(&mut hasher);
        &self.wakes.0[(hasher.finish() as usize) % TURNS]
    }

    /// `key`'s run is being parked (noted before it is gone, so that a
    /// request that waits for the park finds it noted).
    pub fn note_parked(&self, key: &SessionKey) {
        self.parked_lock().insert(parked_hash(key));
    }

    /// `key`'s run was woken (or found not parked).
    pub fn note_woken(&self, key: &SessionKey) {
        self.parked_lock().remove(&parked_hash(key));
    }

    /// How many sessions may have a parked run (`--max-parked` bounds it).
    pub fn parked_count(&self) -> usize {
        self.parked_lock().len()
    }

    /// Whether `key`'s run may be parked (a false yes costs a store read).
    pub fn may_be_parked(&self, key: &SessionKey) -> bool {
        self.parked_lock().contains(&parked_hash(key))
    }

    fn parked_lock(&self) -> MutexGuard<'_, HashSet<u64>> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `log` the one a re-attach to `key` finds.
    pub fn publish(&self, key: SessionKey, log: Arc<Replay>) {
        self.lock().insert(key, log);
    }

    pub fn find(&self, key: &SessionKey) -> Option<Arc<Replay>> {
        self.lock().get(key).cloned()
    }

    /// Forgets `log` if it is still the one registered for `key`.
    pub(super) fn forget(&self, key: &SessionKey, log: &Arc<Replay>) {
        let mut logs = self.lock();
        if logs
            .get(key)
            .is_some_and(|current| Arc::ptr_eq(current, log))
        {
            logs.remove(key);
            drop(logs);
            let mut remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
            for id in log.pause_ids() {
                if remembered.len() == REMEMBERED_PAUSES {
                    remembered.pop_front();
                }
                remembered.push_back((id, key.clone()));
            }
        }
    }

    /// The sessions whose logs are held.
    pub fn keys(&self) -> Vec<SessionKey> {
        self.lock().keys().cloned().collect()
    }

    /// Logs held (live runs plus finished ones within their grace).
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The session of a run, live or ended and kept for its grace, that
    /// asked the pause `confirmation_id` (an approver's re-attach or reply
    /// once that pause was decided). A scan of the logs' pause notes:
    /// approvers act at a person's pace.
    pub fn find_pause(&self, confirmation_id: &str) -> Option<SessionKey> {
        let logs: Vec<(SessionKey, Arc<Replay>)> = self
            .lock()
            .iter()
            .map(|(key, log)| (key.clone(), log.clone()))
            .collect();
        let live = logs
            .into_iter()
            .find_map(|(key, log)| log.names_pause(confirmation_id).then_some(key));
        live.or_else(|| {
            let remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
            remembered
                .iter()
                .rev()
                .find(|(id, _)| id == confirmation_id)
                .map(|(_, key)| key.clone())
        })
    }

    /// Runs whose client went away and that may still be re-attached.
    pub fn detached(&self) -> usize {
        let logs: Vec<Arc<Replay>> = self.lock().values().cloned().collect();
        logs.iter().filter(|log| log.is_detached()).count()
    }
}

/// A session's hash in the set of those that may have a parked run.
fn parked_hash(key: &SessionKey) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    hasher.finish()
}
