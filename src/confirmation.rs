//! The run registry and the pause/decide handshake.
//!
//! [`ConfirmationManager`] knows, per session, which run is live and whether it
//! is paused on a confirmation. It does not know HTTP, SSE or engines.
//!
//! # How a decision travels
//! A pause owns a `oneshot` channel. Its sender sits in the registry under the
//! lock; its receiver is awaited by the run. Whoever *takes* the sender decides
//! the pause, and there is exactly one sender, so there is exactly one decision:
//! a user's reply, a superseding chat message, or the run itself when it times
//! out or is told to stop. The value is sent while the lock is held, so a reply
//! that lands before the run starts waiting is simply buffered in the channel
//! (no lost wake-up), and every pause has a fresh channel, so a decision can
//! never leak into the next round (no stale wake-up).
//!
//! # Cleanup
//! A [`RunSlot`] is the registry entry's owner: dropping it removes the entry
//! (only if the entry still belongs to that run, since a superseding run may
//! have taken the session). Completion, cancel, timeout, supersede, client gone
//! and shutdown all end the run task, and so all free the entry the same way.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use crate::protocol::{
    Action, CancelReason, Decisions, ErrorType, ReplyMessage, TaskDecision, TaskDecisionRequest,
    Verdict, MAX_MODIFY_TEXT_BYTES,
};
use crate::session::SessionKey;
use crate::tools::Tool;

/// The outcome of one pause, as the waiting run sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// With the verdict for every task (approved unless said otherwise).
    Confirm(Decisions),
    Modify(String),
    /// `CancelReason::User` for a `cancel` reply, otherwise why the run stopped.
    Cancel(CancelReason),
    /// The decision could not be acted on (the audit log could not record
    /// it): the run ends with this error and nothing runs.
    Failed(ErrorType),
}

/// What the pause knows of a task, to check the decisions made on it.
#[derive(Debug, Clone, Default)]
pub struct TaskCheck {
    /// The declared tool the task calls, if any (its schema checks edits).
    pub tool: Option<Arc<Tool>>,
}

/// Why a new run could not take its session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BeginError {
    #[error("a run on this session is streaming; wait for it to finish or pause")]
    SessionBusy,
    #[error("the server holds its maximum number of runs; retry later")]
    Overloaded,
    #[error("this API key holds its maximum of {limit} runs (--max-runs-per-key); retry later")]
    KeyOverloaded { limit: usize },
}

/// Default of `--max-runs`: runs held at once (the open-files limit is 20,000).
pub const MAX_RUNS: usize = 20_000;
/// With API keys on and no `--max-runs-per-key`, one key may hold this
/// fraction of `--max-runs` (1/4), so one key cannot lock the others out.
pub const RUNS_PER_KEY_DIVISOR: usize = 4;

/// How many runs the registry holds: in all, and per owner (API key).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunLimits {
    pub max_runs: usize,
    pub per_owner: usize,
}

impl RunLimits {
    /// `max_runs` in all; per API key `per_key` (at most `max_runs`), or
    /// with keys on a quarter of `max_runs`; without keys the one
    /// anonymous owner may use all of it.
    pub fn for_keys(max_runs: usize, per_key: Option<usize>, keys_on: bool) -> RunLimits {
        let per_owner = match (keys_on, per_key) {
            (false, _) => max_runs,
            (true, Some(limit)) => limit.min(max_runs),
            (true, None) => (max_runs / RUNS_PER_KEY_DIVISOR).max(1),
        };
        RunLimits {
            max_runs,
            per_owner,
        }
    }

    /// No limit at all (tests).
    pub const UNLIMITED: RunLimits = RunLimits {
        max_runs: usize::MAX,
        per_owner: usize::MAX,
    };

    /// `max` runs in all, and all of them for one owner.
    pub fn total(max: usize) -> RunLimits {
        RunLimits {
            max_runs: max,
            per_owner: max,
        }
    }
}

/// A snapshot of the registry, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunCounts {
    pub active: usize,
    pub paused: usize,
}

/// Why a reply was refused. The variants are listed in the order they are checked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    #[error(
        "no confirmation is pending for this session: it has no run (none was started, or \
         it belongs to another API key), its run has ended (completed, cancelled, timed out), \
         or its run is working and has not paused"
    )]
    NoPending,
    #[error("`{action}` is not one of the offered options: {}", names(options))]
    NotOffered {
        action: String,
        options: Vec<Action>,
    },
    #[error(
        "the modify text is longer than {MAX_MODIFY_TEXT_BYTES} bytes; the options are: {}",
        names(options)
    )]
    ModifyTooLong { options: Vec<Action> },
    #[error("confirmation_id does not match the pending confirmation")]
    Stale,
    #[error("{0}")]
    InvalidDecision(String),
    #[error("this confirmation has already been decided")]
    AlreadyDecided,
}

