//! The seam between the service and whatever produces the answer.
//!
//! An [`Engine`] gets a [`RunContext`] and drives one run: it streams chunks
//! (token by token if it likes), asks for confirmation as many times as it
//! needs with [`RunContext::confirm`], and returns how the run ended. It knows
//! nothing of HTTP; the context knows nothing of a particular engine.
//!
//! Conversation state across runs belongs to the engine: it is keyed by
//! [`RunContext::session_key`], which is stable across a session's runs.
//!
//! Engines: [`planner`] (deterministic, built in, the default) and
//! [`openai`] (a real model behind any OpenAI-compatible server).

#[cfg(feature = "openai")]
pub mod openai;
pub mod planner;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::BoxFuture;
use serde_json::{Map, Value};

use crate::audit::{self, AuditLog};
use crate::confirmation::{Decision, PendingDecision, RunSlot, SessionKey, TaskCheck};
use crate::metrics::Metrics;
use crate::protocol::{
    json_len, meta, Action, CancelReason, Chunk, ChunkType, ConfirmationData, Decisions, ErrorType,
    RiskLevel, TaskSpec, MAX_CONFIRMATION_BYTES, MAX_PLAN_TASKS,
};
use crate::run::log::RunLog;
use crate::run::stop::RunStop;
use crate::store::{MemoryStore, Namespaces, PausedRecord, Store};
use crate::tools::{Tool, ToolOutcome, Tools};

/// A chat engine. One instance serves every run; it is shared across threads.
pub trait Engine: Send + Sync + 'static {
    /// Drives one run to its end. Returning is the only way to end a run: the
    /// caller turns the result into the stream's final chunk.
    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>>;

    /// The engine's name in stored records (`--store`).
    fn name(&self) -> &'static str {
        "custom"
    }

    /// Goes on with a run restored from a store: `state` is what the engine
    /// put in [`Plan::state`] when it paused, `approval` the decision taken
    /// since. `None`: this engine cannot restore a run (then its paused runs
    /// are not stored, and end at shutdown as without a store).
    fn resume<'a>(
        &'a self,
        ctx: &'a mut RunContext,
        state: Value,
        approval: Approval,
    ) -> Option<BoxFuture<'a, Result<Completion, RunError>>> {
        let _ = (ctx, state, approval);
        None
    }
}

/// How a successful run ends: the text and metadata of the `completion` chunk.
#[derive(Debug, Clone, Default)]
pub struct Completion {
    pub text: String,
    pub metadata: Map<String, Value>,
}

/// How an unsuccessful run ends.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunError {
    /// Ends with a `cancelled` chunk. Returned by [`RunContext`] methods when
    /// the run must stop; engines pass it on with `?`.
    #[error("run cancelled: {}", .0.as_str())]
    Cancelled(CancelReason),
    /// Ends with an `error` chunk carrying `error_type`.
    #[error("{message}")]
    Failed {
        error_type: ErrorType,
        message: String,
    },
    /// The process is shutting down and the run's pause is kept in a durable
    /// store: the run ends here without a final chunk (its stream closes
    /// after a `retry:` line) and goes on in the next process.
    #[error("run suspended until the server is back")]
    Suspended,
    /// Ends with an `error` chunk, `error_type: rate_limited`, and
    /// `metadata.retry_after` (seconds) when the model server said.
    #[error("{message}")]
    RateLimited {
        message: String,
        retry_after_secs: Option<u64>,
    },
}

/// A plan put to the user.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The `chunk` text of the confirmation request.
    pub summary: String,
    pub tasks: Vec<TaskSpec>,
    pub risk_level: RiskLevel,
    /// What [`Engine::resume`] needs to go on from this pause after a
    /// restart; `None` if the engine cannot (the pause is then not stored).
    pub state: Option<Value>,
}

/// What the user answered to a plan (cancel arrives as `RunError::Cancelled`).
#[derive(Debug, Clone, PartialEq)]
pub enum Approval {
    /// With the verdict for each task: approved unless rejected, edited or
    /// answered by the user (`decisions` of the reply).
    Confirm(Decisions),
    Modify(String),
}

