//! The logs a re-attach searches: each session's latest run's, live or
//! ended within its grace; and the last [`REMEMBERED_PAUSES`] pauses of
//! runs whose logs went, with their sessions and what decided them, so
//! that a decision link (which names only its pause) still finds whom to
//! ask for the run's kept outcome, and a reply that names a decided pause
//! is told who decided it even before that outcome is stored (a client
//! that read the final chunk may reply at once: its log is gone then, and
//! the end is still being written).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use super::replay::Replay;
use crate::protocol::CancelReason;
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::store::PauseNote;

/// Pauses of forgotten logs that are remembered (each entry a pause's note,
/// its id and what decided it, and a session key: a few hundred bytes, so
/// about 1-2 MiB at most).
pub const REMEMBERED_PAUSES: usize = 4096;

/// Sessions' latest logs, for re-attach. Cheap-clone handle.
#[derive(Clone, Default)]
pub struct ReplayRegistry {
    logs: Arc<Mutex<HashMap<SessionKey, Arc<Replay>>>>,
    remembered: Arc<Mutex<VecDeque<(PauseNote, SessionKey)>>>,
    wakes: Arc<Turns>,
    /// A hash of each session whose run may be parked (#46): a request
    /// about any other session does not ask the store (16 bytes a pause).
    parked: Arc<Mutex<Parked>>,
}

/// The sessions that may have a parked run, each with the mark of when it
/// was last noted: the marks go up, so that a look at the store that began
/// at a mark knows which runs parked again since.
#[derive(Default)]
struct Parked {
    noted: HashMap<u64, u64>,
    mark: u64,
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
    /// request that waits for the park finds it noted), or was (noted again
    /// once its record is written: see [`ReplayRegistry::parked_before`]).
    pub fn note_parked(&self, key: &SessionKey) {
        let mut parked = self.parked_lock();
        parked.mark += 1;
        let mark = parked.mark;
        parked.noted.insert(parked_hash(key), mark);
    }

    /// `key`'s run was woken (or found not parked).
    pub fn note_woken(&self, key: &SessionKey) {
        self.parked_lock().noted.remove(&parked_hash(key));
    }

    /// How many sessions may have a parked run (`--max-parked` bounds it).
    pub fn parked_count(&self) -> usize {
        self.parked_lock().noted.len()
    }

    /// Whether `key`'s run may be parked (a false yes costs a store read).
    pub fn may_be_parked(&self, key: &SessionKey) -> bool {
        self.parked_lock().noted.contains_key(&parked_hash(key))
    }

    /// The mark now: taken before a look at the store.
    pub fn parked_mark(&self) -> u64 {
        self.parked_lock().mark
    }

    /// Whether `key`'s run was parked, and its record written, before
    /// `mark`, and not woken since: what a look at the store that began at
    /// `mark` read of it is what it is now.
    pub fn parked_before(&self, key: &SessionKey, mark: u64) -> bool {
        let parked = self.parked_lock();
        parked
            .noted
            .get(&parked_hash(key))
            .is_some_and(|noted| *noted <= mark)
    }

    fn parked_lock(&self) -> MutexGuard<'_, Parked> {
        self.parked.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Makes `log` the one a re-attach to `key` finds.
    pub fn publish(&self, key: SessionKey, log: Arc<Replay>) {
        self.lock().insert(key, log);
    }

    /// Another replica took the run of `key` over (this one's heartbeat
    /// had lapsed): the copy here is stopped as at a shutdown, so that its
    /// stream ends with `retry:` and its client re-attaches to the owner.
    pub fn hand_over(&self, key: &SessionKey) {
        run_log!(Debug, RunTag::session(key), "handed over");
        if let Some(log) = self.find(key) {
            log.stop.stop(CancelReason::Shutdown);
        }
    }