/// `confirm, modify, cancel`.
fn names(options: &[Action]) -> String {
    options
        .iter()
        .map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What an accepted reply decided. The pause is decided for everyone from
/// this moment; the run learns the decision when `ticket` is delivered
/// (after the audit log, if any, has recorded it).
#[derive(Debug)]
pub struct Accepted {
    pub action: Action,
    pub confirmation_id: String,
    pub confirmation_round: u32,
    pub run_id: u64,
    /// For a confirm: the verdict for every task.
    pub decisions: Option<Decisions>,
    /// The run's id in a durable store, if its pause is kept there.
    pub stored: Option<Arc<str>>,
    pub ticket: DecisionTicket,
}

/// A decision taken and on its way to its run. Delivered, the run acts on
/// it; failed, the run ends with the error and nothing runs; withdrawn, the
/// pause waits again as if the reply had never come. Dropped without any of
/// these (which the server never does), the run ends as `internal`.
pub struct DecisionTicket {
    decide_tx: Option<oneshot::Sender<Decision>>,
    decision: Option<Decision>,
    /// Where the pause is, to hand its sender back on a withdraw.
    manager: ConfirmationManager,
    key: SessionKey,
    run_id: u64,
}

impl std::fmt::Debug for DecisionTicket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionTicket")
            .field("decision", &self.decision)
            .field("run_id", &self.run_id)
            .finish_non_exhaustive()
    }
}

impl DecisionTicket {
    pub fn deliver(mut self) {
        if let (Some(tx), Some(decision)) = (self.decide_tx.take(), self.decision.take()) {
            // The run may have ended meanwhile (a stop): then nobody waits.
            let _ = tx.send(decision);
        }
    }

    pub fn fail(mut self, error_type: ErrorType) {
        if let Some(tx) = self.decide_tx.take() {
            let _ = tx.send(Decision::Failed(error_type));
        }
    }

    /// Takes the decision back (it could not be recorded): the pause is
    /// undecided again and a later reply may decide it. If the run's own
    /// fallback (its timeout or a stop) came due meanwhile, that fallback
    /// decides it now, as it would have without this reply.
    pub fn withdraw(mut self) {
        let Some(tx) = self.decide_tx.take() else {
            return;
        };
        let mut registry = self.manager.lock();
        let pause = registry
            .sessions
            .get_mut(&self.key)
            .filter(|entry| entry.run_id == self.run_id)
            .and_then(|entry| entry.pause.as_mut())
            .filter(|pause| pause.decide_tx.is_none());
        match pause {
            Some(pause) => match pause.settling {
                Some(reason) => {
                    let _ = tx.send(Decision::Cancel(reason));
                }
                None => pause.decide_tx = Some(tx),
            },
            // The run is gone: nobody waits on the sender.
            None => drop(tx),
        }
    }
}

impl Drop for DecisionTicket {
    fn drop(&mut self) {
        if let Some(tx) = self.decide_tx.take() {
            let _ = tx.send(Decision::Failed(ErrorType::Internal));
        }
    }
}

/// Cheap-clone handle to the registry.
#[derive(Clone, Default)]
pub struct ConfirmationManager {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    registry: Mutex<Registry>,
    next_run_id: AtomicU64,
    /// Woken whenever an entry is removed; see [`ConfirmationManager::wait_until_empty`].
    entry_removed: Notify,
}

#[derive(Default)]
struct Registry {
    sessions: HashMap<SessionKey, Entry>,
    /// Live runs per owner, kept with `sessions` under one lock.
    per_owner: HashMap<Option<u32>, usize>,
}

impl Registry {
    fn insert(&mut self, key: SessionKey, entry: Entry) {
        if self.sessions.insert(key.clone(), entry).is_none() {
            *self.per_owner.entry(key.owner).or_default() += 1;
        }
    }

    fn remove(&mut self, key: &SessionKey) {
        if self.sessions.remove(key).is_some() {
            if let Some(count) = self.per_owner.get_mut(&key.owner) {
                *count -= 1;
                if *count == 0 {
                    self.per_owner.remove(&key.owner);
                }
            }
        }
    }
}

struct Entry {
    run_id: u64,
    pause: Option<Pause>,
}

impl Entry {
    /// Paused on a confirmation nobody decided (nor stopped).
    fn waits(&self) -> bool {
        self.pause
            .as_ref()
            .is_some_and(|p| p.decide_tx.is_some() && !p.stop.is_cancelled())
    }
}

struct Pause {
    confirmation_id: String,
    round: u32,
    options: Vec<Action>,
    /// One per task, in order (task `index` is position + 1).
    tasks: Arc<[TaskCheck]>,
    /// The run's id in a durable store, when this pause is kept there: its
    /// decision must be recorded there before the run acts on it.
    stored: Option<Arc<str>>,
    /// `None` once someone has decided. A decided pause stays in the entry
    /// until the run pauses again or ends, so a second reply to it is told
    /// `AlreadyDecided` (and a new chat message `SessionBusy`) rather than
    /// depending on how fast the run resumed.
    decide_tx: Option<oneshot::Sender<Decision>>,
    /// Set when the run's timeout or stop came due while a decision was on
    /// its way: if that decision is withdrawn, this reason decides.
    settling: Option<CancelReason>,
    /// The run's stop. Once it fires, the pause belongs to the stop: replies
    /// are refused under this lock, so none is acknowledged after the run
    /// was told to stop and before it noticed (see [`RunSlot::wait`]).
    stop: CancellationToken,
}

impl ConfirmationManager {
    pub fn new() -> ConfirmationManager {
        ConfirmationManager::default()
    }

