//! `openai`: a real model behind the stream, through any server that speaks
//! the OpenAI chat-completions API with streaming and tool calls (OpenAI,
//! Ollama, llama.cpp's server, vLLM, ...).
//!
//! - The model's answer streams token by token as `content` chunks.
//! - The model can act only through one tool, `propose_plan`. When it calls
//!   it, the plan goes to the user as a `confirmation_request`, and the tool's
//!   result that goes back to the model is the user's answer: *confirmed*
//!   (the model then carries the plan out and reports, streamed as `content`),
//!   or the *modify* text (the model proposes a revised plan: the next
//!   round). On cancel, timeout or any other stop the run ends and the model
//!   is not called again: nothing is carried out without a yes.
//! - Conversation state: each session's messages (user, assistant, plans and
//!   answers), the last [`MAX_HISTORY`] of them, for the
//!   [`MAX_CONVERSATIONS`] most recently used sessions, keyed by the session
//!   within its API key's namespace.
//!
//! What it does not do: run real tools. "Carrying out" a plan is the model's
//! own work, written as text; an engine with side effects would run them at
//! the same place, after `confirm` returned `Approval::Confirm`.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use eventsource_stream::Eventsource;
use futures_util::future::BoxFuture;
use futures_util::{FutureExt, StreamExt};
use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{Approval, Completion, Engine, Plan, RunContext, RunError};
use crate::confirmation::SessionKey;
use crate::protocol::{ChunkType, ErrorType, RiskLevel, TaskSpec};

/// Messages kept per conversation (older ones are dropped, whole turns at a time).
pub const MAX_HISTORY: usize = 40;
/// Conversations kept; beyond it the least recently used is forgotten.
pub const MAX_CONVERSATIONS: usize = 10_000;
/// Model calls one run may make (a plan, its revisions, the report).
const MAX_MODEL_CALLS: usize = 12;
/// The only tool the model has.
const PLAN_TOOL: &str = "propose_plan";

const SYSTEM_PROMPT: &str = "You are an assistant whose actions need a human's approval. \
Answer questions directly. When the user asks you to do something, do not claim to have \
done it: call the propose_plan tool with the numbered tasks you would carry out and an \
honest risk_level (high for anything destructive or irreversible). The tool's result \
tells you whether the user confirmed, asked for changes, or cancelled. Only after a \
confirmation, carry the plan out and report the result of each task.";

/// Where the model is and how to reach it (`--llm-*` flags).
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Base URL of the API, up to and including `/v1`.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    /// Longest silence allowed while connecting or streaming.
    pub timeout: Duration,
}

/// The engine; one value serves every run.
pub struct OpenAiEngine {
    http: reqwest::Client,
    config: OpenAiConfig,
    conversations: Mutex<Conversations>,
}

