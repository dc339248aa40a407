//! The AG-UI face (AG-UI 1.1, pinned), as data: no I/O. `POST
//! /api/v1/agui` takes a [`RunAgentInput`] and answers a stream of
//! [`Event`]s; it is another door into the same runs, pauses and decision
//! path as the chat endpoint (docs/protocol.md, "The AG-UI face").
//!
//! - [`face`]: what each kind of pause answers to be shown and resumed in
//!   AG-UI ([`AguiFace`]: its kind's file under `protocol/kinds/` does);
//! - [`interrupts`]: a pause as the interrupts that end an AG-UI run, and
//!   a `resume` as the reply the decision path takes;
//! - [`translate`]: a run's chunks as AG-UI events.

pub mod face;
pub mod interrupts;
pub mod translate;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

pub use face::{
    task_interrupt_id, AguiFace, Interrupt, ResumeEntry, ResumeError, ResumeReply, ResumeStatus,
};

/// The AG-UI endpoint: a run (`RunAgentInput`), answered as events.
pub const AGUI_PATH: &str = "/api/v1/agui";
/// The agent's capabilities (`GET`), as AG-UI's `getCapabilities()` returns them.
pub const AGUI_CAPABILITIES_PATH: &str = "/api/v1/agui/capabilities";
/// Largest `RunAgentInput`, in bytes: an AG-UI client sends the thread's
/// whole history with every run, of which chatgate reads the last user
/// message (itself at most [`super::MAX_MESSAGE_BYTES`]) and keeps none.
pub const MAX_AGUI_BODY_BYTES: usize = 1024 * 1024;
/// Most `resume` entries one input may carry: a pause has at most 64 tasks.
pub const MAX_RESUME_ENTRIES: usize = super::MAX_PLAN_TASKS;

/// What an AG-UI client sends to run the agent (`RunAgentInput`): the
/// fields chatgate reads. `tools`, `context`, `state` and
/// `forwardedProps` are accepted and not used (the server's tools file
/// decides what can run, never the client).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunAgentInput {
    /// The chatgate session.
    pub thread_id: String,
    pub run_id: String,
    #[serde(default)]
    pub messages: Vec<Message>,
    /// Answers to the interrupts the thread's last run ended with.
    #[serde(default)]
    pub resume: Option<Vec<ResumeEntry>>,
}

/// One message of the thread's history: its role and content.
#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Value,
}

impl RunAgentInput {
    /// The text of the last user message: a string content, or the text
    /// parts of a multimodal one joined.
    pub fn last_user_text(&self) -> Option<String> {
        let message = self.messages.iter().rev().find(|m| m.role == "user")?;
        match &message.content {
            Value::String(text) => Some(text.clone()),
            Value::Array(parts) => {
                let texts: Vec<&str> = parts
                    .iter()
                    .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
                    .filter_map(|part| part.get("text").and_then(Value::as_str))
                    .collect();
                (!texts.is_empty()).then(|| texts.join("\n"))
            }
            _ => None,
        }
    }
}

/// One AG-UI event, written as one `data:` line.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(
    tag = "type",
    rename_all = "SCREAMING_SNAKE_CASE",
    rename_all_fields = "camelCase"
)]
pub enum Event {
    RunStarted {
        thread_id: String,
        run_id: String,
    },
    RunFinished {
        thread_id: String,
        run_id: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: Option<Value>,
        outcome: Outcome,
        #[serde(skip_serializing_if = "Option::is_none")]
        metadata: Option<Map<String, Value>>,
    },
    RunError {
        message: String,
        /// chatgate's `error_type`.
        code: String,
    },
    StepStarted {
        step_name: String,
    },
    StepFinished {
        step_name: String,
    },
    TextMessageStart {
        message_id: String,
        role: &'static str,
    },
    TextMessageContent {
        message_id: String,
        delta: String,
    },
    TextMessageEnd {
        message_id: String,
    },
    ToolCallStart {
        tool_call_id: String,
        tool_call_name: String,
    },
    ToolCallArgs {
        tool_call_id: String,
        delta: String,
    },
    ToolCallEnd {
        tool_call_id: String,
    },
    ToolCallResult {
        message_id: String,
        tool_call_id: String,
        content: String,
        role: &'static str,
    },
}

impl Event {
    /// `RUN_ERROR` with chatgate's `error_type` as its `code`.
    pub fn error(code: &str, message: impl Into<String>) -> Event {
        Event::RunError {
            message: message.into(),
            code: code.to_owned(),
        }
    }

    /// The event as an SSE frame: `data: <json>\n\n` (serde_json escapes
    /// every control character, so the JSON is one line).
    pub fn frame(&self) -> Vec<u8> {
        let mut out = b"data: ".to_vec();
        // An event (string keys, plain values) always serializes.
        serde_json::to_writer(&mut out, self).expect("Event serializes");
        out.extend_from_slice(b"\n\n");
        out
    }
}

/// How a `RUN_FINISHED` run ended.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Outcome {
    /// The run completed.
    Success,
    /// The run paused: what it waits for.
    Interrupt { interrupts: Vec<Interrupt> },
    /// The run was cancelled (a person, a timeout, a supersede...).
    Cancelled,
}

/// What `GET /api/v1/agui/capabilities` answers: AG-UI's
/// `AgentCapabilities`, declaring what this agent supports.
pub fn capabilities(version: &str, tools: Vec<Value>) -> Value {
    serde_json::json!({
        "identity": {
            "name": "chatgate",
            "type": "chatgate",
            "description": "A human-in-the-loop gate: plans and tool calls run only after a person's yes",
            "version": version,
        },
        "transport": {"streaming": true},
        "tools": {"supported": !tools.is_empty(), "items": tools, "clientProvided": false},
        "humanInTheLoop": {
            "supported": true,
            "approvals": true,
            "interventions": false,
            "interrupts": true,
            "approveWithEdits": true,
        },
    })
}
