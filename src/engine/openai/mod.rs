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
//! - It can ask the user through the built-in tool `ask_user` ([`ask`]): a
//!   call is one `input_request`, whose answers are the tool's result (off
//!   with `--no-ask-user`).
//! - Conversation state: each session's turns, keyed by the session within
//!   its API key's namespace, bounded in messages, bytes and time
//!   ([`conversations`]).
//! - What the model server sends is bounded before it is held: lines and
//!   error bodies ([`upstream`]), tool calls, their arguments and the text of
//!   one answer (here). Past a bound the run ends with `engine_limit`.
//! - The model server is read on the runtime the engine was built on, not on
//!   the HTTP worker that serves the run's client.
//! - With a durable store a pause keeps the conversation and the calls it
//!   awaits (`PausedTurn`); [`Engine::resume`] goes on from there in
//!   another process.
//!
//! What it does not do: run real tools. "Carrying out" a plan is the model's
//! own work, written as text; an engine with side effects would run them at
//! the same place, after `confirm` returned `Approval::Confirm`.

pub mod ask;
mod calls;
pub mod conversations;
mod plan;
mod reach;
pub mod reply;
mod turn;
pub mod upstream;

use std::sync::Mutex;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use secrecy::ExposeSecret;
use serde_json::{json, Map, Value};

use self::ask::{ask_tool, ask_turn, asked_answered, ASK_TOOL};
use self::calls::{tool_spec, tool_turn, tools_answered};
use self::conversations::{ConversationLimits, Conversations};
use self::plan::{plan_answered, plan_tool, plan_turn};
use self::reply::ModelReply;
use self::turn::{PausedTurn, Pending, Resumable};
use self::upstream::{CallError, ModelCall, Upstream, Who};
use super::llm::OpenAiConfig;
use crate::protocol::{meta, ChunkType, ErrorType};
use crate::run::context::RunContext;
use crate::run::engine::Engine;
use crate::run::outcome::{Completion, RunError};
use crate::run::plan::Resumed;
use crate::session::run_log;
use crate::tools::Tools;

/// Model calls one run may make (a plan, its revisions, the report).
const MAX_MODEL_CALLS: usize = 12;
/// Bytes of text of one answer.
pub const MAX_ANSWER_TEXT_BYTES: usize = 256 * 1024;
/// The system prompt without declared tools: the model's only tool is
/// `propose_plan`.
const PLAN_PROMPT: &str = "You are an assistant whose actions need a human's approval. \
Answer questions directly. When the user asks you to do something, do not claim to have \
done it: call the propose_plan tool with the numbered tasks you would carry out and an \
honest risk_level (high for anything destructive or irreversible). The tool's result \
tells you whether the user confirmed, asked for changes, or cancelled. Only after a \
confirmation, carry the plan out and report the result of each task.";

/// The system prompt: it names exactly the tools the model is offered
/// (with `--tools`, the declared ones *instead of* `propose_plan`), so a
/// model that follows it literally never calls a tool it lacks.
fn system_prompt(tools: &Tools, ask_user: bool) -> String {
    let mut prompt = acting_prompt(tools);
    if ask_user {
        prompt.push_str(
            " When you need a decision or a missing detail from the user, call ask_user with your questions instead of guessing; its result is their answer.",
        );
    }
    prompt
}

/// What the system prompt says about acting: `propose_plan`, or the
/// declared tools.
fn acting_prompt(tools: &Tools) -> String {
    if tools.is_empty() {
        return PLAN_PROMPT.to_owned();
    }
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_str()).collect();
    format!(
        "You are an assistant whose actions need a human's approval. Answer questions \
         directly. When the user asks you to do something, do it by calling your tools ({}) \
         with the arguments you would use; these are the only tools you have. Each batch of \
         calls is shown to the user, who confirms, edits, rejects or cancels them before any \
         of them runs; then each call's result (or why it did not run) comes back to you. \
         Never claim to have done what no tool result shows. When you are done, answer \
         without calling a tool and report what was done.",
        names.join(", ")
    )
}