impl OpenAiEngine {
    pub fn new(config: OpenAiConfig) -> Result<OpenAiEngine, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.timeout)
            .read_timeout(config.timeout)
            .build()?;
        Ok(OpenAiEngine {
            http,
            config,
            conversations: Mutex::default(),
        })
    }

    async fn converse(
        &self,
        ctx: &mut RunContext,
        messages: &mut Vec<Value>,
    ) -> Result<Completion, RunError> {
        let mut confirmed = false;
        for _ in 0..MAX_MODEL_CALLS {
            let reply = self.call_model(ctx, messages).await?;
            messages.push(reply.as_message());
            let Some(call) = reply.tool_calls.first() else {
                let text = if confirmed {
                    "Plan carried out."
                } else {
                    "Answered."
                };
                let mut metadata = Map::new();
                metadata.insert("model".to_owned(), Value::from(self.config.model.as_str()));
                return Ok(Completion {
                    text: text.to_owned(),
                    metadata,
                });
            };
            // Every call needs a result; only the first plan is put to the user.
            for other in &reply.tool_calls[1..] {
                messages.push(tool_result(
                    &other.id,
                    "Ignored: propose one plan at a time.",
                ));
            }
            let plan = match parse_plan(call) {
                Ok(plan) => plan,
                Err(why) => {
                    messages.push(tool_result(&call.id, &why));
                    continue;
                }
            };
            let total = plan.tasks.len();
            match ctx.confirm(plan).await {
                Ok(Approval::Confirm) => {
                    confirmed = true;
                    messages.push(tool_result(
                        &call.id,
                        "The user confirmed the plan. Carry it out now and report the result \
                         of each task.",
                    ));
                    let status = ctx
                        .chunk(ChunkType::Status, format!("Carrying out {total} task(s)"))
                        .with_meta("total_tasks", total);
                    ctx.send(status).await?;
                }
                Ok(Approval::Modify(feedback)) => {
                    messages.push(tool_result(
                        &call.id,
                        &format!(
                            "The user did not confirm and asked for this change: {feedback}\n\
                             Propose a revised plan with propose_plan."
                        ),
                    ));
                    ctx.emit(ChunkType::Status, "Re-planning with your feedback")
                        .await?;
                }
                Err(RunError::Cancelled(reason)) => {
                    messages.push(tool_result(
                        &call.id,
                        &format!(
                            "The plan was not confirmed ({}); nothing was carried out.",
                            reason.as_str()
                        ),
                    ));
                    return Err(RunError::Cancelled(reason));
                }
                Err(failed) => return Err(failed),
            }
        }
        Err(failed(
            "the model did not finish within the calls a run may make",
        ))
    }

    /// One streamed model call: forwards text tokens as `content` chunks and
    /// collects the tool calls.
    async fn call_model(
        &self,
        ctx: &mut RunContext,
        messages: &[Value],
    ) -> Result<ModelReply, RunError> {
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let body = json!({
            "model": self.config.model,
            "messages": messages,
            "stream": true,
            "tools": [plan_tool()],
        });
        let mut request = self.http.post(&url).json(&body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key);
        }
        let response = ctx
            .until_stopped(request.send())
            .await?
            .map_err(|err| unavailable(&url, &err))?;
        let status = response.status();
        if !status.is_success() {
            let detail = ctx
                .until_stopped(response.text())
                .await?
                .unwrap_or_default();
            log::warn!("model server {url} answered {status}: {detail:.500}");
            return Err(failed(&format!("the model server answered {status}")));
        }

        let mut events = response.bytes_stream().eventsource();
        let mut reply = ModelReply::default();
        loop {
            let event = match ctx.until_stopped(events.next()).await? {
                None => break,
                Some(Ok(event)) => event,
                Some(Err(err)) => {
                    log::warn!("model stream from {url} broke: {err}");
                    return Err(failed("the model's stream broke"));
                }
            };
            if event.data.trim() == "[DONE]" {
                break;
            }
            let delta: StreamChunk = match serde_json::from_str(&event.data) {
                Ok(delta) => delta,
                Err(err) => {
                    log::warn!("unreadable model event from {url}: {err}");
                    continue;
                }
            };
            if let Some(error) = delta.error {
                log::warn!("model server {url} reported: {error}");
                return Err(failed("the model server reported an error"));
            }
            for choice in delta.choices {
                if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                    reply.content.push_str(&text);
                    ctx.emit(ChunkType::Content, text).await?;
                }
                for part in choice.delta.tool_calls {
                    reply.add_tool_call_part(part);
                }
            }
        }
        Ok(reply)
    }
}

impl Engine for OpenAiEngine {
    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>> {
        async move {
            let key = ctx.session_key().clone();
            let mut messages = vec![json!({ "role": "system", "content": SYSTEM_PROMPT })];
            messages.extend(self.conversations_lock().history(&key));
            messages.push(json!({ "role": "user", "content": ctx.message() }));
            let result = self.converse(ctx, &mut messages).await;
            // Whatever happened is part of the conversation, a cancel included.
            self.conversations_lock().save(key, messages.split_off(1));
            result
        }
        .boxed()
    }
}

impl OpenAiEngine {
    fn conversations_lock(&self) -> std::sync::MutexGuard<'_, Conversations> {
        // Plain data; a panic elsewhere leaves it consistent.
        self.conversations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Sessions' message histories, bounded in count and length.
#[derive(Default)]
struct Conversations {
    by_session: HashMap<SessionKey, (u64, Vec<Value>)>,
    clock: u64,
}

impl Conversations {
    fn history(&mut self, key: &SessionKey) -> Vec<Value> {
        self.by_session
            .get(key)
            .map(|(_, messages)| messages.clone())
            .unwrap_or_default()
    }

