//! A turn of the model loop as a pause keeps it: where the loop stands
//! ([`Resumable`]), the calls awaiting the decision ([`Pending`]) and the
//! conversation up to them ([`PausedTurn`], stored with a durable store);
//! and the `tool` messages that answer the model's calls.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::protocol::question::Question;
use crate::run::context::RunContext;

/// Where a run's model loop stands: what a stored pause must keep to go on.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Resumable {
    /// Where this run's turn starts in the messages.
    pub turn_starts: usize,
    /// Model calls the run may still make.
    pub calls_left: usize,
    /// Whether anything was carried out yet (for the completion's text).
    pub acted: bool,
}

/// A paused run of this engine as stored (`--store`): the conversation up
/// to and including the model's answer whose calls await the decision, and
/// what those calls are.
#[derive(Debug, Serialize, Deserialize)]
pub struct PausedTurn {
    pub messages: Vec<Value>,
    pub go_on: Resumable,
    pub pending: Pending,
}

/// The calls a pause awaits the decision on.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Pending {
    /// A `propose_plan` call and its number of tasks.
    Plan { call_id: String, total: usize },
    /// An answer's calls of declared tools: every call's id (the results go
    /// back in that order), the results known before the pause (errors,
    /// read-only tools that ran), and the calls put to the user.
    Tools {
        call_ids: Vec<String>,
        results: Vec<String>,
        batch: Vec<PendingCall>,
        ran: bool,
    },
    /// An `ask_user` call (at `position` among the answer's calls) and its
    /// questions; the other calls' results.
    Ask {
        call_ids: Vec<String>,
        results: Vec<String>,
        position: usize,
        questions: Vec<Question>,
    },
}

#[derive(Debug, Serialize, Deserialize)]
pub struct PendingCall {
    /// The call's position among the answer's calls.
    pub position: usize,
    pub tool: String,
    pub args: Value,
    /// What allowed it before the pause (a rule, a grant whose call it
    /// spent), when something did: approved as is, it runs as that.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<crate::protocol::ApprovedBy>,
}

/// The state a pause stores, when pauses are stored at all.
pub fn paused_state(
    ctx: &RunContext,
    messages: &[Value],
    go_on: Resumable,
    pending: Pending,
) -> Option<Value> {
    ctx.durable()
        .then(|| {
            serde_json::to_value(PausedTurn {
                messages: messages.to_vec(),
                go_on,
                pending,
            })
            .ok()
        })
        .flatten()
}

/// What the model is told after a modify.
pub fn modify_text(feedback: &str) -> String {
    if feedback.trim().is_empty() {
        "The user did not confirm and asked for changes without saying which.".to_owned()
    } else {
        format!("The user did not confirm and asked for this change: {feedback}")
    }
}

pub fn tool_result(call_id: &str, text: &str) -> Value {
    json!({ "role": "tool", "tool_call_id": call_id, "content": text })
}
