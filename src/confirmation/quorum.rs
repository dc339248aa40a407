//! How many must approve a plan: a tool's `approvals = N` makes a
//! confirm one approval of N from distinct labels (409 `already_approved`
//! for a label twice), the pause staying pending until the last. Who may
//! decide it at all is the kind's check (`crate::pause::reply::check_decider`).

use super::refused::DecideError;
use crate::decider::Decider;
use crate::pause::plan_check::{PlanCheck, Quorum};
use crate::protocol::{Decisions, Verdict};
use crate::store::{CarriedReject, DecidedTask, TaskApprovals};

/// What a confirm of a quorum pause does.
#[derive(Debug, Clone, PartialEq)]
pub enum Counted {
    /// The pause is decided: every task still approved has its approvals
    /// (or one was enough). `approved_by` every label, in order;
    /// `decisions` the verdicts with every earlier approver's rejects.
    Decides {
        approved_by: Vec<String>,
        decisions: Decisions,
    },
    /// One more approval; the pause stays pending.
    Recorded(Progress),
    /// Some tasks decided on their own (`decide`); the others stay pending.
    Partial(Box<Partial>),
}

/// A `decide` that leaves tasks pending: what it decided, every task
/// decided on its own so far (its own included), and the tasks still
/// pending (their indexes, in order).
#[derive(Debug, Clone, PartialEq)]
pub struct Partial {
    pub now: Decisions,
    pub decided: Vec<DecidedTask>,
    pub pending: Vec<usize>,
    /// The tasks it approved that need more approvals than they have:
    /// each with its approvals so far (this one's included).
    pub approving: Vec<TaskApprovals>,
    /// Every task's approvals so far, short of its quorum (what is kept),
    /// and as they were before (what a withdrawn step leaves).
    pub task_approvals: Vec<TaskApprovals>,
    pub approvals_before: Vec<TaskApprovals>,
}

/// A quorum pause's approvals so far, how many it needs, the groups
/// whose members alone give them, and the tasks its approvers rejected
/// on the way (carried to the decision).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub approvals: Vec<String>,
    pub required: usize,
    pub groups: Vec<String>,
    pub rejected: Vec<CarriedReject>,
}

/// What a quorum pause holds between approvals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Tally {
    /// The labels whose approvals are kept (in order).
    pub approvals: Vec<String>,
    /// The tasks they rejected while approving the rest.
    pub rejected: Vec<CarriedReject>,
    /// The tasks decided on their own so far (`decide`), by whom.
    pub decided: Vec<DecidedTask>,
    /// Approvals of tasks that need several, given by `decide` and not
    /// yet enough.
    pub task_approvals: Vec<TaskApprovals>,
    /// Those of them the run started while the pause waited.
    pub started: Vec<usize>,
}

/// Counts `decider`'s confirm (with `verdicts`) into `tally`. A confirm
/// is its decider's approval of what it approves: a task it rejects stays
/// rejected whatever the later approvers say, and the pause is decided
/// only once every task still approved has the approvals its own gate
/// asks (a reject of a task needing one yes never completes another
/// task's quorum). An edit or a `respond` on the way to a quorum would
/// change what the other approvers approve: refused.
pub fn count(
    plan: &PlanCheck,
    quorum: &Quorum,
    tally: &mut Tally,
    decider: &Decider,
    verdicts: &Decisions,
) -> Result<Counted, DecideError> {
    if quorum.required <= 1 {
        return Ok(Counted::Decides {
            approved_by: vec![decider.label.clone()],
            decisions: verdicts.clone(),
        });
    }
    if tally.approvals.contains(&decider.label) {
        return Err(DecideError::AlreadyApproved(decider.label.clone()));
    }
    for decision in &verdicts.0 {
        match decision.verdict {
            Verdict::Edit { .. } => return Err(DecideError::EditNeedsNewRound(EDIT.to_owned())),
            Verdict::Respond { .. } => {
                return Err(DecideError::EditNeedsNewRound(format!(
                    "task {}: a respond stands in for the task's result, which the other \
                     approvers have not seen: approve or reject the task, or modify the plan \
                     (a new round, whose approvals start from zero)",
                    decision.index
                )))
            }
            Verdict::Approve | Verdict::Reject { .. } => {}
        }
    }
    let mut decisions = verdicts.clone();
    for carried in &tally.rejected {
        if let Some(task) = decisions.0.iter_mut().find(|d| d.index == carried.index) {
            if task.verdict == Verdict::Approve {
                task.verdict = Verdict::Reject {
                    reason: carried.reason.clone(),
                };
            }
        }
    }
    tally.approvals.push(decider.label.clone());
    for decision in &verdicts.0 {
        let Verdict::Reject { reason } = &decision.verdict else {
            continue;
        };
        if !tally.rejected.iter().any(|r| r.index == decision.index) {
            tally.rejected.push(CarriedReject {
                by: decider.label.clone(),
                index: decision.index,
                reason: reason.clone(),
            });
        }
    }
    // The approvals the tasks still approved ask: a rejected task asks none.
    let needed = plan
        .tasks
        .iter()
        .filter(|task| decisions.verdict(task.index) == &Verdict::Approve)
        .map(|task| usize::from(task.gate.approvals))
        .max()
        .unwrap_or(1);
    if tally.approvals.len() >= needed {
        return Ok(Counted::Decides {
            approved_by: tally.approvals.clone(),
            decisions,
        });
    }
    Ok(Counted::Recorded(Progress {
        approvals: tally.approvals.clone(),
        required: quorum.required,
        groups: quorum.groups.clone(),
        rejected: tally.rejected.clone(),
    }))
}

/// Why an edit is refused on the way to a quorum.
const EDIT: &str = "an edit would change what the other approvers approve: modify the plan (a \
                    new round, whose approvals start from zero) or reject the task";