/// Per-run knobs and services, from the server's settings; shared by every run.
#[derive(Debug, Clone)]
pub struct RunSettings {
    pub confirm_timeout: Duration,
    pub max_rounds: u32,
    pub step_delay: Duration,
    /// The tools of `--tools` (empty without).
    pub tools: Arc<Tools>,
    /// The audit log of `--audit-log`, if any.
    pub audit: Option<Arc<AuditLog>>,
    /// Where paused runs are kept (`--store`).
    pub store: Arc<dyn Store>,
    /// The engine's name, for stored records.
    pub engine_name: &'static str,
    /// The API keys' namespaces as stored records name them.
    pub namespaces: Namespaces,
}

impl Default for RunSettings {
    fn default() -> RunSettings {
        RunSettings {
            confirm_timeout: Duration::from_secs(300),
            max_rounds: 5,
            step_delay: Duration::ZERO,
            tools: Arc::default(),
            audit: None,
            store: Arc::new(MemoryStore),
            engine_name: "custom",
            namespaces: Namespaces::default(),
        }
    }
}

/// What a restored run's context is made of.
pub(crate) struct RestoredParts {
    pub message: String,
    pub slot: RunSlot,
    pub settings: Arc<RunSettings>,
    pub log: Arc<RunLog>,
    pub stop: RunStop,
    pub metrics: Arc<Metrics>,
    pub stored_id: Arc<str>,
    pub round: u32,
}

/// A confirmation request on its way to a decision.
struct Asked {
    confirmation_id: String,
    round: u32,
    paused_at: Instant,
    /// Why the request could not be sent, if it could not.
    sent: Option<CancelReason>,
}

/// Everything an engine may do during a run.
pub struct RunContext {
    message: String,
    slot: RunSlot,
    /// Shared by every run of the server.
    settings: Arc<RunSettings>,
    log: Arc<RunLog>,
    round: u32,
    /// Fires on every reason to stop, server shutdown included.
    stop: RunStop,
    metrics: Arc<Metrics>,
    /// The run's id in the store, unique across restarts: given at start
    /// by a replica (its claim on the session), else made when the run
    /// first stores a pause (never with the memory store).
    stored_id: Option<Arc<str>>,
    /// The current pause is kept in a durable store: a shutdown suspends
    /// the run instead of cancelling it.
    pause_stored: bool,
}

/// A confirmation request, built and not yet asked.
struct Request {
    chunk: Chunk,
    checks: Arc<[TaskCheck]>,
    options: Vec<Action>,
    confirmation_id: String,
    round: u32,
    /// What the engine needs to resume from this pause (stored if durable).
    state: Option<Value>,
    expires_at: SystemTime,
}

impl RunContext {
    pub(crate) fn new(
        message: String,
        slot: RunSlot,
        settings: Arc<RunSettings>,
        log: Arc<RunLog>,
        stop: RunStop,
        metrics: Arc<Metrics>,
    ) -> RunContext {
        RunContext {
            message,
            slot,
            settings,
            log,
            round: 0,
            stop,
            metrics,
            stored_id: None,
            pause_stored: false,
        }
    }

    /// The context of a run restored from a store, at its stored round.
    pub(crate) fn restored(parts: RestoredParts) -> RunContext {
        let RestoredParts {
            message,
            slot,
            settings,
            log,
            stop,
            metrics,
            stored_id,
            round,
        } = parts;
        let mut ctx = RunContext::new(message, slot, settings, log, stop, metrics);
        ctx.stored_id = Some(stored_id);
        ctx.round = round;
        ctx
    }

    /// The run's id in the store.
    pub(crate) fn stored_id(&self) -> Option<&Arc<str>> {
        self.stored_id.as_ref()
    }

    /// Gives the run its id in the store from the start (a replica's
    /// claim on the session names it).
    pub(crate) fn with_stored_id(mut self, stored_id: Option<Arc<str>>) -> RunContext {
        self.stored_id = stored_id;
        self
    }

    /// The server's shared run settings (store, audit log, tools).
    pub(crate) fn settings_handle(&self) -> Arc<RunSettings> {
        self.settings.clone()
    }

    /// The user's chat message that started this run.
    pub fn message(&self) -> &str {
        &self.message
    }

    pub fn session_id(&self) -> &str {
        self.slot.session_id()
    }

    /// The session within its API key's namespace: what conversation state
    /// must be keyed by, so two keys using the same session id never share it.
    pub fn session_key(&self) -> &SessionKey {
        self.slot.key()
    }

    /// This run's number: unique in the process, and later runs of a
    /// session have larger ones (engines order saved turns by it).
    pub fn run_id(&self) -> u64 {
        self.slot.run_id()
    }

