//! The A2A face (A2A 1.0, JSON-RPC binding, pinned), as data: no I/O. A
//! task is a run: its `contextId` the chatgate session, its `id` a UUID
//! the server gives the run. What a run's chunk does to its task is
//! [`Update::of`]; the JSON shapes (ProtoJSON: camelCase fields,
//! `TASK_STATE_*` and `ROLE_*` enums) are built here.

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::names::meta;
use super::{Chunk, ChunkType, PauseData};

/// The JSON-RPC endpoint.
pub const A2A_PATH: &str = "/a2a";
/// The agent card.
pub const AGENT_CARD_PATH: &str = "/.well-known/agent-card.json";
/// The protocol version this face speaks (`A2A-Version`).
pub const A2A_VERSION: &str = "1.0";
/// Largest JSON-RPC request body, in bytes.
pub const MAX_A2A_BODY_BYTES: usize = 256 * 1024;
/// Most push configs one task may have.
pub const MAX_PUSH_CONFIGS: usize = 4;
/// Most tasks one `ListTasks` page holds (and its default).
pub const MAX_PAGE_SIZE: usize = 100;
pub const DEFAULT_PAGE_SIZE: usize = 50;

/// A task's state, as ProtoJSON writes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum TaskState {
    #[serde(rename = "TASK_STATE_SUBMITTED")]
    Submitted,
    #[serde(rename = "TASK_STATE_WORKING")]
    Working,
    #[serde(rename = "TASK_STATE_INPUT_REQUIRED")]
    InputRequired,
    #[serde(rename = "TASK_STATE_AUTH_REQUIRED")]
    AuthRequired,
    #[serde(rename = "TASK_STATE_COMPLETED")]
    Completed,
    #[serde(rename = "TASK_STATE_CANCELED")]
    Canceled,
    #[serde(rename = "TASK_STATE_FAILED")]
    Failed,
    #[serde(rename = "TASK_STATE_REJECTED")]
    Rejected,
}

impl TaskState {
    pub fn as_str(self) -> &'static str {
        match self {
            TaskState::Submitted => "TASK_STATE_SUBMITTED",
            TaskState::Working => "TASK_STATE_WORKING",
            TaskState::InputRequired => "TASK_STATE_INPUT_REQUIRED",
            TaskState::AuthRequired => "TASK_STATE_AUTH_REQUIRED",
            TaskState::Completed => "TASK_STATE_COMPLETED",
            TaskState::Canceled => "TASK_STATE_CANCELED",
            TaskState::Failed => "TASK_STATE_FAILED",
            TaskState::Rejected => "TASK_STATE_REJECTED",
        }
    }

    /// Completed, canceled, failed or rejected: nothing more happens.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            TaskState::Completed | TaskState::Canceled | TaskState::Failed | TaskState::Rejected
        )
    }

    /// Waiting on a person.
    pub fn is_interrupted(self) -> bool {
        matches!(self, TaskState::InputRequired | TaskState::AuthRequired)
    }
}

/// JSON-RPC error codes (A2A's, and JSON-RPC's own).
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    pub const TASK_NOT_FOUND: i64 = -32001;
    pub const TASK_NOT_CANCELABLE: i64 = -32002;
    pub const UNSUPPORTED_OPERATION: i64 = -32004;
    pub const VERSION_NOT_SUPPORTED: i64 = -32009;
}

/// A JSON-RPC 2.0 request.
#[derive(Debug, Clone, Deserialize)]
pub struct RpcRequest {
    pub jsonrpc: String,
    #[serde(default)]
    pub id: Value,
    pub method: String,
    #[serde(default)]
    pub params: Value,
}

/// `SendMessageRequest`.
#[derive(Debug, Clone, Deserialize)]
pub struct SendMessage {
    pub message: Message,
    #[serde(default)]
    pub configuration: Option<SendConfiguration>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendConfiguration {
    #[serde(default)]
    pub return_immediately: bool,
    #[serde(default)]
    pub task_push_notification_config: Option<PushConfig>,
}

/// A message as a client sends it.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    #[serde(default)]
    pub message_id: String,
    #[serde(default)]
    pub context_id: Option<String>,
    #[serde(default)]
    pub task_id: Option<String>,
    #[serde(default)]
    pub parts: Vec<Part>,
}

/// A part: text, or data (structured JSON).
#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub data: Option<Value>,
}

impl Message {
    /// Its text parts, joined by newlines (none: `None`).
    pub fn text(&self) -> Option<String> {
        let texts: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|p| p.text.as_deref())
            .collect();
        (!texts.is_empty()).then(|| texts.join("\n"))
    }

    /// Its first data part that is an object.
    pub fn data(&self) -> Option<&Map<String, Value>> {
        self.parts
            .iter()
            .find_map(|p| p.data.as_ref().and_then(Value::as_object))
    }
}

