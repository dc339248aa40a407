//! A plan's tasks as its run takes them while the pause waits (#42): the
//! tasks decided on their own so far (kept), which are pending, each
//! task's own expiry, the tasks it rejects when their time is up, and the
//! tasks the run starts (kept before they run, never run twice).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::quorum::Tally;
use super::{Pause, RunSlot};
use crate::protocol::{Decisions, TaskDecision, Verdict, Via};
use crate::store::{DecidedTask, TaskApprovals};

/// The label a task that expired is decided by.
pub const EXPIRED_BY: &str = "timeout";

/// A pending task's own expiry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TaskExpiry {
    pub index: usize,
    pub at: SystemTime,
    /// Silence rejects it (`on_timeout = "reject"`); else it cancels the
    /// run.
    pub rejects: bool,
}

/// Pending tasks rejected because nobody decided them in their time: the
/// step to keep (as a `decide`'s is).
#[derive(Debug, Clone)]
pub struct Expired {
    pub confirmation_id: String,
    pub round: u32,
    pub stored: Option<Arc<str>>,
    /// The tasks it rejects.
    pub now: Decisions,
    /// Every task decided on its own so far, these included.
    pub decided: Vec<DecidedTask>,
    pub task_approvals: Vec<TaskApprovals>,
    pub approvals_before: Vec<TaskApprovals>,
    /// The tasks still pending.
    pub pending: Vec<usize>,
}

/// Why tasks could not be expired now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpireError {
    /// A step is being kept: try again shortly.
    Busy,
    /// The pause waits no more, or the tasks are decided.
    Decided,
}

/// Whether a task decided on its own may start now.
#[derive(Debug, PartialEq, Eq)]
pub enum TaskStart {
    /// It was started before (by this run, or before a restart): it is
    /// not run again.
    Again,
    /// It starts; the pause still waits, so the tasks started so far
    /// (this one included) are kept in the store (the run `run`'s record)
    /// first.
    Keep {
        run: Arc<str>,
        confirmation_id: String,
        started: Vec<usize>,
    },
    /// It starts; the pause is decided (or kept in no store).
    Now,
}

impl Tally {
    /// Whether task `index` was decided on its own.
    pub fn has_decided(&self, index: usize) -> bool {
        self.decided.iter().any(|done| done.decision.index == index)
    }
}

impl Pause {
    /// Its tasks not decided yet (their indexes, in order).
    fn pending_tasks(&self) -> Vec<usize> {
        self.asking
            .tasks()
            .iter()
            .map(|task| task.index)
            .filter(|&index| !self.tally.has_decided(index))
            .collect()
    }
}

impl RunSlot {
    /// `look` at this run's pause, under the registry's lock; `None` when
    /// it has none.
    fn own_pause<T>(&self, look: impl FnOnce(&mut Pause) -> T) -> Option<T> {
        let mut registry = self.manager.lock();
        let pause = registry
            .sessions
            .get_mut(&self.key)
            .filter(|entry| entry.run_id == self.run_id)
            .and_then(|entry| entry.pause.as_mut())?;
        Some(look(pause))
    }

    /// The tasks of this run's pause decided on their own and kept so
    /// far, in the order they were decided.
    pub fn decided_so_far(&self) -> Decisions {
        let decided = self.own_pause(|pause| {
            let kept = pause.kept_tasks.min(pause.tally.decided.len());
            pause.tally.decided[..kept]
                .iter()
                .map(|done| done.decision.clone())
                .collect()
        });
        Decisions(decided.unwrap_or_default())
    }

    /// Task `index` of this run's pause, if it was decided on its own and
    /// kept: who decided it and how, with the pause's id (its receipt).
    pub fn decided_task(&self, index: usize) -> Option<(String, DecidedTask)> {
        self.own_pause(|pause| {
            let kept = pause.kept_tasks.min(pause.tally.decided.len());
            pause.tally.decided[..kept]
                .iter()
                .find(|done| done.decision.index == index)
                .map(|done| (pause.confirmation_id.clone(), done.clone()))
        })
        .flatten()
    }

    /// The tasks of this run's pause not decided yet (their indexes).
    pub fn pending_tasks(&self) -> Vec<usize> {
        self.own_pause(|pause| pause.pending_tasks())
            .unwrap_or_default()
    }

    /// Marks task `index` of this run's pause as started (see
    /// [`TaskStart`]).
    pub fn start_task(&self, index: usize) -> TaskStart {
        let started = self.own_pause(|pause| {
            if pause.tally.started.contains(&index) {
                return TaskStart::Again;
            }
            if pause.decide_tx.is_none() {
                return TaskStart::Now;
            }
            pause.tally.started.push(index);
            match &pause.stored {
                Some(run) => TaskStart::Keep {
                    run: run.clone(),
                    confirmation_id: pause.confirmation_id.clone(),
                    started: pause.tally.started.clone(),
                },
                None => TaskStart::Now,
            }
        });
        started.unwrap_or(TaskStart::Now)
    }

    /// The tasks of this run's pause still pending, each with its own
    /// expiry (`timeout`: its gate's, else `default`) and whether silence
    /// rejects it; `None` when the pause waits no more.
    pub fn task_expiries(&self, default: Duration) -> Option<Vec<TaskExpiry>> {
        self.own_pause(|pause| {
            let tasks = pause.asking.tasks();
            if pause.decide_tx.is_none() || tasks.is_empty() {
                return None;
            }
            let expiries = tasks
                .iter()
                .filter(|task| !pause.tally.has_decided(task.index))
                .map(|task| TaskExpiry {
                    index: task.index,
                    at: pause.asked_at + task.gate.timeout.unwrap_or(default),
                    rejects: task.gate.rejects_on_timeout(),
                });
            Some(expiries.collect())
        })
        .flatten()
    }

    /// Rejects the pending tasks `due` of this run's pause, which nobody
    /// decided in their time, as decided on their own (`expired`): the
    /// step to keep, or why not now.
    pub fn expire_tasks(&self, due: &[usize]) -> Result<Expired, ExpireError> {
        self.own_pause(|pause| {
            if pause.decide_tx.is_none() || pause.stop.is_cancelled() {
                return Err(ExpireError::Decided);
            }
            if pause.approving {
                return Err(ExpireError::Busy);
            }
            let now: Vec<TaskDecision> = due
                .iter()
                .filter(|&&index| !pause.tally.has_decided(index))
                .map(|&index| TaskDecision {
                    index,
                    verdict: Verdict::Reject {
                        reason: Some("no answer in time".to_owned()),
                    },
                })
                .collect();
            if now.is_empty() {
                return Err(ExpireError::Decided);
            }
            let before = pause.tally.task_approvals.clone();
            pause
                .tally
                .task_approvals
                .retain(|task| !due.contains(&task.index));
            pause
                .tally
                .decided
                .extend(now.iter().map(|decision| DecidedTask {
                    by: EXPIRED_BY.to_owned(),
                    decision: decision.clone(),
                    expired: true,
                    approved_by: Vec::new(),
                    via: Via::Chat,
                    at_ms: crate::clock::now_ms(),
                }));
            pause.approving = true;
            Ok(Expired {
                confirmation_id: pause.confirmation_id.clone(),
                round: pause.round,
                stored: pause.stored.clone(),
                now: Decisions(now),
                decided: pause.tally.decided.clone(),
                task_approvals: pause.tally.task_approvals.clone(),
                approvals_before: before,
                pending: pause.pending_tasks(),
            })
        })
        .unwrap_or(Err(ExpireError::Decided))
    }
}
