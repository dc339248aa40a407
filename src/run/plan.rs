//! What an engine puts to the user ([`Plan`]) and what it hears back
//! ([`Approval`]; a cancel, a timeout and every other stop arrive as
//! [`RunError::Cancelled`](super::outcome::RunError::Cancelled)).

use serde_json::Value;

use crate::protocol::{Decisions, RiskLevel, TaskSpec};

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
}