/// What a task's id says: the run (its id, the one a store keeps its
/// pauses under) and the session it runs on (its key's namespace and its
/// session id), so that any replica finds the one holding the run, and
/// the holder finds the run again after a restart. Written
/// `<run>.<namespace or ->.<session id, base64url>`; a client treats it
/// as opaque.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskAddress {
    pub run: String,
    pub namespace: Option<String>,
    pub session_id: String,
}

impl TaskAddress {
    /// The task id.
    pub fn id(&self) -> String {
        use base64::Engine;
        let session = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&self.session_id);
        let namespace = self.namespace.as_deref().unwrap_or("-");
        format!("{}.{namespace}.{session}", self.run)
    }

    /// The address a task id names, when it is one this server writes.
    pub fn parse(id: &str) -> Option<TaskAddress> {
        use base64::Engine;
        let mut parts = id.splitn(3, '.');
        let (run, namespace, session) = (parts.next()?, parts.next()?, parts.next()?);
        let run_ok = !run.is_empty()
            && run.len() <= 64
            && run.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
        let namespace_ok = !namespace.is_empty()
            && namespace.len() <= 64
            && namespace
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !run_ok || !namespace_ok {
            return None;
        }
        let session = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(session)
            .ok()?;
        let session_id = String::from_utf8(session).ok()?;
        if !super::is_valid_session_id(&session_id) {
            return None;
        }
        Some(TaskAddress {
            run: run.to_owned(),
            namespace: (namespace != "-").then(|| namespace.to_owned()),
            session_id,
        })
    }
}

/// `GetTaskRequest`, `CancelTaskRequest`, `SubscribeToTaskRequest`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskRef {
    pub id: String,
    #[serde(default)]
    pub history_length: Option<i64>,
}

/// `ListTasksRequest`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListTasks {
    #[serde(default)]
    pub context_id: Option<String>,
    #[serde(default)]
    pub status: Option<TaskState>,
    #[serde(default)]
    pub page_size: Option<i64>,
    #[serde(default)]
    pub page_token: Option<String>,
    #[serde(default)]
    pub include_artifacts: Option<bool>,
}

/// `TaskPushNotificationConfig`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PushConfig {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task_id: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication: Option<Authentication>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
pub struct Authentication {
    pub scheme: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<String>,
}

/// `Get`/`DeleteTaskPushNotificationConfigRequest`, and `List...` (no `id`).
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PushRef {
    pub task_id: String,
    #[serde(default)]
    pub id: String,
}

/// What one chunk of a run does to its task.
#[derive(Debug, Clone, PartialEq)]
pub enum Update {
    /// Its state (and the status message) changes.
    Status {
        state: TaskState,
        text: String,
        /// The pause's card (a data part), for a pause.
        card: Option<Value>,
        metadata: Map<String, Value>,
    },
    /// An output: `id`, its name, its text and metadata.
    Artifact {
        id: String,
        name: String,
        text: String,
        metadata: Map<String, Value>,
        /// Appended to the artifact of the same id (streamed content).
        append: bool,
    },
    Nothing,
}

impl Update {
    /// What `chunk` does to the task `task_id`.
    pub fn of(chunk: &Chunk, task_id: &str) -> Update {
        let text = chunk.chunk.clone();
        let metadata = chunk.metadata.clone();
        let status = |state| Update::Status {
            state,
            text: text.clone(),
            card: None,
            metadata: metadata.clone(),
        };
        match chunk.chunk_type {
            ChunkType::Content => Update::Artifact {
                id: format!("{task_id}-answer"),
                name: "answer".to_owned(),
                text,
                metadata: Map::new(),
                append: true,
            },
            ChunkType::ToolOutput => {
                let step = chunk.metadata.get(meta::STEP).and_then(Value::as_u64);
                let content = ["result", "error"]
                    .iter()
                    .find_map(|key| chunk.metadata.get(*key).and_then(Value::as_str))
                    .map_or(text, str::to_owned);
                Update::Artifact {
                    id: format!("{task_id}-s{}", step.unwrap_or(chunk.sequence)),
                    name: chunk
                        .metadata
                        .get(meta::TOOL)
                        .and_then(Value::as_str)
                        .unwrap_or("output")
                        .to_owned(),
                    text: content,
                    metadata,
                    append: false,
                }
            }
            ChunkType::ConfirmationRequest | ChunkType::InputRequest => {
                match &chunk.confirmation_data {
                    Some(pause) => Update::Status {
                        state: interrupted_state(pause),
                        text,
                        card: serde_json::to_value(pause).ok(),
                        metadata,
                    },
                    None => Update::Nothing,
                }
            }
            ChunkType::ConfirmationReceived => status(TaskState::Working),
            ChunkType::Completion => {
                let ran = chunk
                    .metadata
                    .get("tasks_completed")
                    .and_then(Value::as_u64);
                let rejected = chunk.metadata.get("tasks_rejected").and_then(Value::as_u64);
                match (ran, rejected) {
                    (Some(0), Some(r)) if r > 0 => status(TaskState::Rejected),
                    _ => status(TaskState::Completed),
                }
            }
            ChunkType::Cancelled => status(TaskState::Canceled),
            ChunkType::Error => status(TaskState::Failed),
            ChunkType::Status
            | ChunkType::TaskInit
            | ChunkType::ApprovalRecorded
            | ChunkType::DecisionRecorded => Update::Nothing,
        }
    }
}

