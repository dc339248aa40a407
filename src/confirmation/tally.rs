//! What a pause itself says of a confirm, under the registry's lock: its
//! count into a quorum's tally (one approval at a time: an approval counts
//! only once it is kept; a grant only with the approval that decides), and
//! when its escalation lifts a refusal. What counts is
//! [`super::quorum::count`]'s.

use super::quorum::{count, Counted, Partial};
use super::{DecideError, Decider, Pause};
use crate::pause::approval::{check_named, undecided_tasks, with_the_rest_approved};
use crate::pause::plan_check::{PlanCheck, Quorum};
use crate::pause::reply::Refused;
use crate::protocol::{Action, Decisions, TaskDecision, TaskDecisionRequest, Verdict, Via};
use crate::store::{DecidedTask, TaskApprovals};

impl Pause {
    /// The error of a reply its kind refused. A refusal of `decider` that
    /// this pause's escalation to a group it is in will lift says when ("it
    /// escalates to oncall at T").
    pub(super) fn refused(&self, refused: Refused, decider: &Decider) -> DecideError {
        let refused = DecideError::from(refused);
        let DecideError::ForbiddenScope(why) = refused else {
            return refused;
        };
        let Some(plan) = self.asking.plan() else {
            return DecideError::ForbiddenScope(why);
        };
        let escalation = plan
            .tasks
            .iter()
            .filter_map(|task| task.gate.escalate.as_ref())
            .min_by_key(|escalation| escalation.after)
            .filter(|escalation| {
                decider.is_member(&escalation.to)
                    && !self.escalations.iter().any(|e| e.group == escalation.to)
                    && self.escalated_to.as_deref() != Some(escalation.to.as_str())
            });
        match escalation {
            Some(escalation) => DecideError::ForbiddenScope(format!(
                "{why}; it escalates to {} at {} if nobody decides it by then",
                escalation.to,
                crate::clock::rfc3339(self.asked_at + escalation.after)
            )),
            None => DecideError::ForbiddenScope(why),
        }
    }

    /// Counts a confirm of `decider` (with `verdicts`, `granting` or not)
    /// into this pause's tally: only while no other approval is being kept
    /// (an approval counts only once kept), and a grant only with the
    /// approval that decides. A step that does not decide marks the pause
    /// `approving` until its approval is kept or withdrawn.
    pub(super) fn count_confirm(
        &mut self,
        quorum: &Quorum,
        decider: &Decider,
        verdicts: &Decisions,
        granting: bool,
    ) -> Result<Counted, DecideError> {
        let Some(plan) = self.asking.plan() else {
            // Nothing to count: the one reply decides.
            return Ok(Counted::Decides {
                approved_by: vec![decider.label.clone()],
                decisions: verdicts.clone(),
            });
        };
        if self.approving && quorum.required > 1 {
            return Err(DecideError::Counting);
        }
        let mut tally = self.tally.clone();
        let counted = count(plan, quorum, &mut tally, decider, verdicts)?;
        if let Counted::Recorded(_) = counted {
            if granting {
                return Err(DecideError::InvalidGrant(
                    "grant: this confirm is one approval of several, and a grant is given by \
                     the approval that decides the pause: confirm without it, or give it with \
                     the last approval"
                        .to_owned(),
                ));
            }
            self.approving = true;
        }
        self.tally = tally;
        Ok(counted)
    }

    /// A `decide` of `decider` (its `requests`), or a confirm of a pause
    /// some of whose tasks were decided on their own: the tasks named are
    /// decided (each pending: a task decided before is 409
    /// `already_decided`), and a confirm decides every task still pending
    /// (approved). A task that needs several approvals (`approvals = N`)
    /// counts this one towards them, and is decided once it has them; a
    /// reject of it decides it (a veto), an edit or a respond is refused
    /// (`edit_needs_new_round`). The pause is decided once no task is
    /// pending; a reply that leaves tasks pending marks it `approving`
    /// until its step is kept or withdrawn.
    pub(super) fn count_tasks(
        &mut self,
        decider: &Decider,
        via: Via,
        action: Action,
        requests: &[TaskDecisionRequest],
    ) -> Result<Counted, DecideError> {
        let Some(plan) = self.asking.plan_by_task() else {
            return Err(DecideError::InvalidDecision(
                "decide goes with a confirmation request".to_owned(),
            ));
        };
        if self.approving {
            return Err(DecideError::Counting);
        }
        if action == Action::Decide && !self.tally.approvals.is_empty() {
            return Err(DecideError::InvalidDecision(format!(
                "this confirmation is being approved whole ({} approval(s) so far: {}): \
                 confirm to add yours",
                self.tally.approvals.len(),
                self.tally.approvals.join(", ")
            )));
        }
        let named = check_named(requests, plan)?;
        if let Some(done) = named.0.iter().find_map(|d| self.decided(d.index)) {
            return Err(DecideError::TaskDecided(format!(
                "task {} is decided already ({} by {}); the tasks still pending are {}",
                done.decision.index,
                done.decision.verdict.as_str(),
                done.by,
                self.pending(plan).unwrap_or_else(|| "none".to_owned())
            )));
        }
        let decided: Vec<TaskDecision> = self
            .tally
            .decided
            .iter()
            .map(|done| done.decision.clone())
            .collect();
        let unnamed: Vec<usize> = plan
            .tasks
            .iter()
            .map(|task| task.index)
            .filter(|index| !decided.iter().chain(&named.0).any(|d| d.index == *index))
            .collect();
        if action == Action::Confirm && plan.explicit && !unnamed.is_empty() {
            return Err(undecided_tasks(&unnamed).into());
        }
        // What this reply says of each task: the named ones as given, and
        // with a confirm the rest approved.
        let mut given = named.0.clone();
        if action == Action::Confirm {
            given.extend(unnamed.iter().map(|&index| TaskDecision {
                index,
                verdict: Verdict::Approve,
            }));
        }
        let counted = count_task_approvals(plan, &self.tally.task_approvals, decider, given)?;
        let mut approved_by: Vec<String> = Vec::new();
        let labels = self.tally.decided.iter().map(|done| &done.by);
        for label in labels
            .chain(counted.quorums.iter().flat_map(|done| &done.approvals))
            .chain([&decider.label])
        {
            if !approved_by.contains(label) {
                approved_by.push(label.clone());
            }
        }
        let pending: Vec<usize> = plan
            .tasks
            .iter()
            .map(|task| task.index)
            .filter(|index| {
                !decided
                    .iter()
                    .chain(&counted.now)
                    .any(|d| d.index == *index)
            })
            .collect();
        if pending.is_empty() {
            let now = Decisions(counted.now);
            let decisions = with_the_rest_approved(&plan.tasks, &now, &decided);
            return Ok(Counted::Decides {
                approved_by,
                decisions,
            });
        }
        let before = std::mem::replace(&mut self.tally.task_approvals, counted.task_approvals);
        self.tally
            .decided
            .extend(counted.now.iter().map(|decision| {
                DecidedTask {
                    by: decider.label.clone(),
                    decision: decision.clone(),
                    expired: false,
                    approved_by: counted
                        .quorums
                        .iter()
                        .find(|done| done.index == decision.index)
                        .map(|done| done.approvals.clone())
                        .unwrap_or_default(),
                    via,
                    at_ms: crate::clock::now_ms(),
                }
            }));
        self.approving = true;
        Ok(Counted::Partial(Box::new(Partial {
            now: Decisions(counted.now),
            decided: self.tally.decided.clone(),
            pending,
            approving: counted.approving,
            task_approvals: self.tally.task_approvals.clone(),
            approvals_before: before,
        })))
    }

