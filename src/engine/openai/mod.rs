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
//! - With a durable store a pause keeps the conversation and the calls it
//!   awaits ([`PausedTurn`]); [`Engine::resume`] goes on from there in
//!   another process.
//!
//! What it does not do: run real tools. "Carrying out" a plan is the model's
//! own work, written as text; an engine with side effects would run them at
//! the same place, after `confirm` returned `Approval::Confirm`.

pub mod conversations;
pub mod reply;
pub mod upstream;

use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use secrecy::ExposeSecret;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use self::conversations::{ConversationLimits, Conversations};
use self::reply::{ModelReply, ToolCall};
use self::upstream::{CallError, ModelCall, Upstream};
use super::llm::OpenAiConfig;
use crate::protocol::{
    meta, ChunkType, Decisions, ErrorType, RiskLevel, TaskSpec, Verdict, MAX_PLAN_TASKS,
};
use crate::run::context::RunContext;
use crate::run::engine::Engine;
use crate::run::outcome::{Completion, RunError};
use crate::run::plan::{Approval, Plan};
use crate::tools::{Tool, ToolOutcome, Tools};

/// Model calls one run may make (a plan, its revisions, the report).
const MAX_MODEL_CALLS: usize = 12;
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

    /// The model loop: call, show its text, act on its tool calls, give it
    /// the results, until it answers without tools (or the calls a run may
    /// make are used up: `tool_call_limit`). `go_on` says where a run
    /// restored from a store stands (a fresh run starts with no calls made).
    async fn converse(
        &self,
        ctx: &mut RunContext,
        messages: &mut Vec<Value>,
        mut go_on: Resumable,
    ) -> Result<Completion, RunError> {
        let tools = ctx.tools().clone();
        // With declared tools the model calls them directly, and each batch
        // of calls is the confirmation: what is confirmed is exactly what
        // runs. Without, it can only propose a plan it carries out in prose.
        let offered: Vec<Value> = if tools.is_empty() {
            vec![plan_tool()]
        } else {
            tools.iter().map(|tool| tool_spec(tool)).collect()
        };
        while go_on.calls_left > 0 {
            go_on.calls_left -= 1;
            let reply = self.call_model(ctx, messages, &offered).await?;
            messages.push(reply.as_message());
            if reply.tool_calls.is_empty() {
                return Ok(self.completion(
                    go_on.acted,
                    tools.is_empty(),
                    reply.finish_reason.as_deref(),
                ));
            }
            if reply.finish_reason.as_deref() == Some("length") {
                // The calls' arguments were cut: nothing to act on, and not
                // the model's mistake to be told about.
                return Err(failed(
                    "the model's answer was cut at its length limit in a tool call",
                ));
            }
            go_on.acted |= if tools.is_empty() {
                plan_turn(ctx, messages, &reply, go_on).await?
            } else {
                tool_turn(ctx, messages, &reply, &tools, go_on).await?
            };
        }
        Err(RunError::Failed {
            error_type: ErrorType::ToolCallLimit,
            message: format!(
                "the model did not finish within the {MAX_MODEL_CALLS} model calls a run may make"
            ),
        })
    }

    /// A restored run: the decision it paused for is applied where the
    /// pause left off, then the model loop goes on.
    async fn go_on(
        &self,
        ctx: &mut RunContext,
        messages: &mut Vec<Value>,
        pending: Pending,
        approval: Approval,
        mut go_on: Resumable,
    ) -> Result<Completion, RunError> {
        go_on.acted |= match pending {
            Pending::Plan { call_id, total } => {
                plan_answered(ctx, messages, &call_id, total, Ok(approval)).await?
            }
            Pending::Tools {
                call_ids,
                results,
                batch,
                ran,
            } => {
                let tools = ctx.tools().clone();
                let mut calls = Vec::with_capacity(batch.len());
                for call in batch {
                    let tool = tools
                        .get(&call.tool)
                        .cloned()
                        .ok_or_else(|| RunError::Failed {
                            error_type: ErrorType::Interrupted,
                            message: format!(
                                "the tool `{}` this run paused to call is no longer declared",
                                call.tool
                            ),
                        })?;
                    calls.push((call.position, tool, call.args));
                }
                let answer = Ok(approval);
                tools_answered(ctx, messages, &call_ids, results, &calls, answer, ran).await?
            }
        };
        self.converse(ctx, messages, go_on).await
    }

    /// The `completion` of an answer without tool calls. An answer cut by
    /// the model's length limit or its content filter says so, in the text
    /// and in `metadata.finish_reason`.
    fn completion(&self, acted: bool, plan_mode: bool, finish_reason: Option<&str>) -> Completion {
        let mut text = match (acted, plan_mode) {
            (false, _) => "Answered.".to_owned(),
            (true, true) => "Plan carried out.".to_owned(),
            (true, false) => "Done.".to_owned(),
        };
        let mut metadata = Map::new();
        metadata.insert(
            meta::MODEL.to_owned(),
            Value::from(self.config.model.as_str()),
        );
        if let Some(reason @ ("length" | "content_filter")) = finish_reason {
            text.push_str(match reason {
                "length" => " The answer was cut off at the model's length limit.",
                _ => " The answer was cut off by the model's content filter.",
            });
            metadata.insert(meta::FINISH_REASON.to_owned(), Value::from(reason));
        }
        Completion { text, metadata }
    }

    /// One streamed model call: forwards text tokens as `content` chunks and
    /// collects the tool calls, within the bounds of one answer.
    async fn call_model(
        &self,
        ctx: &mut RunContext,
        messages: &[Value],
        offered: &[Value],
    ) -> Result<ModelReply, RunError> {
        let url = format!(
            "{}/chat/completions",
            self.config.base_url.trim_end_matches('/')
        );
        let body = json!({
            "model": self.config.model,
            "messages": messages,
            "stream": true,
            "tools": offered,
        });
        let mut request = self.http.post(&url).json(&body);
        if let Some(key) = &self.config.api_key {
            request = request.bearer_auth(key.expose_secret());
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
                if let Some(reason) = choice.finish_reason {
                    reply.finish_reason = Some(reason);
                }
                if let Some(function) = choice.delta.function_call {
                    reply
                        .add_function_call_part(function)
                        .map_err(|why| limit(&why))?;
                }
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
    fn name(&self) -> &'static str {
        "openai"
    }

    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>> {
        async move {
            let key = ctx.session_key().clone();
            let mut messages = vec![json!({ "role": "system", "content": SYSTEM_PROMPT })];
            messages.extend(self.conversations_lock().history(&key));
            let turn_starts = messages.len();
            messages.push(json!({ "role": "user", "content": ctx.message() }));
            let fresh = Resumable {
                turn_starts,
                calls_left: MAX_MODEL_CALLS,
                acted: false,
            };
            let result = self.converse(ctx, &mut messages, fresh).await;
            // Whatever happened is part of the conversation, a cancel
            // included: this run's turn, in its place among the session's.
            let turn = messages.split_off(turn_starts);
            self.conversations_lock().save(key, ctx.run_id(), turn);
            result
        }
        .boxed()
    }

    fn resume<'a>(
        &'a self,
        ctx: &'a mut RunContext,
        state: Value,
        approval: Approval,
    ) -> Option<BoxFuture<'a, Result<Completion, RunError>>> {
        let paused: PausedTurn = serde_json::from_value(state)
            .map_err(|err| log::warn!("cannot read a stored openai run: {err}"))
            .ok()?;
        Some(
            async move {
                let key = ctx.session_key().clone();
                let PausedTurn {
                    mut messages,
                    go_on,
                    pending,
                } = paused;
                let result = self
                    .go_on(ctx, &mut messages, pending, approval, go_on)
                    .await;
                // The history before this turn was the process's that
                // paused; this one keeps the turn, as a fresh run would.
                let turn = messages.split_off(go_on.turn_starts.min(messages.len()));
                self.conversations_lock().save(key, ctx.run_id(), turn);
                result
            }
            .boxed(),
        )
    }
}