    pub fn settings(&self) -> &RunSettings {
        &self.settings
    }

    /// A chunk stamped with this run's session; its sequence number is given
    /// when it is sent.
    pub fn chunk(&self, chunk_type: ChunkType, text: impl Into<String>) -> Chunk {
        Chunk::new(chunk_type, text, self.slot.session_id(), 0)
    }

    /// Sends a chunk to the client (into the run's replay log; the run never
    /// waits for a slow client). Fails with `Cancelled` when the run must stop.
    pub async fn send(&mut self, chunk: Chunk) -> Result<(), RunError> {
        self.push(chunk)
    }

    fn push(&self, chunk: Chunk) -> Result<(), RunError> {
        if let Some(reason) = self.stop.reason() {
            return Err(RunError::Cancelled(reason));
        }
        self.log.push(chunk);
        Ok(())
    }

    /// Sends a chunk of `chunk_type` with `text` and no metadata.
    pub async fn emit(
        &mut self,
        chunk_type: ChunkType,
        text: impl Into<String>,
    ) -> Result<(), RunError> {
        let chunk = self.chunk(chunk_type, text);
        self.send(chunk).await
    }

    /// Waits `duration`, or less if the run must stop.
    pub async fn sleep(&self, duration: Duration) -> Result<(), RunError> {
        if duration.is_zero() {
            // tokio rounds a zero sleep up to the next 1 ms timer tick.
            return match self.stop.reason() {
                Some(reason) => Err(RunError::Cancelled(reason)),
                None => Ok(()),
            };
        }
        self.until_stopped(tokio::time::sleep(duration)).await
    }

    /// Awaits `work` unless the run must stop first (then `Cancelled`): for
    /// engines waiting on something slow, such as a model's next token.
    pub async fn until_stopped<F: Future>(&self, work: F) -> Result<F::Output, RunError> {
        if let Some(reason) = self.stop.reason() {
            return Err(RunError::Cancelled(reason));
        }
        tokio::select! {
            output = work => Ok(output),
            reason = self.stop.stopped() => Err(RunError::Cancelled(reason)),
        }
    }

    /// Puts `plan` to the user and waits for the answer: sends the
    /// `confirmation_request` chunk, pauses, and on a decision sends a
    /// `confirmation_received` chunk. Cancel, timeout, too many rounds and
    /// every other stop come back as `Err(Cancelled(reason))`.
    pub async fn confirm(&mut self, plan: Plan) -> Result<Approval, RunError> {
        // Everything but the wait happens in plain functions: this future is
        // what a paused run holds in memory for the whole pause, so it keeps
        // only what the wait needs.
        // Boxed: its state (the request, the records being written) is
        // freed before the pause, not kept in this future for all of it.
        let (pending, asked) = Box::pin(self.prepare(plan)).await?;
        let timeout = self.settings.confirm_timeout;
        let stop = async {
            match asked.sent {
                // Sending failed: the pause must still be settled, at once.
                Some(reason) => reason,
                None => self.stop.stopped().await,
            }
        };
        let decision = self.slot.wait(pending, timeout, stop).await;
        self.answered(decision, asked)
    }

    /// Everything before the wait: checks and records the proposal, builds
    /// the request, keeps the pause in a durable store, registers it and
    /// sends the request.
    async fn prepare(&mut self, plan: Plan) -> Result<(PendingDecision, Asked), RunError> {
        let (plan, confirmation_id) = self.propose(plan).await?;
        let request = self.request(plan, confirmation_id);
        self.store_pause(&request).await?;
        self.ask(request)
    }

    /// Checks the plan and records it as proposed in the audit log, if
    /// there is one: a plan that cannot be recorded is never asked.
    async fn propose(&mut self, plan: Plan) -> Result<(Plan, String), RunError> {
        if self.round >= self.settings.max_rounds {
            return Err(RunError::Cancelled(CancelReason::MaxRounds));
        }
        check_plan_size(&plan)?;
        let confirmation_id = uuid::Uuid::new_v4().to_string();
        if self.durable() && self.stored_id.is_none() {
            // Named before the first record, which then carries it.
            self.stored_id = Some(Arc::from(uuid::Uuid::new_v4().to_string()));
        }
        if let Some(audit) = &self.settings.audit {
            let mut fields =
                audit::run_fields(self.run_id(), self.session_id(), self.stored_id.as_deref());
            fields.insert(
                "key".into(),
                audit::key_label(self.session_key().owner).into(),
            );
            fields.insert(
                meta::CONFIRMATION_ID.into(),
                confirmation_id.as_str().into(),
            );
            fields.insert("round".into(), (self.round + 1).into());
            fields.insert("risk_level".into(), plan.risk_level.as_str().into());
            fields.insert(
                "tasks".into(),
                serde_json::to_value(&plan.tasks).unwrap_or_default(),
            );
            audit
                .write("proposed", fields)
                .await
                .map_err(|err| audit_failed(&err))?;
        }
        Ok((plan, confirmation_id))
    }

