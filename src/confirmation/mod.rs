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
//!
//! # Files
//! Each file adds to the types defined here: `limits` how many runs the
//! registry holds, [`slot`] the run's side (pause,
//! wait, settle, free), [`ticket`] a decision on its way (deliver, fail,
//! withdraw), [`quorum`] counting approvals (`tally` under the lock, and
//! the error of a refusal an escalation will lift), `refused` why a reply
//! is refused, [`waiting`] the undecided pauses an inbox lists. What each
//! kind of pause asks, and its check of a reply (who may decide, the
//! decisions, answers and grant it carries), are the kind's own
//! (`crate::pause`, asked through [`Asking::check`]).
//!
//! Longer than 600 lines because `decide`, the one path a reply takes
//! under the registry's lock (the checks every pause shares, a quorum's
//! count, a decide's tasks), reads best whole.

mod limits;
pub mod quorum;
mod refused;
pub mod slot;
mod tally;
pub mod tasks;
pub mod ticket;
pub mod waiting;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use tokio::sync::{oneshot, Notify};
use tokio_util::sync::CancellationToken;

use serde_json::{Map, Value};

pub use self::limits::{RunLimits, MAX_RUNS, RUNS_PER_KEY_DIVISOR};
pub use self::refused::{DecideError, ReplyFrom};
pub use crate::decider::Decider;
use crate::pause::grant::GrantSpec;
use crate::pause::reply::{Checked, Reply};
pub use crate::pause::Asking;
use crate::protocol::given::{self, Given};
use crate::protocol::request::ReplyPayload;

use self::quorum::{Counted, Partial, Progress, Tally};
use crate::protocol::{
    Action, CancelReason, Decisions, ErrorType, PauseKind, ReplyMessage, TaskDecisionRequest,
    MAX_MODIFY_TEXT_BYTES,
};
use crate::session::SessionKey;

/// The outcome of one pause, as the waiting run sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// With the verdict for every task (approved unless said otherwise),
    /// and the grant the confirm gives, if any.
    Confirm(Decisions, Option<Box<GrantSpec>>),
    Modify(String),
    /// The answers to a question pause, normalized (see [`crate::protocol::question`]).
    Answer(Map<String, Value>),
    /// A question pause declined.
    Skip,
    /// Nobody answered a pause whose tasks reject on timeout: these
    /// verdicts (every task rejected), and the run goes on.
    TimedOut(Decisions),
    /// `CancelReason::User` for a `cancel` reply, otherwise why the run stopped.
    Cancel(CancelReason),
    /// The decision could not be acted on (the audit log could not record
    /// it): the run ends with this error and nothing runs.
    Failed(ErrorType),
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

/// A snapshot of the registry, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunCounts {
    pub active: usize,
    pub paused: usize,
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
    /// What the reply gave: a confirm's verdict for every task, or an
    /// answer's normalized answers.
    pub given: Option<Given>,
    pub kind: PauseKind,
    /// The run's id in a durable store, if its pause is kept there.
    pub stored: Option<Arc<str>>,
    pub ticket: DecisionTicket,
    /// A confirm that is one approval of several: the approvals so far and
    /// how many are needed. The pause stays pending (the ticket carries no
    /// decision).
    pub progress: Option<Progress>,
    /// A decide that leaves tasks pending: what it decided, and what is
    /// still pending. The pause stays pending (the ticket carries no
    /// decision).
    pub partial: Option<Box<Partial>>,
    /// For a confirm that decides: every label that approved, in order.
    pub approved_by: Vec<String>,
}

/// What [`ConfirmationManager::begin_run`] found on the session.
pub enum Begun {
    /// The session was free: the new run holds it.
    Fresh(RunSlot),
    /// The session's run was paused: its pause is taken, to be decided
    /// `superseded` once that is recorded.
    Supersedes(Superseding),
}

/// A paused run's pause, taken by a new message on its session and not yet
/// handed over: completed, the old run ends `superseded` and the new run
/// holds the session; withdrawn (the supersede could not be recorded), the
/// pause waits again. Dropped without either, it is withdrawn.
pub struct Superseding {
    decide_tx: Option<oneshot::Sender<Decision>>,
    manager: ConfirmationManager,
    key: SessionKey,
    old_run_id: u64,
    new_run_id: u64,
    /// The old run's id in a durable store, if its pause is kept there.
    stored: Option<Arc<str>>,
    confirmation_id: String,
    kind: PauseKind,
}

