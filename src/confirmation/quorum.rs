//! Who may decide a plan, and how many must approve it: a task's risk
//! above the decider's `max_risk`, or a tool of a group (`approvers =
//! "leads"`) the decider is not in, refuses the reply (403
//! `forbidden_scope`); the requester's own key may not approve where the
//! tools say so (403 `self_approval`); a tool's `approvals = N` makes a
//! confirm one approval of N from distinct labels (409 `already_approved`
//! for a label twice), the pause staying pending until the last.

use super::decider::Decider;
use super::refused::DecideError;
use crate::pause::approval::{PlanCheck, Quorum};
use crate::protocol::{Action, Decisions, Verdict};

/// Refuses `decider` for a pause it may not decide with `action`: a
/// task's risk above its `max_risk`, a group it is not in (the
/// requester's own key is in none: it may only cancel; a pause escalated
/// to a group admits that group's members), the requester where it may
/// not approve.
pub fn check_decider(
    plan: &PlanCheck,
    quorum: &Quorum,
    decider: &Decider,
    action: Action,
    escalated_to: Option<&str>,
) -> Result<(), DecideError> {
    if decider.requester && action == Action::Cancel {
        // A run's own key may always stop it: nothing runs.
        return Ok(());
    }
    if let Some(task) = plan.tasks.iter().find(|t| t.risk > decider.max_risk) {
        return Err(DecideError::ForbiddenScope(format!(
            "task {} is {} risk; this key ({}) decides up to {} risk",
            task.index,
            task.risk.as_str(),
            decider.label,
            decider.max_risk.as_str()
        )));
    }
    // Escalated: the group's members may decide it too.
    let escalated = escalated_to.is_some_and(|group| decider.groups.iter().any(|g| g == group));
    if !quorum.groups.is_empty() && !escalated {
        if decider.requester {
            return Err(DecideError::SelfApproval(format!(
                "this pause is decided by the group {}; the requester's own key may not \
                 decide it (only cancel)",
                quorum.groups.join(" and ")
            )));
        }
        if let Some(group) = quorum.groups.iter().find(|g| !decider.groups.contains(g)) {
            return Err(DecideError::ForbiddenScope(format!(
                "this pause is decided by the group {group}; this key ({}) is not in it",
                decider.label
            )));
        }
    }
    if decider.requester && !quorum.requester_may_approve && action == Action::Confirm {
        return Err(DecideError::SelfApproval(format!(
            "the requester's own key ({}) may not approve this pause: it needs {} approval(s) \
             from other people",
            decider.label, quorum.required
        )));
    }
    Ok(())
}

/// What a confirm of a quorum pause does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Counted {
    /// The pause is decided (every approval in, or one was enough, or a
    /// reject of a task ended it): `approved_by` every label, in order.
    Decides { approved_by: Vec<String> },
    /// One more approval; the pause stays pending.
    Recorded(Progress),
}

/// A quorum pause's approvals so far, how many it needs, and the groups
/// whose members alone give them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Progress {
    pub approvals: Vec<String>,
    pub required: usize,
    pub groups: Vec<String>,
}

/// Counts `decider`'s confirm (with `verdicts`) into `approvals`.
pub fn count(
    quorum: &Quorum,
    approvals: &mut Vec<String>,
    decider: &Decider,
    verdicts: &Decisions,
) -> Result<Counted, DecideError> {
    if quorum.required <= 1 {
        return Ok(Counted::Decides {
            approved_by: vec![decider.label.clone()],
        });
    }
    if approvals.contains(&decider.label) {
        return Err(DecideError::AlreadyApproved(decider.label.clone()));
    }
    if verdicts
        .0
        .iter()
        .any(|d| matches!(d.verdict, Verdict::Edit { .. }))
    {
        return Err(DecideError::EditNeedsNewRound);
    }
    approvals.push(decider.label.clone());
    // A reject ends the pause at once, as a cancel does: what is left runs
    // only with every approval.
    let rejects = verdicts
        .0
        .iter()
        .any(|d| matches!(d.verdict, Verdict::Reject { .. }));
    if approvals.len() >= quorum.required || rejects {
        return Ok(Counted::Decides {
            approved_by: approvals.clone(),
        });
    }
    Ok(Counted::Recorded(Progress {
        approvals: approvals.clone(),
        required: quorum.required,
        groups: quorum.groups.clone(),
    }))
}