    /// Registers the pause and sends the `confirmation_request` chunk.
    /// Builds the confirmation request of `plan` for the next round.
    fn request(&mut self, plan: Plan, confirmation_id: String) -> Request {
        self.round += 1;
        let round = self.round;
        let timeout = self.settings.confirm_timeout;
        // The last round offers no modify: a modify there could only end
        // the run (`max_rounds`), which nobody asking for changes wants.
        let last_round = round >= self.settings.max_rounds;
        let options = if last_round {
            vec![Action::Confirm, Action::Cancel]
        } else {
            Action::ALL.to_vec()
        };

        // What a reply's per-task decisions are checked against.
        let checks: Arc<[TaskCheck]> = plan
            .tasks
            .iter()
            .map(|task| TaskCheck {
                tool: self.settings.tools.get(&task.tool).cloned(),
            })
            .collect();
        let expires_at = SystemTime::now() + timeout;
        let data = ConfirmationData {
            confirmation_id: confirmation_id.clone(),
            confirmation_round: round,
            tasks: plan.tasks,
            options: options.clone(),
            // Whole seconds, rounded up: a sub-second timeout is not "0".
            timeout_seconds: timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0),
            expires_at: humantime::format_rfc3339_seconds(expires_at).to_string(),
            risk_level: plan.risk_level,
            last_round,
        };
        let summary = if last_round && round > 1 {
            format!("{} (last round: confirm or cancel)", plan.summary)
        } else {
            plan.summary
        };
        Request {
            chunk: Chunk::confirmation_request(self.session_id(), summary, data),
            checks,
            options,
            confirmation_id,
            round,
            state: plan.state,
            expires_at,
        }
    }

    /// With a durable store and an engine that can resume, keeps the pause
    /// in the store before anything is asked: its record holds the frames a
    /// re-attach replays, the request's own included.
    async fn store_pause(&mut self, request: &Request) -> Result<(), RunError> {
        self.pause_stored = false;
        let store = &self.settings.store;
        let Some(state) = request.state.clone().filter(|_| store.is_durable()) else {
            return Ok(());
        };
        let stored_id = self
            .stored_id
            .get_or_insert_with(|| Arc::from(uuid::Uuid::new_v4().to_string()))
            .clone();
        let (mut frames, next_seq) = self.log.snapshot();
        let mut chunk = request.chunk.clone();
        chunk.sequence = next_seq;
        frames.push(String::from_utf8_lossy(&crate::sse::encode(&chunk)).into_owned());
        let Some(data) = &request.chunk.confirmation_data else {
            return Ok(());
        };
        let record = PausedRecord {
            run: stored_id.to_string(),
            namespace: self.settings.namespaces.name(self.session_key().owner),
            session_id: self.session_id().to_owned(),
            engine: self.settings.engine_name.to_owned(),
            state,
            message: self.message.clone(),
            confirmation_id: request.confirmation_id.clone(),
            round: request.round,
            options: request.options.clone(),
            tasks: data.tasks.clone(),
            expires_at_ms: request
                .expires_at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            frames,
            next_seq: next_seq + 1,
            decision: None,
        };
        store.save(record).await.map_err(|err| {
            log::error!("{err}");
            RunError::Failed {
                error_type: ErrorType::StoreUnavailable,
                message: "the store cannot keep this pause; nothing was asked".to_owned(),
            }
        })?;
        self.pause_stored = true;
        Ok(())
    }

    /// Registers the pause and sends the `confirmation_request` chunk.
    fn ask(&mut self, request: Request) -> Result<(PendingDecision, Asked), RunError> {
        let Request {
            chunk,
            checks,
            options,
            confirmation_id,
            round,
            ..
        } = request;
        let stored = self.stored_id.clone().filter(|_| self.pause_stored);
        let pending = self
            .slot
            .pause(
                confirmation_id.clone(),
                round,
                options,
                checks,
                stored,
                self.stop.token(),
            )
            .map_err(RunError::Cancelled)?;
        // The pause is registered before the chunk leaves, so a client that
        // answers the instant it reads the chunk always finds it pending.
        let sent = match self.push(chunk) {
            Err(RunError::Cancelled(reason)) => Some(reason),
            _ => None,
        };
        let asked = Asked {
            confirmation_id,
            round,
            paused_at: Instant::now(),
            sent,
        };
        Ok((pending, asked))
    }

    /// Counts the decision and, for a user's answer, sends `confirmation_received`.
    fn answered(&mut self, decision: Decision, asked: Asked) -> Result<Approval, RunError> {
        self.metrics.confirmation_waited(asked.paused_at.elapsed());
        let (action, decided_by) = match &decision {
            Decision::Confirm(_) => (Action::Confirm, "confirm"),
            Decision::Modify(_) => (Action::Modify, "modify"),
            Decision::Cancel(CancelReason::User) => (Action::Cancel, "cancel"),
            // A stored pause outlives the process: not cancelled, suspended.
            Decision::Cancel(CancelReason::Shutdown) if self.pause_stored => {
                return Err(RunError::Suspended);
            }
            Decision::Cancel(reason) => {
                self.metrics.decision(reason.as_str(), "accepted");
                return Err(RunError::Cancelled(*reason));
            }
            Decision::Failed(error_type) => {
                let message = match error_type {
                    ErrorType::AuditUnavailable => {
                        "the decision could not be recorded in the audit log; nothing was run"
                    }
                    ErrorType::StoreUnavailable => {
                        "the decision could not be recorded in the store; nothing was run"
                    }
                    _ => "internal error",
                };
                return Err(RunError::Failed {
                    error_type: *error_type,
                    message: message.to_owned(),
                });
            }
        };
        self.metrics.decision(decided_by, "accepted");
        let round = asked.round;
        let decisions = match &decision {
            Decision::Confirm(decisions) => Some(decisions),
            _ => None,
        };
        let received = Chunk::confirmation_received(
            self.session_id(),
            format!("Received {} for round {round}", action.as_str()),
            action,
            &asked.confirmation_id,
            round,
            decisions,
        );
        // Written even if the run was told to stop meanwhile: this decision
        // was acknowledged to a reply before the stop (later replies are
        // refused), so the stream shows it; the stop ends the run next.
        self.log.push(received);
        match decision {
            Decision::Confirm(decisions) => Ok(Approval::Confirm(decisions)),
            Decision::Modify(text) => Ok(Approval::Modify(text)),
            Decision::Cancel(reason) => Err(RunError::Cancelled(reason)),
            Decision::Failed(error_type) => Err(RunError::Failed {
                error_type,
                message: "internal error".to_owned(),
            }),
        }
    }

    /// Registers again the pause of a run restored from a store (its
    /// record is `record`): from here on a reply may decide it.
    pub(crate) fn restore_pause(
        &mut self,
        record: &PausedRecord,
    ) -> Result<PendingDecision, RunError> {
        let checks: Arc<[TaskCheck]> = record
            .tasks
            .iter()
            .map(|task| TaskCheck {
                tool: self.settings.tools.get(&task.tool).cloned(),
            })
            .collect();
        let pending = self
            .slot
            .pause(
                record.confirmation_id.clone(),
                record.round,
                record.options.clone(),
                checks,
                self.stored_id.clone(),
                self.stop.token(),
            )
            .map_err(RunError::Cancelled)?;
        self.pause_stored = true;
        Ok(pending)
    }

    /// Waits on a restored pause (see [`RunContext::restore_pause`]) with
    /// the time it has left, and takes its decision as
    /// [`RunContext::confirm`] would.
    pub(crate) async fn resume_pause(
        &mut self,
        pending: PendingDecision,
        record: &PausedRecord,
    ) -> Result<Approval, RunError> {
        let now_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let left = Duration::from_millis(record.expires_at_ms.saturating_sub(now_ms));
        let asked = Asked {
            confirmation_id: record.confirmation_id.clone(),
            round: record.round,
            paused_at: Instant::now(),
            sent: None,
        };
        let stop = async { self.stop.stopped().await };
        let decision = self.slot.wait(pending, left, stop).await;
        self.answered(decision, asked)
    }

    /// Whether pauses are kept in a durable store (`--store`): only then is
    /// [`Plan::state`] used, so an engine may skip building it otherwise.
    pub fn durable(&self) -> bool {
        self.settings.store.is_durable()
    }

    /// The declared tools (`--tools`).
    pub fn tools(&self) -> &Arc<Tools> {
        &self.settings.tools
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
            let mut fields =
                audit::run_fields(self.run_id(), self.session_id(), self.stored_id.as_deref());
            fields.insert("tool".into(), tool.into());
            fields.insert("args".into(), args.cloned().unwrap_or(Value::Null));
            fields.insert("ok".into(), outcome.ok.into());
            if let Some(code) = outcome.exit_status {
                fields.insert("exit_status".into(), code.into());
            }
            if let Some(status) = outcome.http_status {
                fields.insert("http_status".into(), status.into());
            }
            fields.insert("duration_ms".into(), outcome.duration_ms.into());
            fields.insert("output_bytes".into(), outcome.output_bytes.into());
            let output = outcome
                .result
                .as_deref()
                .or(outcome.error.as_deref())
                .unwrap_or("");
            fields.insert("output_sha256".into(), sha256_hex(output.as_bytes()).into());
            audit
                .write("executed", fields)
                .await
                .map_err(|err| audit_failed(&err))?;
        }
        Ok(())
    }

    /// The run's metrics, for the driver that ends it.
    pub(crate) fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The run's registry slot and log, for the driver that ends it.
    pub(crate) fn into_parts(self) -> (RunSlot, Arc<RunLog>) {
        (self.slot, self.log)
    }
}

