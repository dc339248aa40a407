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
//! - Conversation state: each session's turns, keyed by the session within
//!   its API key's namespace, bounded in messages, bytes and time
//!   ([`conversations`]).
//! - What the model server sends is bounded before it is held: lines and
//!   error bodies ([`upstream`]), tool calls, their arguments and the text of
//!   one answer (here). Past a bound the run ends with `engine_limit`.
//! - The model server is read on the runtime the engine was built on, not on
//!   the HTTP worker that serves the run's client.
//!
//! What it does not do: run real tools. "Carrying out" a plan is the model's
//! own work, written as text; an engine with side effects would run them at
//! the same place, after `confirm` returned `Approval::Confirm`.

pub mod conversations;
pub mod upstream;

use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use serde::Deserialize;
use serde_json::{json, Map, Value};

use self::conversations::{ConversationLimits, Conversations};
use self::upstream::{CallError, ModelCall, ToolCallPart, Upstream};
use super::{Approval, Completion, Engine, Plan, RunContext, RunError};
use crate::config::Secret;
use crate::protocol::{
    meta, ChunkType, Decisions, ErrorType, RiskLevel, TaskSpec, Verdict, MAX_PLAN_TASKS,
};

/// Model calls one run may make (a plan, its revisions, the report).
const MAX_MODEL_CALLS: usize = 12;
/// Tool calls one answer of the model may make (indexes 0 to 15).
pub const MAX_TOOL_CALLS: usize = 16;
/// Bytes of arguments of all tool calls of one answer.
pub const MAX_TOOL_ARGUMENT_BYTES: usize = 64 * 1024;
/// Bytes of text of one answer.
pub const MAX_ANSWER_TEXT_BYTES: usize = 256 * 1024;
/// The only tool the model has.
const PLAN_TOOL: &str = "propose_plan";

const SYSTEM_PROMPT: &str = "You are an assistant whose actions need a human's approval. \
Answer questions directly. When the user asks you to do something, do not claim to have \
done it: call the propose_plan tool with the numbered tasks you would carry out and an \
honest risk_level (high for anything destructive or irreversible). The tool's result \
tells you whether the user confirmed, asked for changes, or cancelled. Only after a \
confirmation, carry the plan out and report the result of each task.";

/// Where the model is and how to reach it (`--llm-*` and `--conversation-*` flags).
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// Base URL of the API, up to and including `/v1`.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<Secret>,
    /// Longest silence allowed while connecting or streaming.
    pub timeout: Duration,
    /// Longest one model call may take in all.
    pub max_time: Duration,
    pub conversation_ttl: Duration,
    pub conversation_memory: usize,
}

impl OpenAiConfig {
    /// A config with the flags' defaults for everything but where the model is.
    pub fn new(base_url: &str, model: &str) -> OpenAiConfig {
        OpenAiConfig {
            base_url: base_url.to_owned(),
            model: model.to_owned(),
            api_key: None,
            timeout: crate::config::LLM_TIMEOUT,
            max_time: crate::config::LLM_MAX_TIME,
            conversation_ttl: crate::config::CONVERSATION_TTL,
            conversation_memory: crate::config::CONVERSATION_MEMORY,
        }
    }
}

/// The engine; one value serves every run.
pub struct OpenAiEngine {
    http: reqwest::Client,
    config: OpenAiConfig,
    /// Where model calls are read: the runtime the engine was built on.
    runtime: tokio::runtime::Handle,
    conversations: Mutex<Conversations>,
}