impl std::fmt::Debug for Superseding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Superseding")
            .field("old_run_id", &self.old_run_id)
            .field("new_run_id", &self.new_run_id)
            .finish_non_exhaustive()
    }
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
    /// Runs that freed their entry and still write their end ([`slot::WritingEnd`]).
    ending: std::sync::atomic::AtomicUsize,
}

#[derive(Default)]
struct Registry {
    sessions: HashMap<SessionKey, Entry>,
    /// Live runs per owner, kept with `sessions` under one lock.
    per_owner: HashMap<Option<u32>, usize>,
}

impl Registry {
    /// Hands a taken pause's sender back to run `run_id`'s pause on `key`
    /// (its decision could not be recorded): the pause waits again, unless
    /// the run's own fallback (its timeout, a stop) came due meanwhile, which
    /// then decides it, as it would have without the taker.
    fn give_back(&mut self, key: &SessionKey, run_id: u64, tx: oneshot::Sender<Decision>) {
        let pause = self
            .sessions
            .get_mut(key)
            .filter(|entry| entry.run_id == run_id)
            .and_then(|entry| entry.pause.as_mut())
            .filter(|pause| pause.decide_tx.is_none());
        match pause {
            Some(pause) => {
                pause.in_doubt = false;
                match pause.settling {
                    Some(reason) => {
                        let _ = tx.send(Decision::Cancel(reason));
                    }
                    None => pause.decide_tx = Some(tx),
                }
            }
            // The run is gone: nobody waits on the sender.
            None => drop(tx),
        }
    }

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
    /// A run restored from a store (a restart, a takeover) whose pause is
    /// not registered yet: a reply meanwhile is told to retry, not that
    /// nothing waits.
    restoring: bool,
}

impl Entry {
    /// Paused on a confirmation nobody decided (nor stopped).
    fn waits(&self) -> bool {
        self.pause
            .as_ref()
            .is_some_and(|p| p.decide_tx.is_some() && !p.stop.is_cancelled())
    }
}

/// A pause's escalations, each group with the tasks it admits it to (an
/// older record's one escalation, with no list: every task).
pub fn escalations_of<'a>(
    latest: Option<&'a str>,
    escalations: &'a [crate::store::Escalated],
) -> Vec<(&'a str, &'a [usize])> {
    match (escalations.is_empty(), latest) {
        (true, Some(group)) => vec![(group, &[][..])],
        _ => escalations
            .iter()
            .map(|e| (e.group.as_str(), e.tasks.as_slice()))
            .collect(),
    }
}

struct Pause {
    confirmation_id: String,
    round: u32,
    options: Vec<Action>,
    kind: PauseKind,
    asking: Asking,
    /// When it was asked and when it expires (for the inbox).
    asked_at: SystemTime,
    expires_at: SystemTime,
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
    /// The decision on its way had an unknown outcome in the store and is
    /// being settled: other replies are told to retry, not that it stands.
    in_doubt: bool,
    /// The approvals kept so far (a quorum pause), and the tasks their
    /// approvers rejected.
    tally: Tally,
    /// An approval of it is being kept (store, audit log): until that is
    /// known, no other approval is counted (an approval counts only once
    /// kept, so none can complete a quorum with one that is then lost).
    approving: bool,
    /// The group it was escalated to (its members may decide it too), and
    /// the tasks it was escalated for (none: every task).
    escalated_to: Option<String>,
    escalations: Vec<crate::store::Escalated>,
    /// An escalation moved `expires_at` (`escalate_extends`): the wait
    /// goes on to it.
    extended: bool,
    /// A plan whose tasks run as they are decided: woken when a task
    /// decided on its own is kept ([`slot::Waited::Partly`]).
    released: Option<Arc<tokio::sync::Notify>>,
    /// How many of `tally.decided` are kept (the rest, if any, are being
    /// kept now and may be withdrawn).
    kept_tasks: usize,
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

    /// Registers a new run on `key`. A run that is paused and not yet
    /// decided is to be superseded: its pause is taken ([`Begun::Supersedes`])
    /// and the new run gets the session once the supersede is recorded
    /// ([`Superseding::complete`]). A run that is streaming, or whose
    /// decision is on its way, keeps the session and the new run is refused.
    /// A new session is refused when `limits.max_runs` runs are registered
    /// already, or its owner holds `limits.per_owner`.
    pub fn begin_run(&self, key: SessionKey, limits: RunLimits) -> Result<Begun, BeginError> {
        self.begin(key, limits, false)
    }

