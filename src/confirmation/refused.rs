//! Why a reply is refused ([`DecideError`]; the order the checks run is
//! docs/protocol.md's),
//! and what a reply's grant brings to the decision ([`GrantAsk`]).

use serde_json::Value;

use crate::decider::Refusal;
use crate::pause::reply::{DecisionsError, Refused};
use crate::protocol::{Action, MAX_MODIFY_TEXT_BYTES};

/// Why a reply was refused. The order they are checked in is the table of
/// docs/protocol.md ("Refused replies"), which `tests/api/check_order.rs`
/// holds to the server over a socket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecideError {
    /// The session's run is being restored here (a restart, a takeover of
    /// a replica that died) and its pause is not registered yet: retry.
    #[error(
        "this session's run is being restored here (its replica stopped or died); its \
         confirmation is registered again in a moment: retry"
    )]
    Restoring,
    #[error(
        "no confirmation is pending for this session: it has no run (none was started, or \
         it belongs to another API key), its run has ended (completed, cancelled, timed out), \
         or its run is working and has not paused"
    )]
    NoPending,
    #[error("`{action}` is not one of the offered options: {}", names(options))]
    NotOffered {
        action: String,
        options: Vec<Action>,
    },
    #[error(
        "the modify text is longer than {MAX_MODIFY_TEXT_BYTES} bytes; the options are: {}",
        names(options)
    )]
    ModifyTooLong { options: Vec<Action> },
    #[error("confirmation_id does not match the pending confirmation")]
    Stale,
    #[error("{0}")]
    InvalidDecision(String),
    /// An edit's new arguments match a `deny` rule.
    #[error("{0}")]
    DeniedByRule(String),
    /// `--explicit-decisions`: a `decisions` reply left tasks undecided.
    #[error("{0}")]
    UndecidedTasks(String),
    /// A confirm's `grant` does not fit the pause (or comes without a confirm).
    #[error("{0}")]
    InvalidGrant(String),
    /// The requester's namespace holds the most live grants already.
    #[error(
        "this key's namespace holds {} live grants already; revoke some (DELETE \
         /api/v1/grants/ID) or let them expire",
        crate::store::grant::MAX_GRANTS_PER_NAMESPACE
    )]
    TooManyGrants,
    /// The deciding key may not decide this pause (its risk, its group, its
    /// namespace).
    #[error("{0}")]
    ForbiddenScope(String),
    /// The requester's own key may not approve this pause.
    #[error("{0}")]
    SelfApproval(String),
    /// A `preview_digest` that is not the task's current preview's (#43).
    #[error("{0}")]
    PreviewStale(String),
    /// This label approved this pause already (a quorum counts it once).
    #[error("{0} has approved this confirmation already; it needs other people's approvals")]
    AlreadyApproved(String),
    /// An edit (or a `respond`) on a pause whose approvals others give: it
    /// would change what they approved; or an edit whose new call needs
    /// more or other people than the pause's.
    #[error("{0}")]
    EditNeedsNewRound(String),
    #[error("{0}")]
    InvalidAnswer(String),
    #[error(
        "an earlier reply to this confirmation has an outcome that is not known yet (the \
         store did not answer in time); it is being settled: retry in a moment"
    )]
    Settling,
    /// Another approval of this quorum pause is being kept: an approval
    /// counts only once kept, so this one waits its turn.
    #[error(
        "another approval of this confirmation is being recorded; nothing was taken: retry in \
         a moment"
    )]
    Counting,
    #[error("this confirmation has already been decided")]
    AlreadyDecided,
    /// A task named was decided on its own before (`decide`): the others
    /// may still be decided.
    #[error("{0}")]
    TaskDecided(String),
}

impl From<DecisionsError> for DecideError {
    fn from(err: DecisionsError) -> DecideError {
        match err {
            DecisionsError::Invalid(why) => DecideError::InvalidDecision(why),
            DecisionsError::Denied(why) => DecideError::DeniedByRule(why),
            DecisionsError::Undecided(why) => DecideError::UndecidedTasks(why),
            DecisionsError::NeedsNewRound(why) => DecideError::EditNeedsNewRound(why),
        }
    }
}

impl From<Refused> for DecideError {
    fn from(refused: Refused) -> DecideError {
        match refused {
            Refused::Decider(Refusal::OutOfScope(why)) => DecideError::ForbiddenScope(why),
            Refused::Decider(Refusal::SelfApproval(why)) => DecideError::SelfApproval(why),
            Refused::Decisions(err) => DecideError::from(err),
            Refused::InvalidAnswer(why) => DecideError::InvalidAnswer(why),
            Refused::InvalidGrant(why) => DecideError::InvalidGrant(why),
        }
    }
}

/// Who a reply comes from, and the grant it gives (with a confirm).
#[derive(Debug, Clone, Copy)]
pub struct ReplyFrom<'a> {
    pub decider: &'a crate::decider::Decider,
    pub grant: Option<&'a Value>,
    /// The door the reply came through (a receipt's `via`).
    pub via: crate::protocol::Via,
}

impl<'a> ReplyFrom<'a> {
    /// A reply of `decider` that grants nothing.
    pub fn plain(decider: &'a crate::decider::Decider) -> ReplyFrom<'a> {
        ReplyFrom {
            decider,
            grant: None,
            via: crate::protocol::Via::Chat,
        }
    }
}

/// `confirm, modify, cancel`.
fn names(options: &[Action]) -> String {
    options
        .iter()
        .map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}
