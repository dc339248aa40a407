//! Asking: a plan checked, recorded as proposed, kept in a durable store,
//! registered as a pause and sent as a `confirmation_request`; then the
//! decision read back as an [`Approval`] (every stop as `Cancelled`).
//! Questions take the same path: checked, recorded as asked, kept, sent as
//! an `input_request`, read back as [`Answers`].

use crate::run::journal::{Pause, PauseEvent};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use super::asked::{Asked, Request};
use super::RunContext;
use crate::confirmation::slot::{PauseSpec, PendingDecision};
use crate::confirmation::Decision;
use crate::pause::Asking;
use crate::protocol::question::{check_questions, MAX_QUESTION_CHARS};
use crate::protocol::{
    json_len, Action, CancelReason, Chunk, ConfirmationData, DecisionKind, ErrorType, PauseData,
    PauseKind, QuestionData, MAX_CONFIRMATION_BYTES, MAX_PLAN_TASKS,
};
use crate::run::outcome::RunError;
use crate::run::plan::{Answers, Approval, Plan, Questions};
use crate::session::RunTag;
use crate::store::PausedRecord;

impl RunContext {
    /// Puts `plan` to the user and waits for the answer: sends the
    /// `confirmation_request` chunk, pauses, and on a decision sends a
    /// `confirmation_received` chunk. Cancel, timeout, too many rounds and
    /// every other stop come back as `Err(Cancelled(reason))`. A plan
    /// with nothing that needs a yes (no task, or every task allowed by a
    /// rule or a grant: `approved_by`) pauses nowhere: it is confirmed as
    /// it is.
    pub async fn confirm(&mut self, plan: Plan) -> Result<Approval, RunError> {
        // Everything but the wait happens in plain functions: this future is
        // what a paused run holds in memory for the whole pause, so it keeps
        // only what the wait needs.
        // Boxed: its state (the request, the records being written) is
        // freed before the pause, not kept in this future for all of it.
        let Some((pending, asked)) = Box::pin(self.prepare(plan)).await? else {
            return Ok(Approval::Confirm(crate::protocol::Decisions::default()));
        };
        let decision = self.wait_for(pending, &asked).await?;
        self.approval(decision, asked).await
    }

    /// Puts `questions` to the user and waits for the answer: sends the
    /// `input_request` chunk, pauses, and on an answer or a skip sends a
    /// `confirmation_received` chunk. Cancel, timeout and every other stop
    /// come back as `Err(Cancelled(reason))`.
    pub async fn ask(&mut self, questions: Questions) -> Result<Answers, RunError> {
        let (pending, asked) = Box::pin(self.prepare_questions(questions)).await?;
        let decision = self.wait_for(pending, &asked).await?;
        self.questions_answered(decision, asked)
    }

    /// Waits for the decision of a registered pause: a reply, or the run's
    /// own fallback (its timeout, a stop), recorded when the pause is stored.
    pub(super) async fn wait_for(
        &mut self,
        pending: PendingDecision,
        asked: &Asked,
    ) -> Result<Decision, RunError> {
        let timeout = asked.timeout;
        let stop = async {
            match asked.sent {
                // Sending failed: the pause must still be settled, at once.
                Some(reason) => reason,
                None => self.stop.stopped().await,
            }
        };
        let timers = asked
            .timers
            .as_deref()
            .map(|timers| self.start_timers(timers, &asked.confirmation_id));
        let decision = self.slot.wait(pending, timeout, stop).await;
        if let Some(timers) = timers {
            timers.abort();
        }
        self.log.pause_ended();
        // Boxed, like `prepare`: a store call does not grow every pause.
        let decision = Box::pin(self.record_fallback(decision, &asked.confirmation_id)).await?;
        Ok(self.silence(decision, asked.rejects_on_timeout.as_deref()))
    }

    /// Everything before the wait: checks and records the proposal, builds
    /// the request, keeps the pause in a durable store, registers it and
    /// sends the request.
    /// `None`: nothing in the plan needs a yes, so nothing is asked.
    async fn prepare(&mut self, plan: Plan) -> Result<Option<(PendingDecision, Asked)>, RunError> {
        if plan.tasks.iter().all(|task| task.approved_by.is_some()) {
            return Ok(None);
        }
        let (plan, confirmation_id) = self.propose(plan).await?;
        let request = self.request(plan, confirmation_id);
        self.store_pause(&request).await?;
        self.put(request).map(Some)
    }

