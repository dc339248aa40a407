//! Asking: a plan checked, recorded as proposed, kept in a durable store,
//! registered as a pause and sent as a `confirmation_request`; then the
//! decision read back as an [`Approval`] (every stop as `Cancelled`).

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::{audit_failed, RunContext};
use crate::audit::AuditRecord;
use crate::confirmation::decisions::TaskCheck;
use crate::confirmation::slot::PendingDecision;
use crate::confirmation::Decision;
use crate::protocol::{
    json_len, Action, CancelReason, Chunk, ConfirmationData, ErrorType, PauseKind,
    MAX_CONFIRMATION_BYTES, MAX_PLAN_TASKS,
};
use crate::run::outcome::RunError;
use crate::run::plan::{Approval, Plan};
use crate::store::{Fault, PausedRecord, StoredDecision};

/// A confirmation request on its way to a decision.
struct Asked {
    confirmation_id: String,
    round: u32,
    paused_at: Instant,
    /// Why the request could not be sent, if it could not.
    sent: Option<CancelReason>,
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
        self.log.pause_ended();
        // Boxed, like `prepare`: a store call does not grow every pause.
        let decision = Box::pin(self.record_fallback(decision, &asked.confirmation_id)).await?;
        self.answered(decision, asked)
    }

    /// A stored pause decided by the run's own fallback (its timeout): the
    /// decision is recorded as a reply's is, so that an ended pause never
    /// comes back; and if another replica owns the run now (this one's
    /// lease lapsed), the copy here is handed over rather than ended.
    async fn record_fallback(
        &self,
        decision: Decision,
        confirmation_id: &str,
    ) -> Result<Decision, RunError> {
        let Decision::Cancel(reason) = decision else {
            return Ok(decision);
        };
        // A reply's cancel and a supersede were recorded by their taker; a
        // shutdown keeps the pause for the next process.
        let decided_elsewhere = matches!(
            reason,
            CancelReason::User | CancelReason::Superseded | CancelReason::Shutdown
        );
        let Some(run) = self.stored_id.as_ref().filter(|_| self.pause_stored) else {
            return Ok(decision);
        };
        if decided_elsewhere {
            return Ok(decision);
        }
        let recorded = StoredDecision::new(Action::Cancel, confirmation_id, None, Some(reason));
        match self
            .settings
            .store
            .record_decision(run, self.session_key(), &recorded)
            .await
        {
            Err(err) if err.fault == Fault::Moved => {
                log::info!("{err}: the paused run is handed to its new owner");
                Err(RunError::Suspended)
            }
            // It ends here as decided; a restore finds its pause expired.
            Err(err) => {
                log::warn!("{err}");
                Ok(decision)
            }
            Ok(()) => Ok(decision),
        }
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
            let record = AuditRecord::Proposed {
                run: self.audit_fields(),
                key: crate::session::owner_label(self.session_key().owner),
                confirmation_id: confirmation_id.clone(),
                round: self.round + 1,
                risk_level: plan.risk_level,
                tasks: plan.tasks.clone(),
            };
            audit
                .write(&record)
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
        let checks = TaskCheck::of(&plan.tasks, &self.settings.tools);
        let expires_at = SystemTime::now() + timeout;
        let data = ConfirmationData {
            kind: PauseKind::Approval,
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
            ended: None,
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
        // answers the instant it reads the chunk always finds it pending;
        // and the log knows it, so a client that leaves ends nothing.
        self.log.pause_started();
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
            Decision::Failed(error_type) => return Err(RunError::unacted(*error_type)),
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
            Decision::Failed(error_type) => Err(RunError::unacted(error_type)),
        }
    }

    /// Registers again the pause of a run restored from a store (its
    /// record is `record`): from here on a reply may decide it.
    pub(crate) fn restore_pause(
        &mut self,
        record: &PausedRecord,
    ) -> Result<PendingDecision, RunError> {
        let checks = TaskCheck::of(&record.tasks, &self.settings.tools);
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
        self.log.pause_started();
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
        self.log.pause_ended();
        let decision = Box::pin(self.record_fallback(decision, &asked.confirmation_id)).await?;
        self.answered(decision, asked)
    }
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
