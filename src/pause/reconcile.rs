//! A call a crash cut short, whose effect nobody can know (#44): a person
//! chooses `run_again` (called again with the same idempotency key),
//! `skip` (recorded as not run) or `cancel` (the run ends). It is decided
//! as the task's approval was: the tool's scope, groups and quorum hold
//! for `run_again`, which is a yes to calling it (a requester may not give
//! it where it may not approve the call); `skip` and `cancel` are a no,
//! which one reply from anyone who may decide gives.

use crate::protocol::Action;

/// The action a reconcile reply counts as on the one decide path:
/// `run_again` as a confirm of its one task (its approvers, its quorum,
/// self-approval), the others as themselves.
pub fn counts_as(action: Action) -> Action {
    match action {
        Action::RunAgain => Action::Confirm,
        action => action,
    }
}

/// Refuses what a reconcile reply may not carry: per-task decisions,
/// answers, a grant.
pub fn check_reply(decisions: bool, answers: bool, grant: bool) -> Result<(), String> {
    let extra = match (decisions, answers, grant) {
        (true, _, _) => "decisions",
        (_, true, _) => "answers",
        (_, _, true) => "a grant",
        _ => return Ok(()),
    };
    Err(format!(
        "{extra} do not go with a reconcile pause: reply run_again, skip or cancel"
    ))
}
