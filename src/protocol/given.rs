//! What a reply gave its pause, by the pause's kind: an approval's verdict
//! per task, or a question pause's answers. The server holds it as one
//! value ([`Given`]); the wire keeps one optional field per kind
//! (`decisions`, `answers`), written and read here only.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::chunk::Decisions;
use super::names::{Action, CancelReason};

/// What a reply gave: the verdicts of an approval (a confirm; a timeout's
/// rejects), or the normalized answers to questions. Written into an
/// object (`#[serde(flatten)]`) it is that object's `decisions` or
/// `answers` field.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Given {
    Decisions(Decisions),
    Answers(Map<String, Value>),
}

impl Given {
    /// An approval's verdicts, if that is what was given.
    pub fn decisions(&self) -> Option<&Decisions> {
        match self {
            Given::Decisions(decisions) => Some(decisions),
            Given::Answers(_) => None,
        }
    }

    /// A question pause's answers, if that is what was given.
    pub fn answers(&self) -> Option<&Map<String, Value>> {
        match self {
            Given::Answers(answers) => Some(answers),
            Given::Decisions(_) => None,
        }
    }
}

/// Its wire fields: `decisions` and `answers`, at most one of them set.
pub fn split(given: Option<&Given>) -> (Option<&Decisions>, Option<&Map<String, Value>>) {
    (
        given.and_then(Given::decisions),
        given.and_then(Given::answers),
    )
}

/// Its wire fields, owned: `decisions` and `answers`, at most one of them
/// set.
pub fn into_parts(given: Option<Given>) -> (Option<Decisions>, Option<Map<String, Value>>) {
    match given {
        Some(Given::Decisions(decisions)) => (Some(decisions), None),
        Some(Given::Answers(answers)) => (None, Some(answers)),
        None => (None, None),
    }
}

/// Read back from its wire fields (answers first: a record never has both).
pub fn join(decisions: Option<Decisions>, answers: Option<Map<String, Value>>) -> Option<Given> {
    answers
        .map(Given::Answers)
        .or(decisions.map(Given::Decisions))
}

/// A pause's decision as a store keeps it, on the wire: a `decisions` key
/// always (null when none), `answers` only when there are some.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DecisionRecord {
    pub action: Action,
    pub confirmation_id: String,
    #[serde(default)]
    pub decisions: Option<Decisions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answers: Option<Map<String, Value>>,
    #[serde(default)]
    pub reason: Option<CancelReason>,
    /// A modify's text (at most `MAX_MODIFY_TEXT_BYTES`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default)]
    pub nonce: String,
}