    /// The task `index` decided on its own before, if it was.
    fn decided(&self, index: usize) -> Option<&DecidedTask> {
        self.tally
            .decided
            .iter()
            .find(|done| done.decision.index == index)
    }

    /// The tasks still pending, as a list for a person (`None`: none).
    fn pending(&self, plan: &PlanCheck) -> Option<String> {
        let pending: Vec<String> = plan
            .tasks
            .iter()
            .filter(|task| self.decided(task.index).is_none())
            .map(|task| task.index.to_string())
            .collect();
        (!pending.is_empty()).then(|| pending.join(", "))
    }
}

/// What one reply's verdicts do to the tasks it names.
struct TasksCounted {
    /// The tasks it decides.
    now: Vec<TaskDecision>,
    /// The tasks it approved towards a quorum they do not have yet.
    approving: Vec<TaskApprovals>,
    /// Every task's approvals short of its quorum, this reply's counted.
    task_approvals: Vec<TaskApprovals>,
    /// Each quorum it completed, with its approvers.
    quorums: Vec<TaskApprovals>,
}

/// Counts `given` (one verdict per task) of `decider`: a task that needs
/// one approval is decided as given; one that needs several counts an
/// approval (409 `already_approved` for the same label twice) and is
/// decided once it has them; a reject of it decides it; an edit or a
/// respond of it is refused (the other approvers did not see it).
fn count_task_approvals(
    plan: &PlanCheck,
    so_far: &[TaskApprovals],
    decider: &Decider,
    given: Vec<TaskDecision>,
) -> Result<TasksCounted, DecideError> {
    let mut counted = TasksCounted {
        now: Vec::new(),
        approving: Vec::new(),
        task_approvals: so_far.to_vec(),
        quorums: Vec::new(),
    };
    for decision in given {
        let required = plan
            .tasks
            .iter()
            .find(|task| task.index == decision.index)
            .map_or(1, |task| usize::from(task.gate.approvals).max(1));
        if required <= 1 {
            counted.now.push(decision);
            continue;
        }
        let index = decision.index;
        let at = counted.task_approvals.iter().position(|t| t.index == index);
        match &decision.verdict {
            Verdict::Approve => {
                let at = at.unwrap_or_else(|| {
                    counted.task_approvals.push(TaskApprovals {
                        index,
                        approvals: Vec::new(),
                        required,
                    });
                    counted.task_approvals.len() - 1
                });
                let task = &mut counted.task_approvals[at];
                if task.approvals.contains(&decider.label) {
                    return Err(DecideError::AlreadyApproved(format!(
                        "{} (for task {index})",
                        decider.label
                    )));
                }
                task.approvals.push(decider.label.clone());
                if task.approvals.len() >= required {
                    let done = counted.task_approvals.remove(at);
                    counted.quorums.push(done);
                    counted.now.push(decision);
                } else {
                    counted.approving.push(task.clone());
                }
            }
            // A veto: the task is rejected, whatever its approvals.
            Verdict::Reject { .. } => {
                if let Some(at) = at {
                    counted.task_approvals.remove(at);
                }
                counted.now.push(decision);
            }
            Verdict::Edit { .. } | Verdict::Respond { .. } => {
                return Err(DecideError::EditNeedsNewRound(format!(
                    "task {index} needs {required} approvals, and an edit or a respond would \
                     change what the other approvers approve: approve or reject it, or modify \
                     the plan (a new round, whose approvals start from zero)"
                )))
            }
        }
    }
    Ok(counted)
}
