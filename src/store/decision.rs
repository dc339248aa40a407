//! A pause's decision as a store records it ([`StoredDecision`]), before
//! the run acts on it, and what became of one whose recording had an
//! unknown outcome ([`Resolution`]).

use serde::{Deserialize, Serialize};

use crate::protocol::given::{self, DecisionRecord};
use crate::protocol::{Action, CancelReason, Given};

/// A pause's decision as recorded (its stored form:
/// [`crate::protocol::given::DecisionRecord`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(from = "DecisionRecord", into = "DecisionRecord")]
pub struct StoredDecision {
    /// What was decided: `confirm`, `modify`, `cancel`, `answer`, `skip`.
    pub action: Action,
    pub confirmation_id: String,
    /// A confirm's verdict per task, or an answer's normalized answers.
    pub given: Option<Given>,
    /// Why a cancel was decided (`user`, `superseded`, `timeout`, ...).
    pub reason: Option<CancelReason>,
    /// A modify's text: a run that goes on after a crash replans with it.
    pub text: Option<String>,
    /// New for every attempt to record a decision: the same nonce recorded
    /// twice is one decision, and [`Store::resolve`](super::Store::resolve) looks for it.
    pub nonce: String,
}

impl From<DecisionRecord> for StoredDecision {
    fn from(record: DecisionRecord) -> StoredDecision {
        StoredDecision {
            action: record.action,
            confirmation_id: record.confirmation_id,
            given: given::join(record.decisions, record.answers),
            reason: record.reason,
            text: record.text,
            nonce: record.nonce,
        }
    }
}

impl From<StoredDecision> for DecisionRecord {
    fn from(decision: StoredDecision) -> DecisionRecord {
        let (decisions, answers) = given::split(decision.given.as_ref());
        DecisionRecord {
            action: decision.action,
            confirmation_id: decision.confirmation_id,
            decisions: decisions.cloned(),
            answers: answers.cloned(),
            reason: decision.reason,
            text: decision.text,
            nonce: decision.nonce,
        }
    }
}

impl StoredDecision {
    /// A decision to record, with a fresh nonce.
    pub fn new(
        action: Action,
        confirmation_id: &str,
        given: Option<Given>,
        reason: Option<CancelReason>,
    ) -> StoredDecision {
        StoredDecision {
            action,
            confirmation_id: confirmation_id.to_owned(),
            given,
            reason,
            text: None,
            nonce: uuid::Uuid::new_v4().simple().to_string(),
        }
    }
}

/// What became of a decision whose recording had an unknown outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resolution {
    /// It was recorded: the decision stands.
    Recorded,
    /// It was not, and now never will be: the pause is undecided.
    Void,
}