    fn lock(&self) -> MutexGuard<'_, Registry> {
        // A panic while holding this lock leaves plain data behind (every
        // update of the two maps happens in one non-panicking step), so a
        // poisoned lock is still usable.
        self.shared
            .registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Registers a new run on `session_id`. A run that is paused and not yet
    /// decided is superseded (its pause is decided as `Cancel(Superseded)`);
    /// a run that is streaming, or whose decision is on its way, keeps the
    /// session and the new run is refused. A new session is refused when
    /// `limits.max_runs` runs are registered already, or its owner holds
    /// `limits.per_owner`.
    pub fn begin_run(&self, key: SessionKey, limits: RunLimits) -> Result<RunSlot, BeginError> {
        let run_id = self.shared.next_run_id.fetch_add(1, Ordering::Relaxed);
        let mut registry = self.lock();
        if !registry.sessions.contains_key(&key) {
            if registry.sessions.len() >= limits.max_runs {
                return Err(BeginError::Overloaded);
            }
            let owned = registry.per_owner.get(&key.owner).copied().unwrap_or(0);
            if owned >= limits.per_owner {
                return Err(BeginError::KeyOverloaded {
                    limit: limits.per_owner,
                });
            }
        }
        if let Some(entry) = registry.sessions.get_mut(&key) {
            let decide_tx = entry
                .pause
                .as_mut()
                .and_then(|pause| pause.decide_tx.take())
                .ok_or(BeginError::SessionBusy)?;
            // The old run may have just dropped its receiver (it is ending
            // anyway); either way it no longer owns the session.
            let _ = decide_tx.send(Decision::Cancel(CancelReason::Superseded));
        }
        registry.insert(
            key.clone(),
            Entry {
                run_id,
                pause: None,
            },
        );
        Ok(RunSlot {
            manager: self.clone(),
            key,
            run_id,
        })
    }

    /// Applies a user's reply (and its per-task `decisions`) to the pause of
    /// `session_id`. A refused reply leaves the pause exactly as it was.
    pub fn decide(
        &self,
        key: &SessionKey,
        reply: &ReplyMessage,
        confirmation_id: Option<&str>,
        decisions: Option<&[TaskDecisionRequest]>,
    ) -> Result<Accepted, DecideError> {
        let mut registry = self.lock();
        let pause = registry
            .sessions
            .get_mut(key)
            .and_then(|entry| entry.pause.as_mut())
            .ok_or(DecideError::NoPending)?;
        let action = Action::from_word(&reply.action)
            .filter(|action| pause.options.contains(action))
            .ok_or_else(|| DecideError::NotOffered {
                action: reply.action.clone(),
                options: pause.options.clone(),
            })?;
        // A modify without text is accepted: the plan is put again unchanged.
        let text = reply.text.as_deref().unwrap_or("");
        if action == Action::Modify && text.len() > MAX_MODIFY_TEXT_BYTES {
            return Err(DecideError::ModifyTooLong {
                options: pause.options.clone(),
            });
        }
        if confirmation_id.is_some_and(|id| id != pause.confirmation_id) {
            return Err(DecideError::Stale);
        }
        let verdicts = check_decisions(action, decisions, &pause.tasks)
            .map_err(DecideError::InvalidDecision)?;
        if pause.stop.is_cancelled() {
            // The run was told to stop: the stop decides this pause.
            return Err(DecideError::AlreadyDecided);
        }
        // Taken under the lock: from here on the pause is decided for
        // everyone (later replies: AlreadyDecided; a new message: SessionBusy).
        let decide_tx = pause.decide_tx.take().ok_or(DecideError::AlreadyDecided)?;
        let decision = match action {
            Action::Confirm => Decision::Confirm(verdicts.clone().unwrap_or_default()),
            Action::Modify => Decision::Modify(text.to_owned()),
            Action::Cancel => Decision::Cancel(CancelReason::User),
        };
        let (confirmation_id, confirmation_round) = (pause.confirmation_id.clone(), pause.round);
        let stored = pause.stored.clone();
        let run_id = registry.sessions.get(key).map_or(0, |entry| entry.run_id);
        Ok(Accepted {
            action,
            confirmation_id,
            confirmation_round,
            run_id,
            decisions: verdicts,
            stored,
            ticket: DecisionTicket {
                decide_tx: Some(decide_tx),
                decision: Some(decision),
                manager: self.clone(),
                key: key.clone(),
                run_id,
            },
        })
    }

