//! What the registry can tell an inbox: the pauses nobody has decided yet
//! ([`ConfirmationManager::waiting`]), without their data (the run's log
//! holds the request as it was sent).

use std::time::SystemTime;

use super::quorum::Tally;
use super::{ConfirmationManager, Entry};
use crate::protocol::PauseKind;
use crate::session::SessionKey;

/// A pause nobody has decided yet.
#[derive(Debug, Clone)]
pub struct Waiting {
    pub key: SessionKey,
    pub confirmation_id: String,
    pub kind: PauseKind,
    pub asked_at: SystemTime,
    pub expires_at: SystemTime,
    /// A quorum's approvals so far, and how many it needs (1: no quorum).
    pub approvals: Vec<String>,
    pub required: usize,
    /// The group it was escalated to, if it was, and for which tasks
    /// (none: every task).
    pub escalated_to: Option<String>,
    pub escalations: Vec<crate::store::Escalated>,
    /// The groups whose members alone decide it.
    pub groups: Vec<String>,
    /// Whether the requester's own key counts towards its approvals.
    pub requester_may_approve: bool,
    /// Its tasks decided on their own so far (`decide`).
    pub decided: Vec<crate::store::DecidedTask>,
    /// The approvals of its tasks that need several, so far.
    pub task_approvals: Vec<crate::store::TaskApprovals>,
    /// Who may decide each of its tasks.
    pub task_who: Vec<crate::pause::plan_check::TaskWho>,
    /// Its run's id in a durable store, when a store keeps it.
    pub run: Option<std::sync::Arc<str>>,
}

impl ConfirmationManager {
    /// The session whose run holds (or held, while the run lives on) the
    /// pause `confirmation_id`, whatever its namespace: what an approver
    /// names a pause by. A scan, under the registry's lock: approvers act
    /// at a person's pace.
    pub fn find_pause(&self, confirmation_id: &str) -> Option<SessionKey> {
        let registry = self.lock();
        registry
            .sessions
            .iter()
            .find(|(_, entry)| {
                entry
                    .pause
                    .as_ref()
                    .is_some_and(|pause| pause.confirmation_id == confirmation_id)
            })
            .map(|(key, _)| key.clone())
    }

    /// The undecided pauses of the sessions `mine` accepts, in no order.
    pub fn waiting(&self, mine: impl Fn(&SessionKey) -> bool) -> Vec<Waiting> {
        let registry = self.lock();
        registry
            .sessions
            .iter()
            .filter(|(key, entry)| entry.waits() && mine(key))
            .filter_map(|(key, entry)| waiting(key, entry))
            .collect()
    }

    /// The undecided pause of the session `key`, if it waits on one.
    pub fn waiting_of(&self, key: &SessionKey) -> Option<Waiting> {
        let registry = self.lock();
        let entry = registry.sessions.get(key).filter(|entry| entry.waits())?;
        waiting(key, entry)
    }
}

/// `entry`'s pause, as [`Waiting`].
fn waiting(key: &SessionKey, entry: &Entry) -> Option<Waiting> {
    let pause = entry.pause.as_ref()?;
    let quorum = pause.asking.quorum();
    Some(Waiting {
        key: key.clone(),
        confirmation_id: pause.confirmation_id.clone(),
        kind: pause.kind,
        asked_at: pause.asked_at,
        expires_at: pause.expires_at,
        approvals: pause.tally.approvals.clone(),
        escalated_to: pause.escalated_to.clone(),
        escalations: pause.escalations.clone(),
        required: quorum.required.max(1),
        groups: quorum.groups,
        requester_may_approve: quorum.requester_may_approve,
        decided: pause.tally.decided.clone(),
        task_approvals: pause.tally.task_approvals.clone(),
        task_who: pause
            .asking
            .plan()
            .map(|plan| crate::pause::plan_check::TaskWho::of(plan))
            .unwrap_or_default(),
        run: pause.stored.clone(),
    })
}

impl ConfirmationManager {
    /// Takes back `label`'s approval of pause `confirmation_id` (it could
    /// not be recorded), with the rejects it carried.
    pub fn withdraw_approval(&self, key: &SessionKey, confirmation_id: &str, label: &str) {
        self.counted(key, confirmation_id, |tally| {
            tally.approvals.retain(|l| l != label);
            tally.rejected.retain(|r| r.by != label);
        });
    }

    /// The tasks `tasks` of pause `confirmation_id` of `key`, decided on
    /// their own, were not kept: pending again, the approvals of tasks
    /// that need several as they were (`before`).
    pub fn withdraw_tasks(
        &self,
        key: &SessionKey,
        confirmation_id: &str,
        tasks: &[usize],
        before: &[crate::store::TaskApprovals],
    ) {
        self.counted(key, confirmation_id, |tally| {
            tally
                .decided
                .retain(|done| !tasks.contains(&done.decision.index));
            tally.task_approvals = before.to_vec();
        });
    }