    /// Registers a run restored from a store on the free session `key`:
    /// until its pause is registered again ([`RunSlot::pause`]), a reply
    /// is told the run is being restored (503, retry), never 404.
    pub fn begin_restored_run(&self, key: SessionKey) -> Result<Begun, BeginError> {
        self.begin(key, RunLimits::UNLIMITED, true)
    }

    fn begin(
        &self,
        key: SessionKey,
        limits: RunLimits,
        restoring: bool,
    ) -> Result<Begun, BeginError> {
        let run_id = self.shared.next_run_id.fetch_add(1, Ordering::Relaxed);
        let mut registry = self.lock();
        if let Some(entry) = registry.sessions.get_mut(&key) {
            // Taken under the lock: from here on the old pause is decided
            // for everyone (replies: AlreadyDecided; new messages:
            // SessionBusy) until the supersede completes or is withdrawn.
            let pause = entry.pause.as_mut().ok_or(BeginError::SessionBusy)?;
            let decide_tx = pause.decide_tx.take().ok_or(BeginError::SessionBusy)?;
            let taken = Superseding {
                decide_tx: Some(decide_tx),
                manager: self.clone(),
                key,
                old_run_id: entry.run_id,
                new_run_id: run_id,
                stored: pause.stored.clone(),
                confirmation_id: pause.confirmation_id.clone(),
                kind: pause.kind,
            };
            return Ok(Begun::Supersedes(taken));
        }
        if registry.sessions.len() >= limits.max_runs {
            return Err(BeginError::Overloaded);
        }
        let owned = registry.per_owner.get(&key.owner).copied().unwrap_or(0);
        if owned >= limits.per_owner {
            return Err(BeginError::KeyOverloaded {
                limit: limits.per_owner,
            });
        }
        registry.insert(
            key.clone(),
            Entry {
                run_id,
                pause: None,
                restoring,
            },
        );
        Ok(Begun::Fresh(RunSlot {
            manager: self.clone(),
            key,
            run_id,
        }))
    }

