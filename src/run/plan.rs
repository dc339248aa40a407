//! What an engine puts to the user (a [`Plan`] to approve, [`Questions`]
//! to answer) and what it hears back ([`Approval`], [`Answers`]; a cancel,
//! a timeout and every other stop arrive as
//! [`RunError::Cancelled`](super::outcome::RunError::Cancelled)).

use serde_json::{Map, Value};

use crate::protocol::question::Question;
use crate::protocol::{Decisions, RiskLevel, TaskSpec};

/// Why a task decided on its own and started before a restart is not
/// carried out after it: at most once, until an execution journal can
/// tell (#44).
pub const NOT_RUN_AGAIN: &str = "not run again: it was decided and started before the server \
     restarted, and whether it took effect is not known";

/// A plan put to the user.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The `chunk` text of the confirmation request.
    pub summary: String,
    pub tasks: Vec<TaskSpec>,
    pub risk_level: RiskLevel,
    /// What [`Engine::resume`](crate::run::Engine::resume) needs to go on from this pause after a
    /// restart; `None` if the engine cannot (the pause is then not stored).
    pub state: Option<Value>,
}

/// What the user answered to a plan (cancel arrives as `RunError::Cancelled`).
#[derive(Debug, Clone, PartialEq)]
pub enum Approval {
    /// With the verdict for each task: approved unless rejected, edited or
    /// answered by the user (`decisions` of the reply).
    Confirm(Decisions),
    Modify(String),
    /// Some tasks decided on their own (every one so far, in the order
    /// they were decided), others still pending: the pause waits on
    /// ([`RunContext::confirm_as_decided`](crate::run::context::RunContext::confirm_as_decided)).
    Partly(Decisions),
}

/// Questions put to the user (an `input_request`): 1 to 4, checked against
/// the bounds of [`crate::protocol::question`] before anything is asked.
#[derive(Debug, Clone)]
pub struct Questions {
    /// The `chunk` text and the `title` of the request.
    pub title: String,
    pub questions: Vec<Question>,
    /// As [`Plan::state`]: what the engine needs to go on after a restart.
    pub state: Option<Value>,
}

/// What the user answered to questions (cancel arrives as `RunError::Cancelled`).
#[derive(Debug, Clone, PartialEq)]
pub enum Answers {
    /// `{"<question id>": value}`, normalized: the chosen option's label,
    /// the labels chosen (multi-select), the other text or the typed value.
    /// An optional question left unanswered has no entry.
    Given(Map<String, Value>),
    /// The user declined to answer: the asker decides what that means.
    Skipped,
}

/// The decision a restored run's engine goes on from (see
/// [`Engine::resume`](crate::run::Engine::resume)): of a plan, or of questions.
#[derive(Debug, Clone, PartialEq)]
pub enum Resumed {
    Approval(Approval),
    Answers(Answers),
}
