//! A reply as a kind of pause checks it ([`Reply`]), what the check
//! gives ([`Checked`]) and why it refuses one ([`Refused`]). Each kind's
//! `check_reply` lives in its own file and is asked through
//! [`super::Asking::check`]; the registry (`confirmation`) checks what
//! every pause shares (the action offered, the round, the pause still
//! pending) and turns a refusal into its error and status.
//!
//! [`check_decider`] asks the one rule of who may decide
//! ([`crate::decider::may_decide`]) of each task a reply decides.

use super::grant::GrantSpec;
use super::plan_check::{PlanCheck, Quorum};
use crate::decider::{admitting, may_decide, Decider, Deciding, Refusal};
use crate::protocol::given::Given;
use crate::protocol::request::ReplyPayload;
use crate::protocol::{Action, RiskLevel};

/// A reply to a pause, as its kind checks it: what it carries, who sent
/// it, and what the registry knows of the pause's state.
#[derive(Debug, Clone, Copy)]
pub struct Reply<'a> {
    /// Its action, one the pause offers.
    pub action: Action,
    /// Its text (`answer:<text>`, `modify:<text>`).
    pub text: Option<&'a str>,
    /// What it carries beside (`decisions`, `answers`, `grant`), unchecked.
    pub payload: ReplyPayload<'a>,
    /// Who sent it.
    pub decider: &'a Decider,
    /// The tasks of the pause decided on their own so far (their indexes).
    pub decided: &'a [usize],
    /// The pause's escalations, each group with the tasks it admits to.
    pub escalations: &'a [(&'a str, &'a [usize])],
}

/// What a reply gave, checked.
#[derive(Debug, Default)]
pub struct Checked {
    /// A plan's verdicts (every task's for a confirm, the named ones' for
    /// a decide), or a question pause's answers, normalized; `None` where
    /// the reply gives neither (a cancel, a modify, a skip).
    pub given: Option<Given>,
    /// The grant a confirm gives.
    pub granted: Option<Box<GrantSpec>>,
    /// Who must approve the pause, where approvals are counted.
    pub quorum: Option<Quorum>,
}

/// Why a kind refuses a reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// The decider may not decide what the reply decides (403
    /// `forbidden_scope` or `self_approval`).
    Decider(Refusal),
    /// Its decisions (422, see [`DecisionsError`]).
    Decisions(DecisionsError),
    /// 422 `invalid_answer`.
    InvalidAnswer(String),
    /// 422 `invalid_grant`.
    InvalidGrant(String),
}

impl From<DecisionsError> for Refused {
    fn from(err: DecisionsError) -> Refused {
        Refused::Decisions(err)
    }
}

/// Why a reply's decisions are refused (422 each).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecisionsError {
    /// `invalid_decision`.
    Invalid(String),
    /// `denied_by_rule`: an edit's new arguments.
    Denied(String),
    /// `undecided_tasks` (`--explicit-decisions`).
    Undecided(String),
    /// `edit_needs_new_round`: an edit's new call needs more or other
    /// people than the pause's (an `ask` rule matches it).
    NeedsNewRound(String),
}

impl From<String> for DecisionsError {
    fn from(why: String) -> DecisionsError {
        DecisionsError::Invalid(why)
    }
}

/// Refuses `decider` for the tasks of `plan` it may not decide with
/// `action`: the one rule ([`may_decide`]) asked of each task (#42: its
/// risk, its deciding groups, its requester rule, and the escalation, of
/// `escalations`, that admits the decider to it), the riskiest first.
pub fn check_decider<'a>(
    plan: &PlanCheck,
    decider: &Decider,
    action: Action,
    escalations: &[(&'a str, &'a [usize])],
) -> Result<(), Refusal> {
    if plan.tasks.is_empty() {
        let deciding = Deciding {
            risk: RiskLevel::Low,
            riskiest: None,
            groups: &[],
            requester_may_approve: true,
            escalated_to: None,
        };
        return may_decide(decider, &deciding, action);
    }
    let mut tasks: Vec<_> = plan.tasks.iter().collect();
    tasks.sort_by_key(|task| (std::cmp::Reverse(task.risk), std::cmp::Reverse(task.index)));
    for task in tasks {
        let deciding = Deciding {
            risk: task.risk,
            riskiest: Some(task.index),
            groups: &task.gate.approvers,
            requester_may_approve: task.gate.requester_may_approve(),
            escalated_to: admitting(decider, escalations.iter().copied(), &[task.index]),
        };
        may_decide(decider, &deciding, action)?;
    }
    Ok(())
}