impl OpenAiEngine {
    /// Must be called within a tokio runtime: model calls will run on it.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiEngine, String> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|_| "the openai engine must be built within a tokio runtime".to_owned())?;
        let http = reqwest::Client::builder()
            .connect_timeout(config.timeout)
            .read_timeout(config.timeout)
            .build()
            .map_err(|err| err.to_string())?;
        let conversations = Conversations::new(ConversationLimits {
            ttl: config.conversation_ttl,
            total_bytes: config.conversation_memory,
        });
        Ok(OpenAiEngine {
            http,
            config,
            runtime,
            conversations: Mutex::new(conversations),
        })
    }

    /// Conversations kept, and their bytes of JSON.
    pub fn conversation_usage(&self) -> (usize, usize) {
        self.conversations_lock().usage()
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
                metadata.insert(
                    meta::MODEL.to_owned(),
                    Value::from(self.config.model.as_str()),
                );
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
                Ok(Approval::Confirm(decisions)) => {
                    confirmed = true;
                    messages.push(tool_result(&call.id, &confirmed_text(&decisions)));
                    let status = ctx
                        .chunk(ChunkType::Status, format!("Carrying out {total} task(s)"))
                        .with_meta(meta::TOTAL_TASKS, total);
                    ctx.send(status).await?;
                }
                Ok(Approval::Modify(feedback)) => {
                    let asked = if feedback.trim().is_empty() {
                        "The user did not confirm and asked for changes without saying which.\n\
                         Propose a revised plan with propose_plan."
                            .to_owned()
                    } else {
                        format!(
                            "The user did not confirm and asked for this change: {feedback}\n\
                             Propose a revised plan with propose_plan."
                        )
                    };
                    messages.push(tool_result(&call.id, &asked));
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
    /// collects the tool calls, within the bounds of one answer.
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
            request = request.bearer_auth(key.expose());
        }
        let mut call = ModelCall::start(
            &self.runtime,
            request,
            url,
            self.config.timeout,
            self.config.max_time,
        );
        let mut reply = ModelReply::default();
        loop {
            let chunk = match ctx.until_stopped(call.next()).await? {
                Upstream::Chunk(chunk) => chunk,
                Upstream::Done => return Ok(reply),
                Upstream::Failed(err) => return Err(call_failed(&err)),
            };
            for choice in chunk.choices {
                if let Some(text) = choice.delta.content.filter(|t| !t.is_empty()) {
                    if reply.content.len() + text.len() > MAX_ANSWER_TEXT_BYTES {
                        return Err(limit(&format!(
                            "the model's answer is longer than {MAX_ANSWER_TEXT_BYTES} bytes"
                        )));
                    }
                    reply.content.push_str(&text);
                    ctx.emit(ChunkType::Content, text).await?;
                }
                for part in choice.delta.tool_calls {
                    reply.add_tool_call_part(part).map_err(|why| limit(&why))?;
                }
            }
        }
    }
}