/// Where a run's model loop stands: what a stored pause must keep to go on.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Resumable {
    /// Where this run's turn starts in the messages.
    turn_starts: usize,
    /// Model calls the run may still make.
    calls_left: usize,
    /// Whether anything was carried out yet (for the completion's text).
    acted: bool,
}

/// A paused run of this engine as stored (`--store`): the conversation up
/// to and including the model's answer whose calls await the decision, and
/// what those calls are.
#[derive(Debug, Serialize, Deserialize)]
struct PausedTurn {
    messages: Vec<Value>,
    go_on: Resumable,
    pending: Pending,
}

/// The calls a pause awaits the decision on.
#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
enum Pending {
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
}

#[derive(Debug, Serialize, Deserialize)]
struct PendingCall {
    /// The call's position among the answer's calls.
    position: usize,
    tool: String,
    args: Value,
}

/// The state a pause stores, when pauses are stored at all.
fn paused_state(
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

impl OpenAiEngine {
    fn conversations_lock(&self) -> std::sync::MutexGuard<'_, Conversations> {
        // Plain data; a panic elsewhere leaves it consistent.
        self.conversations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// One answer's `propose_plan` call(s): the first plan is put to the user;
/// the others are told to wait. Returns whether the plan was confirmed.
async fn plan_turn(
    ctx: &mut RunContext,
    messages: &mut Vec<Value>,
    reply: &ModelReply,
    go_on: Resumable,
) -> Result<bool, RunError> {
    let call = &reply.tool_calls[0];
    // Every call needs a result; only the first plan is put to the user.
    for other in &reply.tool_calls[1..] {
        messages.push(tool_result(
            &other.id,
            "Ignored: propose one plan at a time.",
        ));
    }
    let mut plan = match parse_plan(call) {
        Ok(plan) => plan,
        Err(why) => {
            messages.push(tool_result(&call.id, &why));
            return Ok(false);
        }
    };
    let total = plan.tasks.len();
    let pending = Pending::Plan {
        call_id: call.id.clone(),
        total,
    };
    plan.state = paused_state(ctx, messages, go_on, pending);
    let answer = ctx.confirm(plan).await;
    plan_answered(ctx, messages, &call.id, total, answer).await
}

/// Tells the model what the user answered to its plan (`call_id`).
async fn plan_answered(
    ctx: &mut RunContext,
    messages: &mut Vec<Value>,
    call_id: &str,
    total: usize,
    answer: Result<Approval, RunError>,
) -> Result<bool, RunError> {
    match answer {
        Ok(Approval::Confirm(decisions)) => {
            messages.push(tool_result(call_id, &confirmed_text(&decisions)));
            let status = ctx
                .chunk(ChunkType::Status, format!("Carrying out {total} task(s)"))
                .with_meta(meta::TOTAL_TASKS, total);
            ctx.send(status).await?;
            Ok(true)
        }
        Ok(Approval::Modify(feedback)) => {
            messages.push(tool_result(
                call_id,
                &format!(
                    "{} Propose a revised plan with propose_plan.",
                    modify_text(&feedback)
                ),
            ));
            ctx.emit(ChunkType::Status, "Re-planning with your feedback")
                .await?;
            Ok(false)
        }
        Err(RunError::Cancelled(reason)) => {
            messages.push(tool_result(
                call_id,
                &format!(
                    "The plan was not confirmed ({}); nothing was carried out.",
                    reason.as_str()
                ),
            ));
            Err(RunError::Cancelled(reason))
        }
        Err(failed) => Err(failed),
    }
}

/// One answer's calls of declared tools. Calls to unknown tools, and calls
/// whose arguments are not a JSON object fitting the tool's schema, go back
/// to the model as errors and never reach the user. Calls to `confirm =
/// false` tools run at once. The rest are one confirmation, one task per
/// call; after a confirm each runs as decided (approved, edited, rejected or
/// answered by the user). Every call gets its result as a `tool` message.
/// Returns whether any call ran.
async fn tool_turn(
    ctx: &mut RunContext,
    messages: &mut Vec<Value>,
    reply: &ModelReply,
    tools: &Tools,
    go_on: Resumable,
) -> Result<bool, RunError> {
    let calls = &reply.tool_calls;
    let call_ids: Vec<String> = calls.iter().map(|call| call.id.clone()).collect();
    let mut results: Vec<String> = vec![String::new(); calls.len()];
    let mut batch: Vec<(usize, Arc<Tool>, Value)> = Vec::new();
    let mut ran = false;
    for (position, call) in calls.iter().enumerate() {
        let Some(tool) = tools.get(&call.name).cloned() else {
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            results[position] = format!(
                "Error: there is no tool `{}`; the tools are: {}.",
                call.name,
                names.join(", ")
            );
            continue;
        };
        let args = match serde_json::from_str::<Value>(&call.arguments) {
            Ok(args) if args.is_object() => args,
            Ok(_) | Err(_) => {
                results[position] = "Error: the arguments were not a JSON object. Call the tool again with valid arguments.".to_owned();
                continue;
            }
        };
        if let Err(why) = tool.check_args(&args) {
            results[position] = format!(
                "Error: the arguments do not fit the tool's parameters: {why}. Call it again with valid arguments."
            );
            continue;
        }
        if !tool.confirm {
            // Read-only by the tools file's word, never by the model's.
            let status = ctx
                .chunk(
                    ChunkType::Status,
                    format!("Running {} (read-only, no confirmation)", tool.name),
                )
                .with_meta(meta::TOOL, tool.name.as_str());
            ctx.send(status).await?;
            let outcome = ctx.run_tool(position + 1, &tool, &args).await?;
            results[position] = outcome_text(&outcome);
            ran = true;
            continue;
        }
        batch.push((position, tool, args));
    }
    if batch.is_empty() {
        push_results(messages, &call_ids, results);
        return Ok(ran);
    }
    let mut plan = Plan {
        state: None,
        summary: format!("Confirm {} tool call(s)?", batch.len()),
        risk_level: batch
            .iter()
            .map(|(_, tool, _)| tool.risk)
            .max()
            .unwrap_or(RiskLevel::Low),
        tasks: batch
            .iter()
            .enumerate()
            .map(|(k, (_, tool, args))| TaskSpec {
                index: k + 1,
                description: describe(tool, args),
                tool: tool.name.clone(),
                args: Some(args.clone()),
            })
            .collect(),
    };
    let pending = Pending::Tools {
        call_ids: call_ids.clone(),
        results: results.clone(),
        batch: batch
            .iter()
            .map(|(position, tool, args)| PendingCall {
                position: *position,
                tool: tool.name.clone(),
                args: args.clone(),
            })
            .collect(),
        ran,
    };
    plan.state = paused_state(ctx, messages, go_on, pending);
    let answer = ctx.confirm(plan).await;
    tools_answered(ctx, messages, &call_ids, results, &batch, answer, ran).await
}

/// Runs the confirmed `batch` as decided (or not at all) and gives the
/// model every call's result. Returns whether any call ran.
async fn tools_answered(
    ctx: &mut RunContext,
    messages: &mut Vec<Value>,
    call_ids: &[String],
    mut results: Vec<String>,
    batch: &[(usize, Arc<Tool>, Value)],
    answer: Result<Approval, RunError>,
    mut ran: bool,
) -> Result<bool, RunError> {
    match answer {
        Ok(Approval::Confirm(decisions)) => {
            for (k, (position, tool, args)) in batch.iter().enumerate() {
                let index = k + 1;
                let used = match decisions.verdict(index) {
                    Verdict::Approve => args.clone(),
                    Verdict::Edit { args } => args.clone(),
                    Verdict::Reject { reason } => {
                        let why = reason.as_deref().unwrap_or("no reason given");
                        let skipped =
                            ToolOutcome::skipped(false, None, Some(format!("rejected: {why}")));
                        ctx.record_tool(index, &tool.name, None, &skipped).await?;
                        results[*position] =
                            format!("The user rejected this call ({why}); it was not run.");
                        continue;
                    }
                    Verdict::Respond { result } => {
                        let answered = ToolOutcome::skipped(true, Some(result.clone()), None);
                        ctx.record_tool(index, &tool.name, None, &answered).await?;
                        results[*position] = format!(
                            "The user gave this result instead of running the call: {result}"
                        );
                        continue;
                    }
                };
                let status = ctx
                    .chunk(
                        ChunkType::Status,
                        format!("Running {} (task {index})", tool.name),
                    )
                    .with_meta(meta::STEP, index)
                    .with_meta(meta::TOOL, tool.name.as_str());
                ctx.send(status).await?;
                let outcome = ctx.run_tool(index, tool, &used).await?;
                results[*position] = outcome_text(&outcome);
                ran = true;
            }
        }
        Ok(Approval::Modify(feedback)) => {
            let text = format!(
                "Not run. {} Call the tools again as they should be.",
                modify_text(&feedback)
            );
            for (position, _, _) in batch {
                results[*position] = text.clone();
            }
            ctx.emit(ChunkType::Status, "Re-planning with your feedback")
                .await?;
        }
        Err(RunError::Cancelled(reason)) => {
            for (position, _, _) in batch {
                results[*position] =
                    format!("Not run: the user did not confirm ({}).", reason.as_str());
            }
            push_results(messages, call_ids, results);
            return Err(RunError::Cancelled(reason));
        }
        Err(failed) => return Err(failed),
    }
    push_results(messages, call_ids, results);
    Ok(ran)
}

/// One `tool` message per call, in the calls' order.
fn push_results(messages: &mut Vec<Value>, call_ids: &[String], results: Vec<String>) {
    for (id, result) in call_ids.iter().zip(results) {
        messages.push(tool_result(id, &result));
    }
}

/// What the model is told a call did.
fn outcome_text(outcome: &ToolOutcome) -> String {
    match (outcome.ok, &outcome.result, &outcome.error) {
        (true, Some(result), _) if outcome.truncated => {
            format!("{result}\n[output truncated at {} bytes]", result.len())
        }
        (true, Some(result), _) => result.clone(),
        (_, _, Some(error)) => format!("Error: {error}"),
        _ => "Error: the call failed".to_owned(),
    }
}

/// What the model is told after a modify.
fn modify_text(feedback: &str) -> String {
    if feedback.trim().is_empty() {
        "The user did not confirm and asked for changes without saying which.".to_owned()
    } else {
        format!("The user did not confirm and asked for this change: {feedback}")
    }
}

/// A task's readable description: the tool and its arguments, on one line.
fn describe(tool: &Tool, args: &Value) -> String {
    let args = args.to_string();
    let mut text = format!("{} {}", tool.name, args);
    if text.chars().count() > 200 {
        text = text.chars().take(199).collect::<String>() + "…";
    }
    text
}

/// A declared tool, as the model is offered it.
fn tool_spec(tool: &Tool) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        }
    })
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
        state: None,
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
    match err {
        CallError::RateLimited { retry_after, .. } => RunError::RateLimited {
            message: err.to_string(),
            retry_after_secs: *retry_after,
        },
        _ if err.is_limit() => limit(&err.to_string()),
        _ => failed(&err.to_string()),
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

    #[test]
    fn a_bad_plan_is_explained_to_the_model() {
        let call = |name: &str, arguments: &str| ToolCall {
            id: "c".into(),
            name: name.into(),
            arguments: arguments.into(),
            ..ToolCall::default()
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
    fn a_plan_with_too_many_tasks_goes_back_to_the_model() {
        let tasks: Vec<Value> = (0..=MAX_PLAN_TASKS)
            .map(|i| json!({ "description": i.to_string() }))
            .collect();
        let call = ToolCall {
            id: "c".into(),
            name: PLAN_TOOL.into(),
            arguments: json!({ "tasks": tasks }).to_string(),
            ..ToolCall::default()
        };
        assert!(parse_plan(&call).unwrap_err().contains("at most"));
    }
}