/// `INPUT_REQUIRED` when whoever holds the task may answer the pause,
/// `AUTH_REQUIRED` when others must (a group decides it, or it needs the
/// approvals of several people: the requester's own key is at most one).
fn interrupted_state(pause: &PauseData) -> TaskState {
    match pause.needs_others() {
        true => TaskState::AuthRequired,
        false => TaskState::InputRequired,
    }
}

/// A message of the agent's (a status message).
pub fn agent_message(task_id: &str, context_id: &str, text: &str, card: Option<&Value>) -> Value {
    let mut parts = vec![json!({"text": text})];
    if let Some(card) = card {
        parts.push(json!({"data": card, "mediaType": "application/json"}));
    }
    json!({
        "messageId": uuid::Uuid::new_v4().to_string(),
        "contextId": context_id,
        "taskId": task_id,
        "role": "ROLE_AGENT",
        "parts": parts,
    })
}

/// A JSON-RPC success.
pub fn result(id: &Value, result: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "result": result})
}

/// A JSON-RPC error; `error_type` (chatgate's) rides in `data` as an
/// `ErrorInfo` (what A2A clients read an error's details from).
pub fn error(id: &Value, code: i64, message: &str, error_type: Option<&str>) -> Value {
    let mut error = json!({"code": code, "message": message});
    if let Some(error_type) = error_type {
        error["data"] = json!([{
            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
            "reason": error_type.to_ascii_uppercase(),
            "domain": "chatgate",
            "metadata": {"error_type": error_type},
        }]);
    }
    json!({"jsonrpc": "2.0", "id": id, "error": error})
}

/// The agent card, for the JSON-RPC endpoint at `url`: one skill per
/// declared tool, plus chat.
pub fn agent_card(url: &str, version: &str, tools: &[(String, String)]) -> Value {
    let mut skills = vec![json!({
        "id": "chat",
        "name": "chat",
        "description": "A task in words: a plan (or a model's tool calls) that runs only after a person's yes",
        "tags": ["chat", "human-in-the-loop"],
    })];
    skills.extend(tools.iter().map(|(name, description)| {
        json!({"id": name, "name": name, "description": description, "tags": ["tool"]})
    }));
    json!({
        "name": "chatgate",
        "description": "A human-in-the-loop gate for agents: nothing runs without a person's yes",
        "supportedInterfaces": [{"url": url, "protocolBinding": "JSONRPC", "protocolVersion": A2A_VERSION}],
        // The same endpoint as clients of A2A before 1.0 read it (1.0's
        // own clients read `supportedInterfaces` first).
        "url": url,
        "preferredTransport": "JSONRPC",
        "version": version,
        "capabilities": {"streaming": true, "pushNotifications": true},
        "securitySchemes": {
            "bearer": {"httpAuthSecurityScheme": {"scheme": "bearer",
                "description": "a chatgate API key: Authorization: Bearer <key>"}},
        },
        "securityRequirements": [{"schemes": {"bearer": {"list": []}}}],
        "defaultInputModes": ["text/plain", "application/json"],
        "defaultOutputModes": ["text/plain", "application/json"],
        "skills": skills,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_address_round_trips_and_nothing_else_parses() {
        for (namespace, session) in [
            (None, "s-1"),
            (Some("k0123456789abcdef0123456789abcdef"), "a.b/c é"),
        ] {
            let address = TaskAddress {
                run: uuid::Uuid::new_v4().to_string(),
                namespace: namespace.map(str::to_owned),
                session_id: session.to_owned(),
            };
            assert_eq!(TaskAddress::parse(&address.id()), Some(address));
        }
        for id in [
            "",
            "x",
            "r.-",
            "r..czE",
            ".-.czE",
            "r/x.-.czE",
            "r.-.!!",
            "r.-.",
            "r.k.AA",
        ] {
            assert_eq!(TaskAddress::parse(id), None, "{id:?}");
        }
    }
}