    /// The log of the latest run of `key`, live or ended within its grace.
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
            for note in log.pause_notes() {
                if remembered.len() == REMEMBERED_PAUSES {
                    remembered.pop_front();
                }
                remembered.push_back((note, key.clone()));
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
                .find(|(note, _)| note.confirmation_id == confirmation_id)
                .map(|(_, key)| key.clone())
        })
    }

    /// What decided the pause `confirmation_id` of `key`'s run whose log
    /// went, if it is remembered and was decided by a reply.
    pub fn remembered_decision(
        &self,
        key: &SessionKey,
        confirmation_id: &str,
    ) -> Option<PauseNote> {
        let remembered = self.remembered.lock().unwrap_or_else(|p| p.into_inner());
        remembered
            .iter()
            .rev()
            .find(|(note, of)| of == key && note.confirmation_id == confirmation_id)
            .map(|(note, _)| note.clone())
            .filter(|note| note.decided.is_some())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_look_begun_at_a_mark_trusts_only_runs_parked_before_it() {
        let registry = ReplayRegistry::default();
        let (a, b) = (SessionKey::new(None, "a"), SessionKey::new(None, "b"));
        registry.note_parked(&a);
        let mark = registry.parked_mark();
        assert!(registry.parked_before(&a, mark));
        // Parked again after the look began (its record rewritten): read anew.
        registry.note_parked(&a);
        assert!(!registry.parked_before(&a, mark));
        assert!(registry.parked_before(&a, registry.parked_mark()));
        // Never parked, or woken since: not what the look read.
        assert!(!registry.parked_before(&b, mark));
        registry.note_woken(&a);
        assert!(!registry.parked_before(&a, registry.parked_mark()));
        assert_eq!(registry.parked_count(), 0);
    }

    #[test]
    fn a_forgotten_log_s_decided_pauses_are_remembered_for_its_session_only() {
        use crate::protocol::Action;
        use crate::run::replay::ReplayLimits;
        use crate::run::stop::RunStop;
        use crate::store::DecidedBy;
        let registry = ReplayRegistry::default();
        let (a, b) = (SessionKey::new(None, "a"), SessionKey::new(None, "b"));
        let limits = ReplayLimits {
            frames: 16,
            bytes: 1 << 16,
        };
        let log = Replay::new(limits, RunStop::under(&Default::default()));
        log.note_pause("p-1");
        log.note_pause("p-2");
        let decided = DecidedBy {
            action: Action::Cancel,
            by: "anonymous".into(),
            at_ms: 1,
            approved_by: Vec::new(),
            via: Default::default(),
        };
        log.note_decided("p-2", decided.clone());
        registry.publish(a.clone(), log.clone());
        assert_eq!(
            registry.remembered_decision(&a, "p-2"),
            None,
            "its log says"
        );

        registry.forget(&a, &log);

        let note = registry.remembered_decision(&a, "p-2").unwrap();
        assert_eq!(note.decided, Some(decided));
        assert_eq!(registry.remembered_decision(&a, "p-1"), None, "undecided");
        assert_eq!(
            registry.remembered_decision(&b, "p-2"),
            None,
            "another session's"
        );
        assert_eq!(registry.find_pause("p-1"), Some(a));
    }

    #[test]
    fn at_most_remembered_pauses_are_remembered_the_oldest_going_first() {
        use crate::protocol::Action;
        use crate::run::replay::ReplayLimits;
        use crate::run::stop::RunStop;
        use crate::store::DecidedBy;
        let registry = ReplayRegistry::default();
        let limits = ReplayLimits {
            frames: 4,
            bytes: 1 << 10,
        };
        let stop = tokio_util::sync::CancellationToken::new();
        let key = |i: usize| SessionKey::new(None, &format!("s{i}"));
        for i in 0..=REMEMBERED_PAUSES {
            let log = Replay::new(limits, RunStop::under(&stop));
            log.note_pause(&format!("p-{i}"));
            let decided = DecidedBy {
                action: Action::Confirm,
                by: "anonymous".into(),
                at_ms: i as u64,
                approved_by: Vec::new(),
                via: Default::default(),
            };
            log.note_decided(&format!("p-{i}"), decided);
            registry.publish(key(i), log.clone());
            registry.forget(&key(i), &log);
        }

        let remembered = registry.remembered.lock().unwrap().len();
        assert_eq!(remembered, REMEMBERED_PAUSES);
        assert_eq!(
            registry.remembered_decision(&key(0), "p-0"),
            None,
            "the oldest went"
        );
        assert_eq!(registry.find_pause("p-0"), None);
        let last = REMEMBERED_PAUSES;
        let note = registry.remembered_decision(&key(last), &format!("p-{last}"));
        assert_eq!(
            note.and_then(|n| n.decided).map(|d| d.at_ms),
            Some(last as u64)
        );
        assert_eq!(registry.find_pause("p-1"), Some(key(1)));
    }
}