    /// [`RunContext::prepare`] for questions: checked against their
    /// bounds, recorded as asked, kept, registered and sent.
    async fn prepare_questions(
        &mut self,
        questions: Questions,
    ) -> Result<(PendingDecision, Asked), RunError> {
        let Questions {
            title,
            questions,
            state,
        } = questions;
        check_questions(&questions).map_err(|err| RunError::Failed {
            error_type: ErrorType::InvalidQuestions,
            message: format!("the questions cannot be asked: {err}"),
        })?;
        let title = match title.trim() {
            "" => "Questions for you".to_owned(),
            title => title.chars().take(MAX_QUESTION_CHARS).collect(),
        };
        let confirmation_id = uuid::Uuid::new_v4().to_string();
        if self.durable() && self.stored_id.is_none() {
            self.stored_id = Some(Arc::from(uuid::Uuid::new_v4().to_string()));
        }
        let asked = PauseEvent::Asked {
            confirmation_id: &confirmation_id,
            title: &title,
            questions: &questions,
        };
        self.audit_first(asked).await?;
        let timeout = self.settings.confirm_timeout;
        let expires_at = SystemTime::now() + timeout;
        let options = Action::QUESTION.to_vec();
        let data = QuestionData {
            kind: PauseKind::Question,
            confirmation_id: confirmation_id.clone(),
            title,
            questions: questions.clone(),
            options: options.clone(),
            timeout_seconds: timeout_seconds(timeout),
            expires_at: humantime::format_rfc3339_seconds(expires_at).to_string(),
        };
        let request = Request {
            chunk: Chunk::input_request(self.session_id(), data),
            asking: Asking::Questions(questions.into()),
            options,
            confirmation_id,
            // Questions are not a round of the plan: the round stays.
            round: self.round,
            state,
            expires_at,
            timeout: self.settings.confirm_timeout,
            rejects_on_timeout: None,
            timers: None,
        };
        self.store_pause(&request).await?;
        self.put(request)
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
        let proposed = PauseEvent::Proposed {
            confirmation_id: &confirmation_id,
            round: self.round + 1,
            risk_level: plan.risk_level,
            tasks: &plan.tasks,
        };
        self.audit_first(proposed).await?;
        Ok((plan, confirmation_id))
    }

    /// Registers the pause and sends the `confirmation_request` chunk.
    /// Builds the confirmation request of `plan` for the next round.
    fn request(&mut self, plan: Plan, confirmation_id: String) -> Request {
        self.round += 1;
        let round = self.round;
        let checks = self.plan_check(&plan.tasks);
        let (timeout, rejects_on_timeout) = self.waiting_of(&checks);
        let asked_at = SystemTime::now();
        let timers = self.timers_of(&checks, asked_at, None);
        // The last round offers no modify: a modify there could only end
        // the run (`max_rounds`), which nobody asking for changes wants.
        let last_round = round >= self.settings.max_rounds;
        let options = if last_round {
            vec![Action::Confirm, Action::Cancel]
        } else {
            Action::ALL.to_vec()
        };

        // What a reply's per-task decisions are checked against (`checks`),
        // and what each task says of itself: whether a real tool runs it,
        // and which decisions it takes.
        let mut plan = plan;
        for (task, check) in plan.tasks.iter_mut().zip(checks.tasks.iter()) {
            task.simulated = check.tool.is_none();
            task.decisions = DecisionKind::for_task(check.tool.is_some());
        }
        let expires_at = asked_at + timeout;
        let data = ConfirmationData {
            kind: PauseKind::Approval,
            confirmation_id: confirmation_id.clone(),
            confirmation_round: round,
            tasks: plan.tasks,
            options: options.clone(),
            timeout_seconds: timeout_seconds(timeout),
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
            asking: Asking::Plan(Arc::new(checks)),
            options,
            confirmation_id,
            round,
            state: plan.state,
            expires_at,
            timeout,
            rejects_on_timeout,
            timers,
        }
    }

