//! Running a declared tool for an engine: the call, once, then its
//! `tool_output` chunk and its `executed` audit record. An MCP server's tool
//! may ask questions mid-call: they are put to the user on the run's stream.

use std::time::Instant;

use rmcp::model::ElicitationAction;
use serde_json::Value;
use tokio::sync::mpsc;

use super::{audit_failed, RunContext};
use crate::audit::{self, AuditRecord};
use crate::protocol::{meta, Chunk, ChunkType, ErrorType};
use crate::run::outcome::RunError;
use crate::run::plan::{Answers, Questions};
use crate::tools::keeper::KILL_GRACE;
use crate::tools::mcp::{self, client::Elicitation, elicit, McpTool};
use crate::tools::{Executor, Tool, ToolOutcome};

/// Most often an MCP call's progress is shown (a `status` chunk).
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_millis(250);

/// Calls one run may make without a confirmation (`confirm = false`
/// tools): past it the run ends with `tool_call_limit`. Every confirmed
/// call has its own yes; these have none, so a model cannot make a run
/// call them without end.
pub const MAX_UNCONFIRMED_CALLS: usize = 32;

impl RunContext {
    /// Counts one call about to run without a confirmation; past
    /// [`MAX_UNCONFIRMED_CALLS`] the run ends (`tool_call_limit`).
    pub fn unconfirmed_call(&mut self) -> Result<(), RunError> {
        self.unconfirmed_calls += 1;
        if self.unconfirmed_calls > MAX_UNCONFIRMED_CALLS {
            return Err(RunError::failed(
                ErrorType::ToolCallLimit,
                format!(
                    "the model made more than {MAX_UNCONFIRMED_CALLS} calls without confirmation \
                     in one run"
                ),
            ));
        }
        Ok(())
    }

    /// Runs one call of `tool` with `args` (already checked against its
    /// schema, and confirmed unless the tool needs no confirmation), then
    /// reports it: a `tool_output` chunk and an `executed` audit record. A
    /// stop terminates a running command; its outcome is still reported and
    /// recorded. The call runs exactly once.
    pub async fn run_tool(
        &mut self,
        index: usize,
        tool: &Tool,
        args: &Value,
    ) -> Result<ToolOutcome, RunError> {
        if let Executor::Mcp(call) = &tool.executor {
            return Box::pin(self.run_mcp_tool(index, tool, call, args)).await;
        }
        let stop = self.stop.clone();
        // Boxed, like the record below: an engine's future is as large as
        // the largest thing it awaits, and a paused run holds that future
        // for the whole pause; a process's state must not be in it.
        let outcome = Box::pin(tool.run(args, async move {
            stop.stopped().await;
        }))
        .await;
        Box::pin(self.record_tool(index, &tool.name, Some(args), &outcome)).await?;
        // Stopped meanwhile: the run ends for that reason, after saying what ran.
        if let Some(reason) = self.stop.reason() {
            return Err(RunError::Cancelled(reason));
        }
        Ok(outcome)
    }

    /// [`RunContext::run_tool`] for a tool of an MCP server: the call runs
    /// until its result, its `timeout_secs` (not counting the time a person
    /// takes to answer the server's questions) or a stop; each question the
    /// server asks meanwhile is put to the user as a question pause. A
    /// cancel or a timeout of such a question is told to the server
    /// (`cancel`), the call is given [`KILL_GRACE`] to end, and the run
    /// ends cancelled.
    async fn run_mcp_tool(
        &mut self,
        index: usize,
        tool: &Tool,
        call: &McpTool,
        args: &Value,
    ) -> Result<ToolOutcome, RunError> {
        let started = Instant::now();
        let (asks, mut questions) = mpsc::channel(1);
        let (progress, mut progressed) = mpsc::channel(1);
        let mut running = Box::pin(call.server.call(&call.tool, args, asks, progress));
        let mut last_shown: Option<Instant> = None;
        let stop = self.stop.clone();
        let mut deadline = tokio::time::Instant::now() + tool.timeout;
        let mut ended = None;
        let outcome = loop {
            tokio::select! {
                outcome = &mut running => break outcome,
                Some(question) = questions.recv() => {
                    let asked = tokio::time::Instant::now();
                    let answered = self.put_server_question(index, &call.server.name, question).await;
                    deadline += asked.elapsed();
                    if let Err(err) = answered {
                        ended = Some(err);
                        // Told `cancel`: the server may still end the call.
                        let outcome = tokio::time::timeout(KILL_GRACE, &mut running)
                            .await
                            .unwrap_or_else(|_| mcp::stopped(started));
                        break outcome;
                    }
                }
                Some(text) = progressed.recv() => {
                    // At most one a quarter second: a chatty server does not
                    // fill the run's log.
                    if last_shown.is_none_or(|at| at.elapsed() >= PROGRESS_EVERY) {
                        last_shown = Some(Instant::now());
                        let chunk = self
                            .chunk(ChunkType::Status, format!("{}: {text}", tool.name))
                            .with_meta(meta::STEP, index)
                            .with_meta(meta::TOOL, tool.name.as_str());
                        self.log.push(chunk);
                    }
                }
                () = tokio::time::sleep_until(deadline) => break mcp::timed_out(started, tool.timeout),
                _ = stop.stopped() => break mcp::stopped(started),
            }
        };
        // Dropping the call cancels it on the server if it is still running.
        drop(running);
        Box::pin(self.record_tool(index, &tool.name, Some(args), &outcome)).await?;
        if let Some(err) = ended {
            return Err(err);
        }
        if let Some(reason) = self.stop.reason() {
            return Err(RunError::Cancelled(reason));
        }
        Ok(outcome)
    }