impl Engine for OpenAiEngine {
    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>> {
        async move {
            let key = ctx.session_key().clone();
            let mut messages = vec![json!({ "role": "system", "content": SYSTEM_PROMPT })];
            messages.extend(self.conversations_lock().history(&key));
            let turn_starts = messages.len();
            messages.push(json!({ "role": "user", "content": ctx.message() }));
            let result = self.converse(ctx, &mut messages).await;
            // Whatever happened is part of the conversation, a cancel
            // included: this run's turn, in its place among the session's.
            let turn = messages.split_off(turn_starts);
            self.conversations_lock().save(key, ctx.run_id(), turn);
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
    /// and name, later pieces (same `index`) append to the arguments. An
    /// index or arguments past the bounds are refused before anything grows.
    fn add_tool_call_part(&mut self, part: ToolCallPart) -> Result<(), String> {
        let index = part
            .index
            .unwrap_or(self.tool_calls.len().saturating_sub(1));
        if index >= MAX_TOOL_CALLS {
            return Err(format!(
                "the model sent a tool call with index {index}; at most {MAX_TOOL_CALLS} calls"
            ));
        }
        let added = part.function.as_ref().map_or(0, |f| {
            f.arguments.as_ref().map_or(0, String::len) + f.name.as_ref().map_or(0, String::len)
        });
        let held: usize = self
            .tool_calls
            .iter()
            .map(|c| c.arguments.len() + c.name.len())
            .sum();
        if held + added > MAX_TOOL_ARGUMENT_BYTES {
            return Err(format!(
                "the model's tool calls are longer than {MAX_TOOL_ARGUMENT_BYTES} bytes"
            ));
        }
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
        Ok(())
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
    if arguments.tasks.len() > MAX_PLAN_TASKS {
        return Err(format!(
            "A plan may have at most {MAX_PLAN_TASKS} tasks. Call {PLAN_TOOL} again with fewer."
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

/// What the model is told after a confirm: carry the plan out, except the
/// tasks the user rejected, answered or changed.
fn confirmed_text(decisions: &Decisions) -> String {
    let mut text = "The user confirmed the plan. Carry it out now and report the result of each \
                    task."
        .to_owned();
    for decision in &decisions.0 {
        let index = decision.index;
        match &decision.verdict {
            Verdict::Approve => {}
            Verdict::Reject { reason } => text.push_str(&format!(
                "\nTask {index} was rejected by the user{}: do not carry it out.",
                reason
                    .as_deref()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            )),
            Verdict::Edit { args } => text.push_str(&format!(
                "\nTask {index}: the user changed its arguments to {args}; use those."
            )),
            Verdict::Respond { result } => text.push_str(&format!(
                "\nTask {index}: do not carry it out; the user gave its result: {result}"
            )),
        }
    }
    text
}

fn tool_result(call_id: &str, text: &str) -> Value {
    json!({ "role": "tool", "tool_call_id": call_id, "content": text })
}

/// How a failed model call ends the run (the details were logged).
fn call_failed(err: &CallError) -> RunError {
    if err.is_limit() {
        limit(&err.to_string())
    } else {
        failed(&err.to_string())
    }
}

/// Ends the run with `engine_limit`: the model server sent more than chatgate accepts.
fn limit(message: &str) -> RunError {
    log::warn!("model output refused: {message}");
    RunError::Failed {
        error_type: ErrorType::EngineLimit,
        message: message.to_owned(),
    }
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
    use crate::engine::openai::upstream::FunctionPart;

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
        reply
            .add_tool_call_part(part(0, Some("c1"), Some("propose_plan"), "{\"tasks\":"))
            .unwrap();
        reply
            .add_tool_call_part(part(0, None, None, "[{\"description\":\"a\"}]}"))
            .unwrap();

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
    fn tool_call_indexes_and_arguments_are_bounded_before_anything_grows() {
        let mut reply = ModelReply::default();
        let huge_index = reply.add_tool_call_part(part(500_000, Some("c"), Some("x"), "{}"));
        assert!(huge_index.unwrap_err().contains("500000"));
        assert!(reply.tool_calls.is_empty(), "nothing allocated");
        assert!(reply
            .add_tool_call_part(part(usize::MAX, None, None, ""))
            .is_err());
        assert!(reply
            .add_tool_call_part(part(MAX_TOOL_CALLS - 1, None, None, ""))
            .is_ok());

        let piece = "a".repeat(MAX_TOOL_ARGUMENT_BYTES / 4);
        let mut grown = Ok(());
        for _ in 0..5 {
            grown = grown.and(reply.add_tool_call_part(part(0, None, None, &piece)));
        }
        assert!(grown.unwrap_err().contains("longer than"));
        let held: usize = reply.tool_calls.iter().map(|c| c.arguments.len()).sum();
        assert!(held <= MAX_TOOL_ARGUMENT_BYTES);
    }

    #[test]
    fn a_plan_with_too_many_tasks_goes_back_to_the_model() {
        let tasks: Vec<Value> = (0..=MAX_PLAN_TASKS)
            .map(|i| json!({ "description": i.to_string() }))
            .collect();
        let call = ToolCall {
            id: "c".into(),
            name: PLAN_TOOL.into(),
            arguments: json!({ "tasks": tasks }).to_string(),
        };
        assert!(parse_plan(&call).unwrap_err().contains("at most"));
    }
}