    fn save(&mut self, key: SessionKey, mut messages: Vec<Value>) {
        if messages.len() > MAX_HISTORY {
            messages.drain(..messages.len() - MAX_HISTORY);
        }
        // Start at a user message: a leading tool result without the call it
        // answers would be refused by the model server.
        let first_user = messages
            .iter()
            .position(|m| m["role"] == "user")
            .unwrap_or(messages.len());
        messages.drain(..first_user);
        self.clock += 1;
        self.by_session.insert(key, (self.clock, messages));
        if self.by_session.len() > MAX_CONVERSATIONS {
            let oldest = self
                .by_session
                .iter()
                .min_by_key(|(_, (used, _))| *used)
                .map(|(key, _)| key.clone());
            if let Some(oldest) = oldest {
                self.by_session.remove(&oldest);
            }
        }
    }
}

/// What one model call produced.
#[derive(Debug, Default)]
struct ModelReply {
    content: String,
    tool_calls: Vec<ToolCall>,
}

#[derive(Debug, Default)]
struct ToolCall {
    id: String,
    name: String,
    arguments: String,
}

impl ModelReply {
    /// Tool calls stream in pieces: the first piece of each carries its id
    /// and name, later pieces (same `index`) append to the arguments.
    fn add_tool_call_part(&mut self, part: ToolCallPart) {
        let index = part
            .index
            .unwrap_or(self.tool_calls.len().saturating_sub(1));
        while self.tool_calls.len() <= index {
            let n = self.tool_calls.len();
            self.tool_calls.push(ToolCall {
                id: format!("call_{n}"),
                ..ToolCall::default()
            });
        }
        let call = &mut self.tool_calls[index];
        if let Some(id) = part.id {
            call.id = id;
        }
        if let Some(function) = part.function {
            if let Some(name) = function.name {
                call.name.push_str(&name);
            }
            if let Some(arguments) = function.arguments {
                call.arguments.push_str(&arguments);
            }
        }
    }

    fn as_message(&self) -> Value {
        let mut message = json!({ "role": "assistant", "content": self.content });
        if !self.tool_calls.is_empty() {
            message["tool_calls"] = self
                .tool_calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": { "name": call.name, "arguments": call.arguments },
                    })
                })
                .collect();
        }
        message
    }
}

/// One `data:` event of a streamed chat completion.
#[derive(Deserialize)]
struct StreamChunk {
    #[serde(default)]
    choices: Vec<StreamChoice>,
    error: Option<Value>,
}

#[derive(Deserialize)]
struct StreamChoice {
    #[serde(default)]
    delta: Delta,
}

#[derive(Deserialize, Default)]
struct Delta {
    content: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallPart>,
}

#[derive(Deserialize)]
struct ToolCallPart {
    index: Option<usize>,
    id: Option<String>,
    function: Option<FunctionPart>,
}

#[derive(Deserialize)]
struct FunctionPart {
    name: Option<String>,
    arguments: Option<String>,
}

/// The arguments of `propose_plan`.
#[derive(Deserialize)]
struct PlanArguments {
    summary: Option<String>,
    risk_level: Option<RiskLevel>,
    tasks: Vec<PlanTask>,
}

#[derive(Deserialize)]
struct PlanTask {
    description: String,
    tool: Option<String>,
    args: Option<Value>,
}

/// The plan of a `propose_plan` call, or what to tell the model instead.
fn parse_plan(call: &ToolCall) -> Result<Plan, String> {
    if call.name != PLAN_TOOL {
        return Err(format!(
            "Unknown tool `{}`: the only tool is {PLAN_TOOL}.",
            call.name
        ));
    }
    let arguments: PlanArguments = serde_json::from_str(&call.arguments)
        .map_err(|err| format!("The arguments were not valid: {err}. Call {PLAN_TOOL} again."))?;
    if arguments.tasks.is_empty() {
        return Err(format!(
            "A plan needs at least one task. Call {PLAN_TOOL} again."
        ));
    }
    let tasks: Vec<TaskSpec> = arguments
        .tasks
        .into_iter()
        .enumerate()
        .map(|(i, task)| TaskSpec {
            index: i + 1,
            tool: task.tool.unwrap_or_else(|| "model".to_owned()),
            description: task.description,
            args: task.args,
        })
        .collect();
    Ok(Plan {
        summary: arguments
            .summary
            .unwrap_or_else(|| format!("Confirm the plan of {} task(s)?", tasks.len())),
        tasks,
        // A model that does not say is not assumed to be harmless.
        risk_level: arguments.risk_level.unwrap_or(RiskLevel::Medium),
    })
}

