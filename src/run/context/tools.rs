//! Running a declared tool for an engine: the call, once, then its
//! `tool_output` chunk and its `executed` audit record. An MCP server's tool
//! may ask questions mid-call: they are put to the user on the run's stream.

use crate::run::journal::CallEvent;
use crate::session::run_log;
use crate::session::RunTag;
use futures_util::future::BoxFuture;
use serde_json::Value;

use super::exactly_once::{started, Attempt, GoOn};
use super::{Cleared, RunContext};
use crate::protocol::question::Question;
use crate::protocol::{meta, ApprovedBy, Chunk, ChunkType, ErrorType};
use crate::run::outcome::RunError;
use crate::run::plan::{Answers, Questions};
use crate::tools::mcp::call::{Answered, CallHost};
use crate::tools::{Stamp, Tool, ToolOutcome};

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
    /// recorded. The call runs exactly once. An MCP server's questions
    /// mid-call are put to the user as question pauses (the run is the
    /// call's host, `Host`); a
    /// cancel or a timeout of one ends the run cancelled, after the call's
    /// outcome is reported. `cleared`: what lets it run (a person, a rule
    /// or grant, or nothing for a tool that needs no confirmation); the
    /// call gets its signed receipt, and so does its `tool_output`.
    pub async fn run_tool(
        &mut self,
        index: usize,
        tool: &Tool,
        args: &Value,
        cleared: Cleared,
    ) -> Result<ToolOutcome, RunError> {
        let key = self.idempotency_key(index, &tool.name, args);
        let mut attempt = Attempt {
            key,
            number: 1,
            resumed: false,
            journaled: self.journals(&cleared),
        };
        // After a crash, a task its journal names goes on where it was
        // (its preview is not looked at again: its effect may be done).
        if let Some(entry) = self.journaled_entry(&attempt.key, index) {
            match Box::pin(self.go_on(tool, args, entry)).await? {
                GoOn::Done(outcome) => return Ok(outcome),
                GoOn::Again(number) => {
                    attempt.number = number;
                    attempt.resumed = true;
                }
            }
        } else if let Some(changed) = Box::pin(self.rechecked(index, tool, args, &cleared)).await {
            return Box::pin(self.not_run_changed(index, tool, args, changed)).await;
        }
        let anchor = self.calls_anchor();
        let entry = match (&anchor, attempt.journaled) {
            (Some(anchor), true) => Some(started(anchor, index, &tool.name, &attempt)),
            _ => None,
        };
        if let Some(entry) = &entry {
            // Kept before the call begins: a crash from here on is known.
            Box::pin(self.keep_entry(entry)).await?;
        }
        let stop = self.stop.clone();
        let receipt = self.receipt(index, &tool.name, args, &cleared, &attempt.key);
        // Boxed, like the record below: an engine's future is as large as
        // the largest thing it awaits, and a paused run holds that future
        // for the whole pause; a process's state must not be in it.
        let (outcome, ended) = {
            let stamp = Stamp {
                receipt: receipt.as_deref(),
                idempotency_key: Some(&attempt.key),
            };
            let mut host = Host {
                ctx: self,
                index,
                tool: &tool.name,
            };
            Box::pin(tool.run(
                args,
                stamp,
                async move {
                    stop.stopped().await;
                },
                &mut host,
            ))
            .await
        };
        let ran = Ran {
            args,
            approved_by: cleared.approved_by(),
            receipt,
            attempt: Some(&attempt),
        };
        let chunk = Box::pin(self.record_tool(index, &tool.name, Some(ran), &outcome)).await?;
        if let Some(mut entry) = entry {
            // Kept before the run moves on: a crash from here on shows it.
            entry.finished = chunk;
            Box::pin(self.keep_entry(&entry)).await?;
        }
        if let Some(err) = ended {
            return Err(err);
        }
        // Stopped meanwhile: the run ends for that reason, after saying what ran.
        if let Some(reason) = self.stop.reason() {
            return Err(RunError::Cancelled(reason));
        }
        Ok(outcome)
    }

    /// A call whose effect changed since it was approved (`recheck`): not
    /// run; its `tool_output` says so with both digests, and the audit log
    /// records `precondition_changed` (fail closed) before the run goes on.
    async fn not_run_changed(
        &mut self,
        index: usize,
        tool: &Tool,
        args: &Value,
        changed: crate::tools::outcome::Changed,
    ) -> Result<ToolOutcome, RunError> {
        run_log!(
            Info,
            self.tag(),
            "{}: its preview changed since task {index} was approved; not run",
            tool.name
        );
        let event = CallEvent::PreconditionChanged {
            tool: &tool.name,
            args,
            task: index,
            changed: &changed,
        };
        let record = self.settings.journal().call(self.subject(), event);
        self.audit(record.as_ref()).await?;
        let mut outcome = ToolOutcome::skipped(
            false,
            None,
            Some(format!(
                "not run: its effect changed since it was approved (its preview now shows                  something else: {} instead of {}); it is put to the person again",
                changed.current_digest, changed.approved_digest
            )),
        );
        outcome.changed = Some(Box::new(changed));
        let chunk = self.tool_output(index, &tool.name, &outcome, None);
        self.replay.push(chunk);
        Ok(outcome)
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
        let chunk = match &outcome.changed {
            Some(changed) => chunk
                .with_meta(meta::ERROR_TYPE, ErrorType::PreconditionChanged.as_str())
                .with_meta(meta::APPROVED_DIGEST, changed.approved_digest.as_str())
                .with_meta(meta::CURRENT_DIGEST, changed.current_digest.as_str()),
            None => chunk,
        };
        match (&outcome.result, &outcome.error) {
            (Some(result), _) => chunk.with_meta(meta::RESULT, result.as_str()),
            (None, Some(error)) => chunk.with_meta(meta::ERROR, error.as_str()),
            (None, None) => chunk.with_meta(meta::RESULT, ""),
        }
    }

    /// Reports a call's outcome (run, skipped or answered by the user): a
    /// `tool_output` chunk and, for a call that ran, an `executed` record.
    /// The chunk is written even if the run was told to stop: what ran is
    /// always shown. Returns the chunk for a journaled call's entry.
    pub async fn record_tool(
        &mut self,
        index: usize,
        tool: &str,
        ran: Option<Ran<'_>>,
        outcome: &ToolOutcome,
    ) -> Result<Option<Chunk>, RunError> {
        let mut chunk = self.tool_output(index, tool, outcome, None);
        let attempt = ran.as_ref().and_then(|ran| ran.attempt);
        if let Some(attempt) = attempt {
            chunk = chunk.with_meta(meta::IDEMPOTENCY_KEY, attempt.key.as_str());
            if attempt.resumed {
                chunk = chunk
                    .with_meta(meta::RESUMED_AFTER_CRASH, true)
                    .with_meta(meta::ATTEMPT, attempt.number);
            }
        }
        let kept = attempt
            .filter(|attempt| attempt.journaled)
            .map(|_| chunk.clone());
        let approved_by = ran.as_ref().and_then(|ran| ran.approved_by.clone());
        if let Some(receipt) = ran.as_ref().and_then(|ran| ran.receipt.as_deref()) {
            chunk = chunk.with_meta(meta::RECEIPT, receipt);
        }
        if let Some(by) = &approved_by {
            chunk = chunk.with_meta(
                meta::APPROVED_BY,
                serde_json::to_value(by).unwrap_or_default(),
            );
        }
        self.replay.push(chunk);
        if outcome.skipped {
            return Ok(kept);
        }
        let output = outcome
            .result
            .as_deref()
            .or(outcome.error.as_deref())
            .unwrap_or("");
        let executed = CallEvent::Executed {
            tool,
            args: ran.map_or(Value::Null, |ran| ran.args.clone()),
            outcome,
            output,
            approved_by,
            idempotency_key: attempt.map(|attempt| attempt.key.as_str()),
            attempt: attempt.map_or(1, |attempt| attempt.number),
        };
        let record = self.settings.journal().call(self.subject(), executed);
        self.audit(record.as_ref()).await?;
        Ok(kept)
    }
}

