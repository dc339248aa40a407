//! A pause's AG-UI shape, as each kind of pause answers it: the
//! interrupts it ends a run with, a `resume` of them and the reply it
//! makes. Each kind implements [`AguiFace`] in its own file under
//! `protocol/kinds/`; this file knows no kind.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::protocol::request::TaskDecisionRequest;
use crate::protocol::task_spec::TaskSpec;

/// One answer of a `resume`: to which interrupt, and how.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResumeEntry {
    pub interrupt_id: String,
    pub status: ResumeStatus,
    #[serde(default)]
    pub payload: Option<Value>,
}

/// `resolved` (the payload answers) or `cancelled` (no answer: the task
/// does not run, the question is skipped).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResumeStatus {
    Resolved,
    Cancelled,
}

/// Something the run needs from a person before it goes on: a task's
/// approval (`tool_approval`), an answer (`question`), or whether to run
/// a call a crash cut short again (`reconcile`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Interrupt {
    pub id: String,
    pub reason: &'static str,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    pub response_schema: Value,
    pub expires_at: String,
    pub metadata: Map<String, Value>,
}

/// A kind of pause as AG-UI shows and reads it: its interrupts, and the
/// reply a `resume` of them makes. Each kind answers it in its own file
/// (`protocol/kinds/`), so a new kind is named here by the compiler.
pub trait AguiFace {
    /// Its interrupts (`open`: the indexes of the tasks it still waits on).
    fn interrupts(&self, open: &[usize]) -> Vec<Interrupt>;
    /// The reply `resume` makes to it.
    fn reply_of(&self, open: &[usize], resume: &[ResumeEntry]) -> Result<ResumeReply, ResumeError>;
}

/// A `resume` as a reply: its `CONFIRM_ACTION` message and what it
/// carries.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumeReply {
    pub message: String,
    pub decisions: Option<Vec<TaskDecisionRequest>>,
    pub answers: Option<Map<String, Value>>,
}

impl ResumeReply {
    pub(crate) fn action(action: &str) -> ResumeReply {
        ResumeReply {
            message: format!("CONFIRM_ACTION:{action}"),
            decisions: None,
            answers: None,
        }
    }
}

/// Why a `resume` cannot be a reply to the pause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResumeError {
    /// An interrupt id that is not one of the pause's.
    Unknown(String),
    /// A payload that is no decision (`invalid_decision`).
    Decision(String),
    /// A payload that is no answer (`invalid_answer`).
    Answer(String),
}

/// A task's interrupt id (its `task_id`).
pub fn task_interrupt_id(confirmation_id: &str, task: &TaskSpec) -> String {
    task.task_id
        .clone()
        .unwrap_or_else(|| format!("{confirmation_id}-t{}", task.index))
}