    /// A run number of this process for a run that never registers (one
    /// a store kept that ended as it was restored), for its records.
    pub fn number_run(&self) -> u64 {
        self.shared.next_run_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether a run lives on `key`.
    pub fn holds(&self, key: &SessionKey) -> bool {
        self.lock().sessions.contains_key(key)
    }

    /// Whether the run on `key` is paused on a confirmation nobody decided.
    pub fn is_paused(&self, key: &SessionKey) -> bool {
        self.lock().sessions.get(key).is_some_and(Entry::waits)
    }

    /// Number of sessions with a live run.
    pub fn active_runs(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Number of runs paused on a confirmation nobody has decided yet.
    pub fn paused_runs(&self) -> usize {
        self.counts().paused
    }

    /// Active and paused runs, read under one lock.
    pub fn counts(&self) -> RunCounts {
        let registry = self.lock();
        RunCounts {
            active: registry.sessions.len(),
            paused: registry.sessions.values().filter(|e| e.waits()).count(),
        }
    }

    /// Resolves once no run is registered (used to drain on shutdown).
    pub async fn wait_until_empty(&self) {
        loop {
            let removed = self.shared.entry_removed.notified();
            tokio::pin!(removed);
            // Register interest before looking, so a removal in between is not missed.
            removed.as_mut().enable();
            if self.lock().sessions.is_empty() {
                return;
            }
            removed.await;
        }
    }
}

/// Checks a reply's per-task decisions against the pending tasks: only with
/// `confirm`, each index once and known, a known kind, `edit` with `args`
/// that fit the task's tool, `respond` with a `result`. Returns the verdict
/// for every task (approved unless named) for a confirm.
fn check_decisions(
    action: Action,
    requests: Option<&[TaskDecisionRequest]>,
    tasks: &[TaskCheck],
) -> Result<Option<Decisions>, String> {
    let requests = requests.unwrap_or_default();
    if action != Action::Confirm {
        if !requests.is_empty() {
            return Err(format!(
                "decisions go with confirm only, not with {}",
                action.as_str()
            ));
        }
        return Ok(None);
    }
    let mut verdicts = Decisions::approve_all(tasks.len());
    let mut named = vec![false; tasks.len()];
    for request in requests {
        let index = usize::try_from(request.index).unwrap_or(usize::MAX);
        if index == 0 || index > tasks.len() {
            return Err(format!(
                "decisions: no task {} (the tasks are 1 to {})",
                request.index,
                tasks.len()
            ));
        }
        if std::mem::replace(&mut named[index - 1], true) {
            return Err(format!("decisions: task {index} is decided twice"));
        }
        let verdict = match request.decision.as_str() {
            "approve" => Verdict::Approve,
            "reject" => Verdict::Reject {
                reason: request.reason.clone(),
            },
            "edit" => {
                let args = request
                    .args
                    .clone()
                    .ok_or_else(|| format!("decisions: task {index}: edit needs args"))?;
                if let Some(tool) = &tasks[index - 1].tool {
                    tool.check_args(&args).map_err(|why| {
                        format!(
                            "decisions: task {index}: the args do not fit the tool `{}`: {why}",
                            tool.name
                        )
                    })?;
                } else if !args.is_object() {
                    return Err(format!("decisions: task {index}: args must be an object"));
                }
                Verdict::Edit { args }
            }
            "respond" => Verdict::Respond {
                result: request
                    .result
                    .clone()
                    .ok_or_else(|| format!("decisions: task {index}: respond needs result"))?,
            },
            other => {
                return Err(format!(
                    "decisions: task {index}: `{other}` is not approve, reject, edit or respond"
                ))
            }
        };
        verdicts.0[index - 1] = TaskDecision { index, verdict };
    }
    Ok(Some(verdicts))
}

/// Ownership of one session's registry entry for the life of one run.
/// Dropping it frees the entry.
pub struct RunSlot {
    manager: ConfirmationManager,
    key: SessionKey,
    run_id: u64,
}

/// A registered pause, waiting for its decision.
pub struct PendingDecision {
    decide_rx: oneshot::Receiver<Decision>,
}

impl RunSlot {
    pub fn session_id(&self) -> &str {
        &self.key.session_id
    }

    pub fn key(&self) -> &SessionKey {
        &self.key
    }

    pub fn run_id(&self) -> u64 {
        self.run_id
    }

    /// Registers a pause. Replies are accepted from this moment on, so call it
    /// before telling the client about the confirmation request. Once `stop`
    /// fires, replies are refused (`AlreadyDecided`): the stop decides.
    pub fn pause(
        &self,
        confirmation_id: String,
        round: u32,
        options: Vec<Action>,
        tasks: Arc<[TaskCheck]>,
        stored: Option<Arc<str>>,
        stop: CancellationToken,
    ) -> Result<PendingDecision, CancelReason> {
        let (decide_tx, decide_rx) = oneshot::channel();
        let mut registry = self.manager.lock();
        match registry.sessions.get_mut(&self.key) {
            Some(entry) if entry.run_id == self.run_id => {
                entry.pause = Some(Pause {
                    confirmation_id,
                    round,
                    options,
                    tasks,
                    stored,
                    decide_tx: Some(decide_tx),
                    settling: None,
                    stop,
                });
                Ok(PendingDecision { decide_rx })
            }
            // Another run took the session while this one was streaming.
            _ => Err(CancelReason::Superseded),
        }
    }

    /// Waits for the decision of `pending`, deciding it ourselves if `timeout`
    /// passes first (`Cancel(Timeout)`) or `stop` resolves first
    /// (`Cancel(<its reason>)`). Whatever wins, the pause is decided when this
    /// returns; later replies get `AlreadyDecided` while the run lives, and
    /// `NoPending` once it has ended.
    pub async fn wait(
        &self,
        pending: PendingDecision,
        timeout: Duration,
        stop: impl Future<Output = CancelReason>,
    ) -> Decision {
        let mut decide_rx = pending.decide_rx;
        let fallback = tokio::select! {
            decided = &mut decide_rx => {
                // Only a superseding run drops a sender unsent... and it sends.
                return decided.unwrap_or(Decision::Cancel(CancelReason::Superseded));
            }
            () = tokio::time::sleep(timeout) => CancelReason::Timeout,
            reason = stop => reason,
        };
        match self.settle(fallback) {
            Some(decision) => decision,
            // Somebody decided first and their decision is on its way (an
            // audit record being written): it stands, so wait for it.
            None => decide_rx
                .await
                .unwrap_or(Decision::Cancel(CancelReason::Superseded)),
        }
    }

    /// Decides the pause with `fallback` if nobody has yet (`Some`); `None`
    /// when a decision was taken first: a reply that was (or will be) told
    /// `confirmation_received` is never overruled.
    fn settle(&self, fallback: CancelReason) -> Option<Decision> {
        let mut registry = self.manager.lock();
        let entry = registry
            .sessions
            .get_mut(&self.key)
            .filter(|entry| entry.run_id == self.run_id)?;
        // Superseded runs (no entry) return None above: the superseding run
        // sent its decision before replacing us.
        let pause = entry.pause.as_mut()?;
        match pause.decide_tx.take() {
            // Nobody decided yet: we do, by dropping the only sender.
            Some(_decide_tx) => Some(Decision::Cancel(fallback)),
            None => {
                // A decision is on its way; should it be withdrawn, ours stands.
                pause.settling = Some(fallback);
                None
            }
        }
    }
}

impl Drop for RunSlot {
    fn drop(&mut self) {
        let mut registry = self.manager.lock();
        if registry
            .sessions
            .get(&self.key)
            .is_some_and(|entry| entry.run_id == self.run_id)
        {
            registry.remove(&self.key);
        }
        drop(registry);
        // Woken after the lock is released.
        self.manager.shared.entry_removed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::pending;

    fn key(session_id: &str) -> SessionKey {
        SessionKey::new(None, session_id)
    }

    #[tokio::test]
    async fn sessions_of_different_owners_never_meet() {
        let manager = ConfirmationManager::new();
        let mine = manager
            .begin_run(SessionKey::new(Some(1), "s"), RunLimits::UNLIMITED)
            .unwrap();
        let _pending = pause(&mine, "c1", 1);

        let theirs = decide(
            &manager,
            &SessionKey::new(Some(2), "s"),
            &reply("confirm", None),
            None,
        );
        let their_run = manager.begin_run(SessionKey::new(Some(2), "s"), RunLimits::UNLIMITED);

        assert_eq!(theirs, Err(DecideError::NoPending));
        assert!(their_run.is_ok(), "another owner's run lives beside mine");
        assert_eq!(manager.paused_runs(), 1, "mine is untouched");
    }

    /// Decides as the reply handler does without an audit log: the
    /// decision is delivered at once. Returns the action and round.
    fn decide(
        manager: &ConfirmationManager,
        key: &SessionKey,
        reply: &ReplyMessage,
        confirmation_id: Option<&str>,
    ) -> Result<(Action, u32), DecideError> {
        manager
            .decide(key, reply, confirmation_id, None)
            .map(|accepted| {
                let seen = (accepted.action, accepted.confirmation_round);
                accepted.ticket.deliver();
                seen
            })
    }

    fn reply(action: &str, text: Option<&str>) -> ReplyMessage {
        ReplyMessage {
            action: action.to_owned(),
            text: text.map(str::to_owned),
        }
    }

    fn pause(slot: &RunSlot, id: &str, round: u32) -> PendingDecision {
        slot.pause(
            id.to_owned(),
            round,
            Action::ALL.to_vec(),
            Arc::from(Vec::new()),
            None,
            CancellationToken::new(),
        )
        .unwrap_or_else(|_| panic!("slot owns its session"))
    }

    const LONG: Duration = Duration::from_secs(300);

    #[tokio::test]
    async fn a_reply_that_lands_before_the_wait_is_not_lost() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();

        let decision = slot.wait(pending, LONG, pending_reason()).await;

        assert_eq!(decision, Decision::Confirm(Decisions::approve_all(0)));
        assert_eq!(manager.paused_runs(), 0);
    }

    #[tokio::test]
    async fn a_run_is_paused_until_its_pause_is_decided() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        assert!(!manager.is_paused(&key("s")), "working");
        let _pending = pause(&slot, "c1", 1);
        assert!(manager.is_paused(&key("s")));
        assert!(!manager.is_paused(&key("other")));

        decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();

        assert!(!manager.is_paused(&key("s")), "decided: at work again");
        assert!(manager.holds(&key("s")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_decision_does_not_leak_into_the_next_round() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let first = pause(&slot, "c1", 1);
        decide(&manager, &key("s"), &reply("modify", Some("more")), None).unwrap();
        assert_eq!(
            slot.wait(first, LONG, pending_reason()).await,
            Decision::Modify("more".into())
        );

        let second = pause(&slot, "c2", 2);
        // The round-1 decision must not wake round 2: with nothing sent it times out.
        let decision = slot
            .wait(second, Duration::from_secs(5), pending_reason())
            .await;

        assert_eq!(decision, Decision::Cancel(CancelReason::Timeout));
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_cancels_and_later_replies_find_nothing_pending() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);

        let decision = slot
            .wait(pending, Duration::from_secs(300), pending_reason())
            .await;

        assert_eq!(decision, Decision::Cancel(CancelReason::Timeout));
        assert_eq!(manager.paused_runs(), 0);
        drop(slot); // the run ends
        assert_eq!(
            decide(&manager, &key("s"), &reply("confirm", None), None),
            Err(DecideError::NoPending)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reply_just_before_the_deadline_wins() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        let replier = {
            let manager = manager.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(9_999)).await;
                decide(&manager, &key("s"), &reply("confirm", None), None)
            })
        };

        let decision = slot
            .wait(pending, Duration::from_secs(10), pending_reason())
            .await;

        assert!(replier.await.unwrap().is_ok());
        assert_eq!(decision, Decision::Confirm(Decisions::approve_all(0)));
    }