    /// `label`'s approval of pause `confirmation_id` of `key` is kept: the
    /// next approval may be counted.
    pub fn approval_kept(&self, key: &SessionKey, confirmation_id: &str) {
        self.counted(key, confirmation_id, |_| {});
    }

    /// The step being kept of pause `confirmation_id` of `key` is settled
    /// (`amend` its tally if it was not kept): the next may be counted.
    fn counted(&self, key: &SessionKey, confirmation_id: &str, amend: impl FnOnce(&mut Tally)) {
        let mut registry = self.lock();
        let pause = registry
            .sessions
            .get_mut(key)
            .and_then(|entry| entry.pause.as_mut())
            .filter(|pause| pause.confirmation_id == confirmation_id);
        if let Some(pause) = pause {
            amend(&mut pause.tally);
            pause.approving = false;
            // A task decided on its own is kept: a run that takes its
            // tasks as they are decided goes on with it.
            let kept = pause.tally.decided.len();
            if kept > pause.kept_tasks {
                if let Some(released) = &pause.released {
                    released.notify_one();
                }
            }
            pause.kept_tasks = kept;
        }
    }

    /// Those of `tasks` of the pause `confirmation_id` of `key` that are
    /// still pending (none once it waits no more).
    pub fn pending_among(
        &self,
        key: &SessionKey,
        confirmation_id: &str,
        tasks: &[usize],
    ) -> Vec<usize> {
        let registry = self.lock();
        let Some(pause) = registry
            .sessions
            .get(key)
            .filter(|entry| entry.waits())
            .and_then(|entry| entry.pause.as_ref())
            .filter(|pause| pause.confirmation_id == confirmation_id)
        else {
            return Vec::new();
        };
        tasks
            .iter()
            .copied()
            .filter(|&index| !pause.tally.has_decided(index))
            .collect()
    }

    /// Whether the run on `key` is still paused on `confirmation_id`, not
    /// decided and not paused again on another round.
    pub fn waits_on(&self, key: &SessionKey, confirmation_id: &str) -> bool {
        self.lock().sessions.get(key).is_some_and(|entry| {
            entry.waits()
                && entry
                    .pause
                    .as_ref()
                    .is_some_and(|p| p.confirmation_id == confirmation_id)
        })
    }

    /// Whether the run on `key` is paused on a confirmation nobody decided,
    /// or whose decision is in doubt (being settled): a run that has not
    /// acted on a decision here.
    pub fn is_paused_or_in_doubt(&self, key: &SessionKey) -> bool {
        self.lock().sessions.get(key).is_some_and(|entry| {
            entry.waits()
                || entry
                    .pause
                    .as_ref()
                    .is_some_and(|p| p.decide_tx.is_none() && p.in_doubt)
        })
    }

    /// Escalates the undecided pause `confirmation_id` of `key` to `group`
    /// (its members may decide it too), moving its expiry by `extends` if
    /// given: its expiry then, or `None` when it no longer waits.
    pub fn escalate(
        &self,
        key: &SessionKey,
        confirmation_id: &str,
        group: &str,
        extends: Option<std::time::Duration>,
        tasks: &[usize],
    ) -> Option<SystemTime> {
        let mut registry = self.lock();
        let pause = registry
            .sessions
            .get_mut(key)
            .and_then(|entry| entry.pause.as_mut())
            .filter(|pause| {
                pause.confirmation_id == confirmation_id && pause.decide_tx.is_some()
            })?;
        pause.escalated_to = Some(group.to_owned());
        pause.escalations.push(crate::store::Escalated {
            group: group.to_owned(),
            tasks: tasks.to_vec(),
        });
        if let Some(extends) = extends {
            pause.expires_at += extends;
            pause.extended = true;
        }
        Some(pause.expires_at)
    }
}

impl ConfirmationManager {
    /// Number of sessions with a live run.
    pub fn active_runs(&self) -> usize {
        self.lock().sessions.len()
    }

    /// Number of runs paused on a confirmation nobody has decided yet.
    pub fn paused_runs(&self) -> usize {
        self.counts().paused
    }

    /// Active and paused runs, read under one lock.
    pub fn counts(&self) -> super::RunCounts {
        let registry = self.lock();
        super::RunCounts {
            active: registry.sessions.len(),
            paused: registry.sessions.values().filter(|e| e.waits()).count(),
        }
    }
}