/// A call that ran: the arguments it ran with, and what let it run
/// without a person's yes, if anything did.
pub struct Ran<'a> {
    pub args: &'a Value,
    pub approved_by: Option<ApprovedBy>,
    /// Its signed receipt, shown in the `tool_output` chunk.
    pub receipt: Option<String>,
    /// Its key and attempt (a call the run made: always).
    pub(super) attempt: Option<&'a Attempt>,
}

/// A run as the host of its MCP calls: a server's question is a question
/// pause on the run's stream (never stored: a live call cannot outlive the
/// process), its progress a `status` chunk.
struct Host<'a> {
    ctx: &'a mut RunContext,
    index: usize,
    tool: &'a str,
}

impl CallHost for Host<'_> {
    type Error = RunError;

    fn ask(
        &mut self,
        title: String,
        questions: Vec<Question>,
    ) -> BoxFuture<'_, Result<Answered, RunError>> {
        Box::pin(async move {
            let asked = Questions {
                title,
                questions,
                state: None,
            };
            Ok(match self.ctx.ask(asked).await? {
                Answers::Given(answers) => Answered::Given(answers),
                Answers::Skipped => Answered::Skipped,
            })
        })
    }

    fn cannot_ask(&mut self, why: &str) {
        run_log!(
            Info,
            self.ctx.tag(),
            "{}: a question that cannot be asked ({why}), declined",
            self.tool
        );
        let text = format!(
            "{} asked a question that cannot be put to you ({why}); declined",
            self.tool
        );
        let chunk = self
            .ctx
            .chunk(ChunkType::Status, text)
            .with_meta(meta::STEP, self.index);
        self.ctx.replay.push(chunk);
    }

    fn tag(&self) -> Option<RunTag> {
        Some(self.ctx.tag())
    }

    fn progress(&mut self, text: &str) {
        let chunk = self
            .ctx
            .chunk(ChunkType::Status, format!("{}: {text}", self.tool))
            .with_meta(meta::STEP, self.index)
            .with_meta(meta::TOOL, self.tool);
        self.ctx.replay.push(chunk);
    }
}