    /// With a durable store and an engine that can resume, keeps the pause
    /// in the store before anything is asked: its record holds the frames a
    /// re-attach replays, the request's own included. A store replicas
    /// share keeps a pause that cannot be resumed too (its record
    /// [`PausedRecord::in_memory`]), so that it is listed, found and
    /// decided from any replica.
    async fn store_pause(&mut self, request: &Request) -> Result<(), RunError> {
        self.pause_stored = false;
        let kind = request.asking.kind();
        let events = match self.settings.webhooks {
            Some(_) => {
                let requested = PauseEvent::Requested {
                    pause: Pause {
                        confirmation_id: &request.confirmation_id,
                        kind,
                    },
                    data: serde_json::to_value(&request.chunk.confirmation_data)
                        .unwrap_or_default(),
                    summary: &request.chunk.chunk,
                    links: self.links_of(request),
                    slack: self.slack_of(request),
                    mail_to: self.mails_of(request),
                };
                self.settings
                    .journal()
                    .pause(self.subject(), requested)
                    .events
            }
            None => Vec::new(),
        };
        if self.settings.webhooks.is_some() {
            self.last_pause = Some(Box::new((request.confirmation_id.clone(), kind)));
        }
        let store = &self.settings.store;
        let (state, in_memory) = match request.state.clone() {
            Some(state) if store.is_durable() => (state, false),
            _ if store.indexes_every_pause() => (Value::Null, true),
            _ => {
                self.settings.announce(&events).await;
                return Ok(());
            }
        };
        let stored_id = self
            .stored_id
            .get_or_insert_with(|| Arc::from(uuid::Uuid::new_v4().to_string()))
            .clone();
        let (mut frames, next_seq) = self.log.snapshot();
        let mut chunk = request.chunk.clone();
        chunk.sequence = next_seq;
        frames.push(String::from_utf8_lossy(&crate::sse::encode(&chunk)).into_owned());
        let (tasks, title, questions) = match &request.chunk.confirmation_data {
            Some(PauseData::Approval(data)) => (data.tasks.clone(), String::new(), Vec::new()),
            Some(PauseData::Question(data)) => {
                (Vec::new(), data.title.clone(), data.questions.clone())
            }
            None => return Ok(()),
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
            tasks,
            kind: request.asking.kind(),
            title,
            questions,
            expires_at_ms: unix_ms(request.expires_at),
            asked_at_ms: unix_ms(SystemTime::now()),
            frames,
            next_seq: next_seq + 1,
            decision: None,
            ended: None,
            in_memory,
            progress: None,
        };
        let (key, run_id) = (self.session_key().clone(), self.run_id());
        store.save(record, &events).await.map_err(|err| {
            log::error!("{}: {err}", RunTag::of(&key, run_id));
            RunError::Failed {
                error_type: ErrorType::StoreUnavailable,
                message: "the store cannot keep this pause; nothing was asked".to_owned(),
            }
        })?;
        self.settings.wake_sender(&events);
        self.pause_stored = true;
        Ok(())
    }

    /// Registers the pause and sends its request chunk.
    fn put(&mut self, request: Request) -> Result<(PendingDecision, Asked), RunError> {
        let Request {
            chunk,
            asking,
            options,
            confirmation_id,
            round,
            expires_at,
            timeout,
            rejects_on_timeout,
            timers,
            ..
        } = request;
        let stored = self.stored_id.clone().filter(|_| self.pause_stored);
        let spec = PauseSpec {
            confirmation_id: confirmation_id.clone(),
            round,
            options,
            asking,
            stored,
            asked_at: SystemTime::now(),
            expires_at,
            approvals: Vec::new(),
            escalated_to: None,
        };
        let pending = self
            .slot
            .pause(spec, self.stop.token())
            .map_err(RunError::Cancelled)?;
        // The pause is registered before the chunk leaves, so a client that
        // answers the instant it reads the chunk always finds it pending;
        // and the log knows it, so a client that leaves ends nothing.
        self.log.pause_started();
        self.log.note_pause(&confirmation_id);
        let sent = match self.push(chunk) {
            Err(RunError::Cancelled(reason)) => Some(reason),
            _ => None,
        };
        let asked = Asked {
            confirmation_id,
            round,
            paused_at: Instant::now(),
            sent,
            timeout,
            rejects_on_timeout,
            timers,
        };
        Ok((pending, asked))
    }

