//! A task as a pause shows it: one step of a plan (its tool, args, risk,
//! the decisions it takes, where it stands), its preview, and what allowed
//! it without a person.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::names::{DecisionKind, RiskLevel, TaskState};

/// One step of a plan shown to the user for confirmation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct TaskSpec {
    /// 1-based position in the plan.
    pub index: usize,
    pub description: String,
    pub tool: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub args: Option<Value>,
    /// This task's own risk (its tool's, or what its words make it); the
    /// plan's `risk_level` is the highest of its tasks'. Absent only in
    /// records an older version stored: the plan's risk then stands for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub risk_level: Option<RiskLevel>,
    /// It calls no declared tool: nothing real runs for it (the planner
    /// pretends to work; a model's plan step is only described).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub simulated: bool,
    /// The per-task decisions it takes (set when it is asked).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub decisions: Vec<DecisionKind>,
    /// Allowed without a person (a rule of the tools file, or a grant):
    /// listed in a pause that asks for other tasks, it runs unless the
    /// person rejects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approved_by: Option<ApprovedBy>,
    /// Its id as a decision of its own (#42): unique across the server,
    /// stable for the round (`<confirmation_id>-t<index>`); a reply may
    /// name the task by it instead of `index`. Set when it is asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    /// Where it stands (set when it is asked: `pending`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<TaskState>,
    /// Its own deadline (RFC 3339, UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// How many distinct people must approve it, when more than one, and
    /// (then) the labels that have so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub required: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approvals: Option<Vec<String>>,
    /// A JSON Schema (draft 2020-12) of one decision object for it: a
    /// `oneOf` of the decisions it takes (approve; reject with an optional
    /// `reason`; edit with `args` fitting its tool's own input schema;
    /// respond with `result`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_schema: Option<Schema>,
    /// What the call would do (its tool's preview, run before the pause):
    /// shown wherever the pause is, its `digest` what an approval names.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preview: Option<TaskPreview>,
}

/// A JSON Schema kept as its JSON text: the server only builds it, sends
/// it and stores it, never looks into it, so it is not held as a tree of
/// values (reading a stored pause parsed each task's schema into one, and
/// dropped it, a fifth of a mass expiry's time, #46). Written as the same
/// bytes the tree would be (compact, keys in order).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Schema(Box<serde_json::value::RawValue>);

impl Schema {
    /// `schema`, as the text it is written as.
    pub fn of(schema: &Value) -> Schema {
        Schema(serde_json::value::to_raw_value(schema).expect("a JSON value serializes"))
    }

    /// The schema as a tree of values.
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.0.get()).unwrap_or(Value::Null)
    }
}

impl PartialEq for Schema {
    /// The same JSON text: every schema is written compactly, keys in order.
    fn eq(&self, other: &Schema) -> bool {
        self.0.get() == other.0.get()
    }
}

/// A task's preview (#43): its output (a failed preview's error),
/// `truncated` when cut, and `digest`, the lower-case hex SHA-256 of the
/// canonical JSON of `{"tool", "args", "body"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskPreview {
    pub ok: bool,
    pub body: String,
    pub truncated: bool,
    pub digest: String,
}

/// Why a call may run without a person's yes: `{"rule": "<name>"}` or
/// `{"grant": "<id>"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApprovedBy {
    Rule(String),
    Grant(String),
}
