//! What a pause itself says of a confirm, under the registry's lock: its
//! count into a quorum's tally (one approval at a time: an approval counts
//! only once it is kept; a grant only with the approval that decides), and
//! when its escalation lifts a refusal. What counts is
//! [`super::quorum::count`]'s.

use super::quorum::{count, Counted, Partial};
use super::{DecideError, Decider, Pause};
use crate::pause::approval::{
    check_named, undecided_tasks, with_the_rest_approved, PlanCheck, Quorum,
};
use crate::pause::Asking;
use crate::protocol::{Action, Decisions, TaskDecision, TaskDecisionRequest};
use crate::store::DecidedTask;

impl Pause {
    /// A refusal of `decider` that this pause's escalation to a group it is
    /// in will lift says when ("it escalates to oncall at T").
    pub(super) fn escalates_to(
        &self,
        refused: DecideError,
        plan: &PlanCheck,
        decider: &Decider,
    ) -> DecideError {
        let DecideError::ForbiddenScope(why) = refused else {
            return refused;
        };
        let escalation = plan
            .tasks
            .iter()
            .filter_map(|task| task.gate.escalate.as_ref())
            .min_by_key(|escalation| escalation.after)
            .filter(|escalation| self.escalated_to.is_none() && decider.is_member(&escalation.to));
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
        let plan = match &self.asking {
            Asking::Plan(plan) => plan,
            // Nothing to count: the one reply decides.
            Asking::Questions(_) => {
                return Ok(Counted::Decides {
                    approved_by: vec![decider.label.clone()],
                    decisions: verdicts.clone(),
                })
            }
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
    /// `already_decided`). A confirm approves every task still pending
    /// and decides the pause; so does a decide of the last pending task
    /// (then a confirm). A decide that leaves tasks pending marks the pause
    /// `approving` until its step is kept or withdrawn.
    pub(super) fn count_tasks(
        &mut self,
        decider: &Decider,
        action: Action,
        requests: &[TaskDecisionRequest],
    ) -> Result<Counted, DecideError> {
        let plan = match &self.asking {
            Asking::Plan(plan) => plan,
            Asking::Questions(_) => {
                return Err(DecideError::InvalidDecision(
                    "decide goes with a confirmation request".to_owned(),
                ))
            }
        };
        if self.approving {
            return Err(DecideError::Counting);
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
        let pending = plan.tasks.iter().filter(|task| {
            !decided
                .iter()
                .chain(&named.0)
                .any(|d| d.index == task.index)
        });
        let pending: Vec<usize> = pending.map(|task| task.index).collect();
        if action == Action::Confirm && plan.explicit && !pending.is_empty() {
            return Err(undecided_tasks(&pending).into());
        }
        let mut approved_by: Vec<String> = Vec::new();
        for done in &self.tally.decided {
            if !approved_by.contains(&done.by) {
                approved_by.push(done.by.clone());
            }
        }
        if !approved_by.contains(&decider.label) {
            approved_by.push(decider.label.clone());
        }
        if action == Action::Confirm || pending.is_empty() {
            let decisions = with_the_rest_approved(&plan.tasks, &named, &decided);
            return Ok(Counted::Decides {
                approved_by,
                decisions,
            });
        }
        let mut tally = self.tally.decided.clone();
        tally.extend(named.0.iter().map(|decision| DecidedTask {
            by: decider.label.clone(),
            decision: decision.clone(),
        }));
        self.tally.decided = tally.clone();
        self.approving = true;
        Ok(Counted::Partial(Partial {
            now: named,
            decided: tally,
            pending,
        }))
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
