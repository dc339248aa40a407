//! What a pause itself says of a confirm, under the registry's lock: its
//! count into a quorum's tally (one approval at a time: an approval counts
//! only once it is kept; a grant only with the approval that decides), and
//! when its escalation lifts a refusal. What counts is
//! [`super::quorum::count`]'s.

use super::quorum::{count, Counted};
use super::{DecideError, Decider, Pause};
use crate::pause::approval::{PlanCheck, Quorum};
use crate::pause::Asking;
use crate::protocol::Decisions;

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
}