    /// Counts the decision of a pause of `kind`; a stop, a timeout or a
    /// failure ends the run here (`Err`), a reply goes on (`Ok`).
    fn settled(
        &mut self,
        kind: PauseKind,
        decision: &Decision,
        asked: &Asked,
    ) -> Result<(), RunError> {
        self.metrics.confirmation_waited(asked.paused_at.elapsed());
        let outcome = match decision {
            Decision::Confirm(..) => Action::Confirm.as_str(),
            Decision::Modify(_) => Action::Modify.as_str(),
            Decision::Answer(_) => Action::Answer.as_str(),
            Decision::Skip => Action::Skip.as_str(),
            Decision::Cancel(CancelReason::User) => Action::Cancel.as_str(),
            Decision::Cancel(reason) => reason.as_str(),
            Decision::Failed(error_type) => return Err(RunError::unacted(*error_type)),
        };
        if let Decision::Cancel(CancelReason::Shutdown) = decision {
            // A stored pause outlives the process: not cancelled, suspended.
            if self.pause_stored {
                return Err(RunError::Suspended);
            }
        }
        self.metrics.pause_ended(kind, outcome);
        if kind == PauseKind::Approval {
            self.metrics.decision(outcome, "accepted");
        }
        match decision {
            Decision::Cancel(reason) if *reason != CancelReason::User => {
                Err(RunError::Cancelled(*reason))
            }
            _ => Ok(()),
        }
    }

    /// Takes the decision of a plan and, for a user's reply, sends
    /// `confirmation_received`.
    pub(super) fn answered(
        &mut self,
        decision: Decision,
        asked: Asked,
    ) -> Result<Approval, RunError> {
        self.settled(PauseKind::Approval, &decision, &asked)?;
        let action = match &decision {
            Decision::Confirm(..) => Action::Confirm,
            Decision::Modify(_) => Action::Modify,
            Decision::Cancel(_) => Action::Cancel,
            // Not offered on a plan: the manager never takes it.
            _ => return Err(RunError::unacted(ErrorType::Internal)),
        };
        let round = asked.round;
        let decisions = match &decision {
            Decision::Confirm(decisions, _) => Some(decisions),
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
            Decision::Confirm(decisions, grant) => {
                // Kept by the caller before the run goes on (`keep_grant`).
                self.pending_grant = grant.map(|grant| Box::new((*grant, asked.confirmation_id)));
                Ok(Approval::Confirm(decisions))
            }
            Decision::Modify(text) => Ok(Approval::Modify(text)),
            _ => Err(RunError::Cancelled(CancelReason::User)),
        }
    }

    /// Takes the reply to questions and sends `confirmation_received` with
    /// the answers (as [`RunContext::answered`] does for a plan).
    pub(super) fn questions_answered(
        &mut self,
        decision: Decision,
        asked: Asked,
    ) -> Result<Answers, RunError> {
        self.settled(PauseKind::Question, &decision, &asked)?;
        let (action, answers) = match decision {
            Decision::Answer(answers) => (Action::Answer, Answers::Given(answers)),
            Decision::Skip => (Action::Skip, Answers::Skipped),
            Decision::Cancel(_) => (Action::Cancel, Answers::Skipped),
            // Not offered on questions: the manager never takes it.
            _ => return Err(RunError::unacted(ErrorType::Internal)),
        };
        let given = match &answers {
            Answers::Given(given) => Some(given),
            Answers::Skipped => None,
        };
        let received = Chunk::questions_answered(
            self.session_id(),
            format!("Received {}", action.as_str()),
            action,
            &asked.confirmation_id,
            given,
        );
        // Written even after a stop, as for a plan (see `answered`).
        self.log.push(received);
        match action {
            Action::Cancel => Err(RunError::Cancelled(CancelReason::User)),
            _ => Ok(answers),
        }
    }
}

use crate::clock::ms as unix_ms;

/// Whole seconds of `timeout`, rounded up: a sub-second timeout is not "0".
fn timeout_seconds(timeout: Duration) -> u64 {
    timeout.as_secs() + u64::from(timeout.subsec_nanos() > 0)
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