    /// Applies a user's reply (and its per-task `decisions`, or its
    /// `answers`) to the pause of `session_id`. A refused reply leaves the
    /// pause exactly as it was.
    pub fn decide(
        &self,
        key: &SessionKey,
        reply: &ReplyMessage,
        confirmation_id: Option<&str>,
        decisions: Option<&[TaskDecisionRequest]>,
        answers: Option<&Map<String, Value>>,
        from: ReplyFrom<'_>,
    ) -> Result<Accepted, DecideError> {
        let (decider, grant) = (from.decider, from.grant);
        let mut registry = self.lock();
        let entry = registry
            .sessions
            .get_mut(key)
            .ok_or(DecideError::NoPending)?;
        if entry.restoring {
            return Err(DecideError::Restoring);
        }
        let pause = entry.pause.as_mut().ok_or(DecideError::NoPending)?;
        // A decide is taken wherever a confirm is (it is not listed).
        let offered = |action: &Action| match action {
            Action::Decide => pause.options.contains(&Action::Confirm),
            action => pause.options.contains(action),
        };
        let action = Action::from_word(&reply.action)
            .filter(offered)
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
        crate::pause::plan_check::check_preview_digests(
            pause.asking.tasks(),
            decisions.unwrap_or_default(),
        )
        .map_err(DecideError::PreviewStale)?;
        if action == Action::Modify && !pause.tally.started.is_empty() {
            return Err(DecideError::InvalidDecision(format!(
                "tasks {} of this plan were decided on their own and have run, so it cannot \
                 be modified now: decide the tasks still pending, or cancel",
                pause
                    .tally
                    .started
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let decided: Vec<usize> = pause
            .tally
            .decided
            .iter()
            .map(|done| done.decision.index)
            .collect();
        let escalations = escalations_of(pause.escalated_to.as_deref(), &pause.escalations);
        let checked = pause.asking.check(&Reply {
            action,
            text: reply.text.as_deref(),
            payload: ReplyPayload {
                decisions,
                answers,
                grant,
            },
            decider,
            decided: &decided,
            escalations: &escalations,
        });
        let Checked {
            given,
            granted,
            quorum,
        } = checked.map_err(|refused| pause.refused(refused, decider))?;
        let (verdicts, answers) = given::into_parts(given);
        if pause.stop.is_cancelled() {
            // The run was told to stop: the stop decides this pause.
            return Err(DecideError::AlreadyDecided);
        }
        if pause.decide_tx.is_none() && pause.in_doubt {
            return Err(DecideError::Settling);
        }
        if pause.decide_tx.is_none() {
            return Err(DecideError::AlreadyDecided);
        }
        let mut approved_by = vec![decider.label.clone()];
        let mut verdicts = verdicts;
        let mut progress = None;
        let mut partial = None;
        let mut action = action;
        // Tasks decided on their own: a decide, or a confirm after some.
        let by_task = action == Action::Decide
            || (action == Action::Confirm
                && !(pause.tally.decided.is_empty() && pause.tally.task_approvals.is_empty()));
        if by_task {
            let requests = decisions.unwrap_or_default();
            match pause.count_tasks(decider, from.via, action, requests)? {
                Counted::Decides {
                    approved_by: all,
                    decisions,
                } => {
                    (approved_by, verdicts) = (all, Some(decisions));
                    // The last pending task decided: the plan is confirmed.
                    action = Action::Confirm;
                }
                Counted::Partial(taken) => {
                    (approved_by, verdicts) = (Vec::new(), None);
                    partial = Some(taken);
                }
                Counted::Recorded(_) => return Err(DecideError::Counting),
            }
        } else if let (Some(quorum), Some(given), Action::Confirm | Action::RunAgain) =
            (&quorum, &verdicts, action)
        {
            match pause.count_confirm(quorum, decider, given, granted.is_some())? {
                Counted::Decides {
                    approved_by: all,
                    decisions,
                } => {
                    approved_by = all;
                    verdicts = Some(decisions);
                }
                // One approval of several: the pause stays pending (the
                // ticket carries no decision).
                Counted::Recorded(recorded) => {
                    (approved_by, verdicts) = (Vec::new(), None);
                    progress = Some(recorded);
                }
                // A confirm is never a decide.
                Counted::Partial(_) => return Err(DecideError::Counting),
            }
        }
        let (decide_tx, decision) = if progress.is_some() || partial.is_some() {
            (None, None)
        } else {
            // Taken under the lock: from here on the pause is decided for
            // everyone (later replies: AlreadyDecided; a new message: SessionBusy).
            let decide_tx = pause.decide_tx.take().ok_or(DecideError::AlreadyDecided)?;
            let decision = match action {
                Action::Confirm => Decision::Confirm(verdicts.clone().unwrap_or_default(), granted),
                // A reconcile's yes: its one task called again.
                Action::RunAgain => Decision::Confirm(verdicts.clone().unwrap_or_default(), None),
                // A decide that decides the pause is a confirm (above).
                Action::Decide => return Err(DecideError::AlreadyDecided),
                Action::Modify => Decision::Modify(text.to_owned()),
                Action::Cancel => Decision::Cancel(CancelReason::User),
                Action::Answer => Decision::Answer(answers.clone().unwrap_or_default()),
                Action::Skip => Decision::Skip,
                // No pause offers it: `options` refused it above.
                Action::TimeoutReject => return Err(DecideError::AlreadyDecided),
            };
            (Some(decide_tx), Some(decision))
        };
        let (confirmation_id, confirmation_round) = (pause.confirmation_id.clone(), pause.round);
        let stored = pause.stored.clone();
        let kind = pause.kind;
        let run_id = registry.sessions.get(key).map_or(0, |entry| entry.run_id);
        Ok(Accepted {
            action,
            confirmation_id,
            confirmation_round,
            run_id,
            given: given::join(verdicts, answers),
            kind,
            stored,
            ticket: DecisionTicket {
                decide_tx,
                decision,
                manager: self.clone(),
                key: key.clone(),
                run_id,
            },
            progress,
            partial,
            approved_by,
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

    /// Resolves once no run is registered, nor still writing its end (used
    /// to drain on shutdown).
    pub async fn wait_until_empty(&self) {
        loop {
            let removed = self.shared.entry_removed.notified();
            tokio::pin!(removed);
            // Register interest before looking, so a removal in between is not missed.
            removed.as_mut().enable();
            if self.lock().sessions.is_empty() && self.shared.ending.load(Ordering::SeqCst) == 0 {
                return;
            }
            removed.await;
        }
    }
}

/// Ownership of one session's registry entry for the life of one run.
/// Dropping it frees the entry.
pub struct RunSlot {
    manager: ConfirmationManager,
    key: SessionKey,
    run_id: u64,
}

#[cfg(test)]
mod tests;