fn plan_tool() -> Value {
    json!({
        "type": "function",
        "function": {
            "name": PLAN_TOOL,
            "description": "Propose the tasks you would carry out. Nothing is carried out \
                            until the user confirms; the result says what the user decided.",
            "parameters": {
                "type": "object",
                "properties": {
                    "summary": { "type": "string", "description": "one line for the user" },
                    "risk_level": { "type": "string", "enum": ["low", "medium", "high"] },
                    "tasks": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "description": { "type": "string" },
                                "tool": { "type": "string" },
                                "args": { "type": "object" }
                            },
                            "required": ["description"]
                        }
                    }
                },
                "required": ["tasks"]
            }
        }
    })
}

fn tool_result(call_id: &str, text: &str) -> Value {
    json!({ "role": "tool", "tool_call_id": call_id, "content": text })
}

fn unavailable(url: &str, err: &reqwest::Error) -> RunError {
    log::warn!("cannot reach the model server {url}: {err}");
    failed("cannot reach the model server")
}

/// Ends the run with `engine_unavailable`; `message` is for the user, the
/// details were logged.
fn failed(message: &str) -> RunError {
    RunError::Failed {
        error_type: ErrorType::EngineUnavailable,
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(index: usize, id: Option<&str>, name: Option<&str>, args: &str) -> ToolCallPart {
        ToolCallPart {
            index: Some(index),
            id: id.map(str::to_owned),
            function: Some(FunctionPart {
                name: name.map(str::to_owned),
                arguments: Some(args.to_owned()),
            }),
        }
    }

    #[test]
    fn tool_call_pieces_are_joined_by_index() {
        let mut reply = ModelReply::default();
        reply.add_tool_call_part(part(0, Some("c1"), Some("propose_plan"), "{\"tasks\":"));
        reply.add_tool_call_part(part(0, None, None, "[{\"description\":\"a\"}]}"));

        assert_eq!(reply.tool_calls.len(), 1);
        let plan = parse_plan(&reply.tool_calls[0]).unwrap();
        assert_eq!(plan.tasks[0].description, "a");
        assert_eq!(plan.tasks[0].index, 1);
        assert_eq!(
            plan.risk_level,
            RiskLevel::Medium,
            "unstated risk is not low"
        );
    }

    #[test]
    fn a_bad_plan_is_explained_to_the_model() {
        let call = |name: &str, arguments: &str| ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments: arguments.into(),
        };
        assert!(parse_plan(&call("rm_rf", "{}"))
            .unwrap_err()
            .contains("Unknown tool"));
        assert!(parse_plan(&call(PLAN_TOOL, "{not json"))
            .unwrap_err()
            .contains("not valid"));
        assert!(parse_plan(&call(PLAN_TOOL, "{\"tasks\":[]}"))
            .unwrap_err()
            .contains("at least one task"));
    }

    #[test]
    fn a_conversation_keeps_its_last_turns_starting_at_a_user_message() {
        let mut conversations = Conversations::default();
        let key = SessionKey::new(None, "s");
        let mut messages = Vec::new();
        for i in 0..30 {
            messages.push(json!({ "role": "user", "content": i }));
            messages.push(json!({ "role": "tool", "content": i }));
        }

        conversations.save(key.clone(), messages);

        let kept = conversations.history(&key);
        assert!(kept.len() <= MAX_HISTORY);
        assert_eq!(kept[0]["role"], "user");
        assert_eq!(kept.last().unwrap()["content"], 29);
    }

    #[test]
    fn the_least_recently_used_conversation_is_forgotten_first() {
        let mut conversations = Conversations::default();
        for i in 0..=MAX_CONVERSATIONS {
            let message = json!({ "role": "user", "content": i });
            conversations.save(SessionKey::new(None, &i.to_string()), vec![message]);
        }

        assert_eq!(conversations.by_session.len(), MAX_CONVERSATIONS);
        assert!(conversations
            .history(&SessionKey::new(None, "0"))
            .is_empty());
        assert_eq!(conversations.history(&SessionKey::new(None, "1")).len(), 1);
    }
}