/// Ends the run with `audit_unavailable` (the details were logged).
fn audit_failed(err: &crate::audit::AuditError) -> RunError {
    RunError::Failed {
        error_type: ErrorType::AuditUnavailable,
        message: format!("{err}; nothing more runs"),
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Refuses a plan larger than a paused run may hold: more than
/// [`MAX_PLAN_TASKS`] tasks, or more than [`MAX_CONFIRMATION_BYTES`] of tasks
/// and summary as JSON.
fn check_plan_size(plan: &Plan) -> Result<(), RunError> {
    let tasks = plan.tasks.len();
    if tasks > MAX_PLAN_TASKS {
        return Err(RunError::Failed {
            error_type: ErrorType::PlanTooLarge,
            message: format!(
                "the plan has {tasks} tasks; at most {MAX_PLAN_TASKS} can be confirmed"
            ),
        });
    }
    let bytes = plan.summary.len() + json_len(&plan.tasks);
    if bytes > MAX_CONFIRMATION_BYTES {
        return Err(RunError::Failed {
            error_type: ErrorType::PlanTooLarge,
            message: format!(
                "the plan is {bytes} bytes; at most {MAX_CONFIRMATION_BYTES} can be confirmed"
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::confirmation::{ConfirmationManager, RunLimits, SessionKey};
    use crate::run::log::LogLimits;

    /// A paused run holds its `confirm` future for the whole pause, once per
    /// paused run: it must stay small (it was 1,184 bytes when the request
    /// was built inside it; docs/benchmarks.md has what that cost).
    #[tokio::test]
    async fn the_future_a_paused_run_holds_stays_small() {
        let manager = ConfirmationManager::new();
        let slot = manager
            .begin_run(SessionKey::new(None, "s"), RunLimits::total(1))
            .unwrap();
        let stop = RunStop::default();
        let settings = Arc::new(RunSettings {
            confirm_timeout: Duration::from_secs(1),
            max_rounds: 1,
            ..RunSettings::default()
        });
        let limits = LogLimits {
            frames: 8,
            bytes: 1 << 20,
        };
        let log = RunLog::new(limits, stop.clone());
        let mut ctx = RunContext::new("a".into(), slot, settings, log, stop, Arc::default());
        let plan = Plan {
            summary: String::new(),
            tasks: Vec::new(),
            risk_level: RiskLevel::Low,
            state: None,
        };

        let paused = ctx.confirm(plan);

        let size = std::mem::size_of_val(&paused);
        println!("confirm() future is {size} bytes");
        assert!(size <= 768, "confirm() future is {size} bytes");
    }
}
