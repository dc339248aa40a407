//! A call a crash cut short, whose effect nobody can know (#44): a person
//! chooses `run_again` (called again with the same idempotency key),
//! `skip` (recorded as not run) or `cancel` (the run ends). It is decided
//! as the task's approval was: the tool's scope, groups and quorum hold
//! for `run_again`, which is a yes to calling it (a requester may not give
//! it where it may not approve the call); `skip` and `cancel` are a no,
//! which one reply from anyone who may decide gives.

use super::approval::with_the_rest_approved;
use super::plan_check::{PlanCheck, Quorum};
use super::reply::{check_decider, Checked, DecisionsError, Refused, Reply};
use crate::protocol::given::Given;
use crate::protocol::{Action, Decisions};

/// The action a reconcile reply counts as on the one decide path:
/// `run_again` as a confirm of its one task (its approvers, its quorum,
/// self-approval), the others as themselves.
fn counts_as(action: Action) -> Action {
    match action {
        Action::RunAgain => Action::Confirm,
        action => action,
    }
}

/// Checks `reply` against the one task a crash cut short: no per-task
/// decisions, answers or grant; who may decide it (`run_again` as the
/// task's approval was: a confirm of it). A `run_again` approves the
/// task, and counts towards its quorum.
pub fn check_reply(task: &PlanCheck, reply: &Reply<'_>) -> Result<Checked, Refused> {
    let extra = match (
        reply.payload.decisions.is_some_and(|d| !d.is_empty()),
        reply.payload.answers.is_some(),
        reply.payload.grant.is_some(),
    ) {
        (true, _, _) => Some("decisions"),
        (_, true, _) => Some("answers"),
        (_, _, true) => Some("a grant"),
        _ => None,
    };
    if let Some(extra) = extra {
        return Err(Refused::Decisions(DecisionsError::Invalid(format!(
            "{extra} do not go with a reconcile pause: reply run_again, skip or cancel"
        ))));
    }
    check_decider(
        task,
        reply.decider,
        counts_as(reply.action),
        reply.escalations,
    )
    .map_err(Refused::Decider)?;
    let verdicts = (reply.action == Action::RunAgain)
        .then(|| with_the_rest_approved(&task.tasks, &Decisions::default(), &[]));
    Ok(Checked {
        given: verdicts.map(Given::Decisions),
        granted: None,
        quorum: Some(Quorum::of(task)),
    })
}