    /// Puts an MCP server's question to the user and answers the server:
    /// `answer` -> `accept` with the content, `skip` -> `decline`; a cancel,
    /// a timeout or a stop -> `cancel`, and the run's end comes back as the
    /// error. A question that cannot be asked is declined, and a `status`
    /// chunk says why.
    async fn put_server_question(
        &mut self,
        index: usize,
        server: &str,
        question: Elicitation,
    ) -> Result<(), RunError> {
        let mapped = match elicit::questions(&question.schema, &question.order) {
            Ok(mapped) => mapped,
            Err(why) => {
                let chunk = self
                    .chunk(
                        ChunkType::Status,
                        format!("MCP server {server} asked a question that cannot be put to you ({why}); declined"),
                    )
                    .with_meta(meta::STEP, index);
                self.log.push(chunk);
                question.answer(ElicitationAction::Decline, None);
                return Ok(());
            }
        };
        let title = match question.message.trim() {
            "" => format!("MCP server {server} asks"),
            message => message.to_owned(),
        };
        let asked = Questions {
            title,
            questions: mapped.questions.clone(),
            // A live call cannot outlive the process: never stored.
            state: None,
        };
        match self.ask(asked).await {
            Ok(Answers::Given(answers)) => {
                question.answer(ElicitationAction::Accept, Some(mapped.content(&answers)));
                Ok(())
            }
            Ok(Answers::Skipped) => {
                question.answer(ElicitationAction::Decline, None);
                Ok(())
            }
            Err(err) => {
                question.answer(ElicitationAction::Cancel, None);
                Err(err)
            }
        }
    }

    /// The `tool_output` chunk of a call's outcome; `text` replaces the
    /// one-line summary.
    pub fn tool_output(
        &self,
        index: usize,
        tool: &str,
        outcome: &ToolOutcome,
        text: Option<String>,
    ) -> Chunk {
        let chunk = self
            .chunk(
                ChunkType::ToolOutput,
                text.unwrap_or_else(|| outcome.summary(tool)),
            )
            .with_meta(meta::STEP, index)
            .with_meta(meta::TOOL, tool)
            .with_meta(meta::OK, outcome.ok)
            .with_meta(meta::SKIPPED, outcome.skipped)
            .with_meta(meta::TRUNCATED, outcome.truncated)
            .with_meta(meta::DURATION_MS, outcome.duration_ms);
        match (&outcome.result, &outcome.error) {
            (Some(result), _) => chunk.with_meta(meta::RESULT, result.as_str()),
            (None, Some(error)) => chunk.with_meta(meta::ERROR, error.as_str()),
            (None, None) => chunk.with_meta(meta::RESULT, ""),
        }
    }

    /// Reports a call's outcome (run, skipped or answered by the user): a
    /// `tool_output` chunk and, for a call that ran, an `executed` record.
    /// The chunk is written even if the run was told to stop: what ran is
    /// always shown.
    pub async fn record_tool(
        &mut self,
        index: usize,
        tool: &str,
        args: Option<&Value>,
        outcome: &ToolOutcome,
    ) -> Result<(), RunError> {
        let chunk = self.tool_output(index, tool, outcome, None);
        self.log.push(chunk);
        if outcome.skipped {
            return Ok(());
        }
        if let Some(audit) = self.settings.audit.clone() {
            let output = outcome
                .result
                .as_deref()
                .or(outcome.error.as_deref())
                .unwrap_or("");
            let record = AuditRecord::Executed {
                run: self.audit_fields(),
                tool: tool.to_owned(),
                args: args.cloned().unwrap_or(Value::Null),
                ok: outcome.ok,
                exit_status: outcome.exit_status,
                http_status: outcome.http_status,
                duration_ms: outcome.duration_ms,
                output_bytes: outcome.output_bytes,
                output_sha256: audit::sha256_hex(output.as_bytes()),
            };
            audit
                .write(&record)
                .await
                .map_err(|err| audit_failed(&err))?;
        }
        Ok(())
    }
}