    #[tokio::test]
    async fn a_decision_already_sent_stands_against_a_stop() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();

        // The stop is already there when the run waits: the decision taken
        // first still stands.
        let decision = slot
            .wait(pending, LONG, async { CancelReason::Shutdown })
            .await;

        assert_eq!(decision, Decision::Confirm(Decisions::approve_all(0)));
    }

    #[tokio::test]
    async fn a_decision_in_flight_to_the_run_stands_against_a_stop_that_fires_meanwhile() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        // Taken (an audit record being written), not delivered yet.
        let accepted = manager
            .decide(&key("s"), &reply("cancel", None), None, None)
            .unwrap();
        let deliverer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            accepted.ticket.deliver();
        });

        let decision = slot
            .wait(pending, LONG, async { CancelReason::Shutdown })
            .await;

        deliverer.await.unwrap();
        assert_eq!(
            decision,
            Decision::Cancel(CancelReason::User),
            "the reply stands"
        );
    }

    #[tokio::test]
    async fn a_failed_ticket_ends_the_run_with_its_error() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        let accepted = manager
            .decide(&key("s"), &reply("confirm", None), None, None)
            .unwrap();

        accepted.ticket.fail(ErrorType::AuditUnavailable);

        let decision = slot.wait(pending, LONG, pending_reason()).await;
        assert_eq!(decision, Decision::Failed(ErrorType::AuditUnavailable));
    }

    #[tokio::test]
    async fn a_withdrawn_decision_leaves_the_pause_to_the_next_reply() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        let first = manager
            .decide(&key("s"), &reply("confirm", None), None, None)
            .unwrap();
        let meanwhile = decide(&manager, &key("s"), &reply("cancel", None), None);

        first.ticket.withdraw();
        assert_eq!(manager.paused_runs(), 1, "undecided again");
        let next = decide(&manager, &key("s"), &reply("cancel", None), None);
        let decision = slot.wait(pending, LONG, pending_reason()).await;

        assert_eq!(meanwhile, Err(DecideError::AlreadyDecided));
        assert_eq!(next, Ok((Action::Cancel, 1)));
        assert_eq!(decision, Decision::Cancel(CancelReason::User));
    }

    #[tokio::test(start_paused = true)]
    async fn a_withdrawn_decision_yields_to_the_timeout_that_came_due_meanwhile() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        let accepted = manager
            .decide(&key("s"), &reply("confirm", None), None, None)
            .unwrap();
        let withdrawer = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(2)).await;
            accepted.ticket.withdraw();
        });

        let decision = slot
            .wait(pending, Duration::from_secs(1), pending_reason())
            .await;

        withdrawer.await.unwrap();
        assert_eq!(decision, Decision::Cancel(CancelReason::Timeout));
    }

    #[tokio::test]
    async fn per_task_decisions_are_checked_against_the_pending_tasks() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let tasks: Arc<[TaskCheck]> = vec![TaskCheck::default(), TaskCheck::default()].into();
        let _pending = slot
            .pause(
                "c1".into(),
                1,
                Action::ALL.to_vec(),
                tasks,
                None,
                CancellationToken::new(),
            )
            .unwrap_or_else(|_| panic!("slot owns its session"));
        let request = |index: u64, decision: &str| TaskDecisionRequest {
            index,
            decision: decision.into(),
            reason: None,
            args: None,
            result: None,
        };
        let refused = |reply_action: &str, decisions: Vec<TaskDecisionRequest>| match manager
            .decide(
                &key("s"),
                &reply(reply_action, None),
                None,
                Some(&decisions),
            ) {
            Err(DecideError::InvalidDecision(why)) => why,
            other => panic!("refused as invalid: {other:?}"),
        };

        assert!(refused("confirm", vec![request(3, "approve")]).contains("no task 3"));
        assert!(refused("confirm", vec![request(0, "approve")]).contains("no task 0"));
        assert!(
            refused("confirm", vec![request(1, "reject"), request(1, "approve")]).contains("twice")
        );
        assert!(refused("confirm", vec![request(1, "skip")]).contains("`skip`"));
        assert!(refused("confirm", vec![request(1, "edit")]).contains("args"));
        assert!(refused("confirm", vec![request(2, "respond")]).contains("result"));
        assert!(refused("cancel", vec![request(1, "reject")]).contains("confirm only"));

        let mut reject = request(2, "reject");
        reject.reason = Some("not now".into());
        let accepted = manager
            .decide(&key("s"), &reply("confirm", None), None, Some(&[reject]))
            .unwrap();
        let decisions = accepted.decisions.clone().unwrap();
        assert_eq!(decisions.verdict(1), &Verdict::Approve);
        assert_eq!(
            decisions.verdict(2),
            &Verdict::Reject {
                reason: Some("not now".into())
            }
        );
        accepted.ticket.deliver();
    }

    #[tokio::test]
    async fn a_stop_decides_an_undecided_pause_and_refuses_later_replies() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);

        let decision = slot
            .wait(pending, LONG, async { CancelReason::ClientGone })
            .await;

        assert_eq!(decision, Decision::Cancel(CancelReason::ClientGone));
        assert_eq!(
            decide(&manager, &key("s"), &reply("confirm", None), None),
            Err(DecideError::AlreadyDecided),
            "the stop was the decision"
        );
        drop(slot);
        assert_eq!(
            decide(&manager, &key("s"), &reply("confirm", None), None),
            Err(DecideError::NoPending)
        );
    }

    #[tokio::test]
    async fn a_second_reply_after_the_run_resumed_is_already_decided() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();
        assert_eq!(
            slot.wait(pending, LONG, pending_reason()).await,
            Decision::Confirm(Decisions::approve_all(0))
        );

        // The run is executing now; the pause it came from is decided.
        let second = decide(&manager, &key("s"), &reply("confirm", None), Some("c1"));

        assert_eq!(second, Err(DecideError::AlreadyDecided));
        assert_eq!(manager.paused_runs(), 0);
        assert_eq!(manager.active_runs(), 1);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_replies_yield_exactly_one_decision() {
        for round in 0..200 {
            let manager = ConfirmationManager::new();
            let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
            let pending = pause(&slot, "c1", 1);
            let barrier = Arc::new(tokio::sync::Barrier::new(16));
            let replies: Vec<_> = (0..16)
                .map(|i| {
                    let (manager, barrier) = (manager.clone(), barrier.clone());
                    let action = ["confirm", "cancel"][i % 2];
                    tokio::spawn(async move {
                        barrier.wait().await;
                        decide(&manager, &key("s"), &reply(action, None), None)
                    })
                })
                .collect();

            let mut accepted = Vec::new();
            for handle in replies {
                match handle.await.unwrap() {
                    Ok((action, _)) => accepted.push(action),
                    Err(err) => assert_eq!(err, DecideError::AlreadyDecided, "round {round}"),
                }
            }
            let decision = slot.wait(pending, LONG, pending_reason()).await;

            assert_eq!(accepted.len(), 1, "round {round}");
            let expected = match accepted[0] {
                Action::Confirm => Decision::Confirm(Decisions::approve_all(0)),
                _ => Decision::Cancel(CancelReason::User),
            };
            assert_eq!(decision, expected, "round {round}");
        }
    }

    #[tokio::test]
    async fn refused_replies_are_checked_in_the_documented_order_and_change_nothing() {
        let manager = ConfirmationManager::new();
        assert_eq!(
            decide(&manager, &key("s"), &reply("confirm", None), None),
            Err(DecideError::NoPending)
        );
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        assert_eq!(
            decide(&manager, &key("s"), &reply("launch", None), Some("wrong")),
            Err(DecideError::NoPending),
            "a streaming run has nothing pending"
        );
        let pending = pause(&slot, "c1", 1);

        assert!(matches!(
            decide(&manager, &key("s"), &reply("launch", None), Some("wrong")),
            Err(DecideError::NotOffered { .. })
        ));
        let long = "x".repeat(MAX_MODIFY_TEXT_BYTES + 1);
        assert!(matches!(
            decide(
                &manager,
                &key("s"),
                &reply("modify", Some(&long)),
                Some("wrong")
            ),
            Err(DecideError::ModifyTooLong { .. })
        ));
        assert_eq!(
            decide(&manager, &key("s"), &reply("confirm", None), Some("wrong")),
            Err(DecideError::Stale)
        );
        let accepted = decide(&manager, &key("s"), &reply("confirm", None), Some("c1")).unwrap();
        assert_eq!(accepted.1, 1);
        assert_eq!(
            decide(&manager, &key("s"), &reply("confirm", None), Some("wrong")),
            Err(DecideError::Stale)
        );
        assert_eq!(
            decide(&manager, &key("s"), &reply("cancel", None), None),
            Err(DecideError::AlreadyDecided)
        );
        assert_eq!(
            slot.wait(pending, LONG, pending_reason()).await,
            Decision::Confirm(Decisions::approve_all(0))
        );
    }

    #[tokio::test]
    async fn only_the_offered_options_are_accepted() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let _pending = slot
            .pause(
                "c1".into(),
                1,
                vec![Action::Confirm, Action::Cancel],
                Arc::from(Vec::new()),
                None,
                CancellationToken::new(),
            )
            .unwrap_or_else(|_| panic!("slot owns its session"));

        let refused = decide(&manager, &key("s"), &reply("modify", Some("x")), None);

        assert_eq!(
            refused,
            Err(DecideError::NotOffered {
                action: "modify".into(),
                options: vec![Action::Confirm, Action::Cancel]
            })
        );
    }

    #[tokio::test]
    async fn a_chat_message_supersedes_a_paused_run_but_not_a_streaming_one() {
        let manager = ConfirmationManager::new();
        let old = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        assert_eq!(
            manager.begin_run(key("s"), RunLimits::UNLIMITED).err(),
            Some(BeginError::SessionBusy)
        );
        let pending = pause(&old, "c1", 1);

        let new = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();

        assert_eq!(
            old.wait(pending, LONG, pending_reason()).await,
            Decision::Cancel(CancelReason::Superseded)
        );
        drop(old);
        assert_eq!(
            manager.active_runs(),
            1,
            "the old run must not free the new run's entry"
        );
        drop(new);
        assert_eq!(manager.active_runs(), 0);
    }

    #[tokio::test]
    async fn a_decided_but_not_yet_resumed_run_is_busy_not_superseded() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let pending = pause(&slot, "c1", 1);
        decide(&manager, &key("s"), &reply("confirm", None), None).unwrap();

        assert_eq!(
            manager.begin_run(key("s"), RunLimits::UNLIMITED).err(),
            Some(BeginError::SessionBusy)
        );
        assert_eq!(
            slot.wait(pending, LONG, pending_reason()).await,
            Decision::Confirm(Decisions::approve_all(0))
        );
    }

    #[tokio::test]
    async fn every_ending_frees_the_registry() {
        let manager = ConfirmationManager::new();
        for (i, stop) in [CancelReason::ClientGone, CancelReason::Shutdown]
            .into_iter()
            .enumerate()
        {
            let slot = manager
                .begin_run(key(&format!("s{i}")), RunLimits::UNLIMITED)
                .unwrap();
            let pending = pause(&slot, "c", 1);
            slot.wait(pending, LONG, async move { stop }).await;
            drop(slot);
        }
        let slot = manager
            .begin_run(key("done"), RunLimits::UNLIMITED)
            .unwrap();
        drop(slot);

        assert_eq!(manager.active_runs(), 0);
        tokio::time::timeout(Duration::from_secs(1), manager.wait_until_empty())
            .await
            .expect("an empty registry resolves at once");
    }

    #[tokio::test]
    async fn wait_until_empty_wakes_when_the_last_run_ends() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let waiter = tokio::spawn({
            let manager = manager.clone();
            async move { manager.wait_until_empty().await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());

        drop(slot);

        tokio::time::timeout(Duration::from_secs(1), waiter)
            .await
            .expect("woken")
            .unwrap();
    }

    #[tokio::test]
    async fn a_full_registry_refuses_new_sessions_but_still_supersedes() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("a"), RunLimits::total(1)).unwrap();
        let _pending = pause(&slot, "c1", 1);

        assert_eq!(
            manager.begin_run(key("b"), RunLimits::total(1)).err(),
            Some(BeginError::Overloaded)
        );
        assert!(
            manager.begin_run(key("a"), RunLimits::total(1)).is_ok(),
            "a supersede does not grow the registry"
        );
    }

    #[tokio::test]
    async fn a_reply_after_the_stop_fired_is_refused_and_the_stop_decides() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let stop = CancellationToken::new();
        let pending = slot
            .pause(
                "c1".into(),
                1,
                Action::ALL.to_vec(),
                Arc::from(Vec::new()),
                None,
                stop.clone(),
            )
            .unwrap_or_else(|_| panic!("slot owns its session"));

        // The stop fires; the run has not polled yet when the reply lands.
        stop.cancel();
        let reply = decide(&manager, &key("s"), &reply("confirm", None), None);
        let decision = slot
            .wait(pending, LONG, async { CancelReason::ClientGone })
            .await;

        assert_eq!(reply, Err(DecideError::AlreadyDecided));
        assert_eq!(decision, Decision::Cancel(CancelReason::ClientGone));
        assert_eq!(manager.paused_runs(), 0);
    }

    #[test]
    fn one_key_may_hold_a_quarter_of_the_runs_unless_told_otherwise() {
        assert_eq!(RunLimits::for_keys(100, None, false).per_owner, 100);
        assert_eq!(RunLimits::for_keys(100, None, true).per_owner, 25);
        assert_eq!(RunLimits::for_keys(100, Some(60), true).per_owner, 60);
        assert_eq!(RunLimits::for_keys(100, Some(600), true).per_owner, 100);
    }

    #[tokio::test]
    async fn one_owner_cannot_take_the_runs_of_the_others() {
        let manager = ConfirmationManager::new();
        let limits = RunLimits {
            max_runs: 10,
            per_owner: 2,
        };
        let owned = |owner, session: &str| SessionKey::new(Some(owner), session);
        let _a1 = manager.begin_run(owned(1, "a1"), limits).unwrap();
        let a2 = manager.begin_run(owned(1, "a2"), limits).unwrap();
        let _pending = pause(&a2, "c", 1);

        assert_eq!(
            manager.begin_run(owned(1, "a3"), limits).err(),
            Some(BeginError::KeyOverloaded { limit: 2 })
        );
        assert!(
            manager.begin_run(owned(1, "a2"), limits).is_ok(),
            "a supersede"
        );
        assert!(
            manager.begin_run(owned(2, "b1"), limits).is_ok(),
            "another key"
        );
        drop(_a1);
        assert!(manager.begin_run(owned(1, "a3"), limits).is_ok(), "freed");
    }

    #[tokio::test]
    async fn a_modify_text_over_the_bound_is_refused_and_the_pause_stays() {
        let manager = ConfirmationManager::new();
        let slot = manager.begin_run(key("s"), RunLimits::UNLIMITED).unwrap();
        let _pending = pause(&slot, "c1", 1);
        let long = "x".repeat(MAX_MODIFY_TEXT_BYTES + 1);

        let refused = decide(&manager, &key("s"), &reply("modify", Some(&long)), None);
        let fits = "x".repeat(MAX_MODIFY_TEXT_BYTES);
        let accepted = decide(&manager, &key("s"), &reply("modify", Some(&fits)), None);

        assert!(matches!(refused, Err(DecideError::ModifyTooLong { .. })));
        assert!(accepted.is_ok());
    }

    fn pending_reason() -> impl Future<Output = CancelReason> {
        pending()
    }
}