/// The engine; one value serves every run.
pub struct OpenAiEngine {
    http: reqwest::Client,
    config: OpenAiConfig,
    /// Where model calls are read: the runtime the engine was built on.
    runtime: tokio::runtime::Handle,
    conversations: Mutex<Conversations>,
    /// Whether the model server can be reached (for `/readyz`).
    reach: std::sync::Arc<reach::Reach>,
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
        let reach = reach::Reach::watch(&config.base_url, &runtime);
        Ok(OpenAiEngine {
            http,
            config,
            runtime,
            conversations: Mutex::new(conversations),
            reach,
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
        let mut offered: Vec<Value> = if tools.is_empty() {
            vec![plan_tool()]
        } else {
            tools.iter().map(|tool| tool_spec(tool)).collect()
        };
        if self.config.ask_user {
            offered.push(ask_tool());
        }
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
            let asks = self.config.ask_user && reply.tool_calls.iter().any(|c| c.name == ASK_TOOL);
            go_on.acted |= if asks {
                // Boxed: a question pause holds only what it needs.
                Box::pin(ask_turn(ctx, messages, &reply, go_on)).await?;
                false
            } else if tools.is_empty() {
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
        resumed: Resumed,
        mut go_on: Resumable,
    ) -> Result<Completion, RunError> {
        let interrupted = || RunError::Failed {
            error_type: ErrorType::Interrupted,
            message: "the stored pause does not fit the decision taken on it".to_owned(),
        };
        let approval = match (&pending, resumed) {
            (
                Pending::Ask {
                    call_ids,
                    results,
                    position,
                    questions,
                },
                Resumed::Answers(answers),
            ) => {
                let results = results.clone();
                asked_answered(
                    messages,
                    call_ids,
                    results,
                    *position,
                    questions,
                    Ok(answers),
                )?;
                return self.converse(ctx, messages, go_on).await;
            }
            (Pending::Ask { .. }, Resumed::Approval(_)) | (_, Resumed::Answers(_)) => {
                return Err(interrupted())
            }
            (_, Resumed::Approval(approval)) => approval,
        };
        go_on.acted |= match pending {
            Pending::Ask { .. } => return Err(interrupted()),
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
                    calls.push((call.position, tool, call.args, call.approved_by));
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
            // Who is speaking, in the call's log lines: the run, and the
            // model server by its origin only.
            Who {
                tag: ctx.tag(),
                server: format!("model server {}", crate::redact::origin(&url)),
            },
            self.config.timeout,
            self.config.max_time,
        );
        let mut reply = ModelReply::default();
        loop {
            let chunk = match ctx.until_stopped(call.next()).await? {
                Upstream::Chunk(chunk) => {
                    self.reach.set(true);
                    chunk
                }
                Upstream::Done => return Ok(reply),
                Upstream::Failed(err) => {
                    if matches!(err, CallError::Unreachable) {
                        self.reach.set(false);
                    }
                    return Err(call_failed(&err));
                }
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

    fn health(&self) -> Result<(), String> {
        self.reach.health()
    }

    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>> {
        async move {
            let key = ctx.session_key().clone();
            let prompt = system_prompt(ctx.tools(), self.config.ask_user);
            let mut messages = vec![json!({ "role": "system", "content": prompt })];
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
        resumed: Resumed,
    ) -> Option<BoxFuture<'a, Result<Completion, RunError>>> {
        let paused: PausedTurn = serde_json::from_value(state)
            .map_err(|err| run_log!(Warn, ctx.tag(), "cannot read a stored openai run: {err}"))
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
                    .go_on(ctx, &mut messages, pending, resumed, go_on)
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

impl OpenAiEngine {
    fn conversations_lock(&self) -> std::sync::MutexGuard<'_, Conversations> {
        // Plain data; a panic elsewhere leaves it consistent.
        self.conversations
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
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
