//! A plan put to the user, as a run asks it (what it asks is checked in
//! `crate::pause::approval`): checked against the bounds of a paused run
//! and its rounds, recorded as proposed, built into a
//! `confirmation_request` (each task's checks, its timeout, its timers);
//! its decision acknowledged with `confirmation_received` and turned into
//! an [`Approval`], a grant it carries kept first.

use std::sync::Arc;
use std::time::SystemTime;

use crate::confirmation::slot::PendingDecision;
use crate::confirmation::Decision;
use crate::pause::approval::response_schema;
use crate::pause::Asking;
use crate::protocol::Schema;
use crate::protocol::{
    json_len, Action, CancelReason, Chunk, ConfirmationData, DecisionKind, ErrorType, Given,
    PauseKind, TaskSpec, TaskState, MAX_CONFIRMATION_BYTES, MAX_PLAN_TASKS,
};
use crate::run::context::asked::{Asked, Open, Received, Request};
use crate::run::context::pause::{timeout_seconds, Kind};
use crate::run::context::RunContext;
use crate::run::journal::PauseEvent;
use crate::run::outcome::RunError;
use crate::run::plan::{Approval, Plan, Resumed};

impl Kind for Plan {
    type Answer = Approval;
    type Wire = ConfirmationData;

    /// `None`: nothing in the plan needs a yes, so nothing is asked.
    async fn request(self, ctx: &mut RunContext) -> Result<Option<Request>, RunError> {
        if self.tasks.iter().all(|task| task.approved_by.is_some()) {
            return Ok(None);
        }
        // Its size is the plan's own: a preview has its own bounds.
        check_plan_size(&self)?;
        let mut plan = self;
        if ctx.previews_asked(&plan.tasks) {
            Box::pin(ctx.preview_tasks(&mut plan.tasks)).await;
        }
        let (plan, confirmation_id) = ctx.propose(plan).await?;
        Ok(Some(ctx.request(plan, confirmation_id)))
    }

    /// A confirm's grant is kept (in the store, on the record) before the
    /// run goes on.
    async fn take(
        ctx: &mut RunContext,
        decision: Decision,
        asked: Asked,
    ) -> Result<Approval, RunError> {
        let approval = ctx.answered(decision, asked)?;
        if let Some(grant) = ctx.pending_grant.take() {
            Box::pin(ctx.keep_grant(*grant)).await?;
        }
        Ok(approval)
    }

    fn received(decided: &Received<'_>) -> Chunk {
        Chunk::confirmation_received(
            decided.session_id,
            format!("Received {}", decided.action.as_str()),
            decided.action,
            decided.confirmation_id,
            decided.round,
            decided.given.and_then(Given::decisions),
        )
        .with_approvers(decided.approved_by)
    }

    fn restore_asking(ctx: &mut RunContext, tasks: &Vec<TaskSpec>) -> Asking {
        ctx.note_previews(tasks);
        Asking::Plan(Arc::new(ctx.plan_check(tasks)))
    }

    /// Its tasks go on being decided one by one, its timers running.
    async fn wait_restored(
        ctx: &mut RunContext,
        pending: PendingDecision,
        asked: Asked,
    ) -> Result<Resumed, RunError> {
        let open = Open {
            pending,
            asked,
            timers: None,
        };
        Box::pin(ctx.wait_plan(open)).await.map(Resumed::Approval)
    }

    async fn take_decided(
        ctx: &mut RunContext,
        decision: Decision,
        asked: Asked,
    ) -> Result<Resumed, RunError> {
        ctx.settled(Self::KIND, &decision, &asked)?;
        Plan::take(ctx, decision, asked)
            .await
            .map(Resumed::Approval)
    }
}

impl RunContext {
    /// Checks the plan and records it as proposed in the audit log, if
    /// there is one: a plan that cannot be recorded is never asked.
    async fn propose(&mut self, plan: Plan) -> Result<(Plan, String), RunError> {
        if self.round >= self.settings.max_rounds {
            return Err(RunError::Cancelled(CancelReason::MaxRounds));
        }
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
        self.anchor_calls(&confirmation_id);
        Ok((plan, confirmation_id))
    }

    /// Registers the pause and sends the `confirmation_request` chunk.
    /// Builds the confirmation request of `plan` for the next round.
    fn request(&mut self, plan: Plan, confirmation_id: String) -> Request {
        self.round += 1;
        let round = self.round;
        // Each task a decision of its own, named for the round.
        let mut plan = plan;
        for task in &mut plan.tasks {
            task.task_id = Some(format!("{confirmation_id}-t{}", task.index));
        }
        self.note_previews(&plan.tasks);
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
        // which decisions it takes (and the schema of one), where it
        // stands, until when, and how many must approve it.
        let expires_at = asked_at + timeout;
        for (task, check) in plan.tasks.iter_mut().zip(checks.tasks.iter()) {
            task.simulated = check.tool.is_none();
            task.decisions = DecisionKind::for_task(check.tool.is_some());
            task.state = Some(TaskState::Pending);
            task.expires_at = Some(crate::clock::rfc3339(asked_at + self.task_timeout(check)));
            task.required = (check.gate.approvals > 1).then_some(usize::from(check.gate.approvals));
            task.approvals = task.required.map(|_| Vec::new());
            task.response_schema = Some(Schema::of(&response_schema(check, &task.decisions)));
        }
        let quorum = crate::pause::plan_check::Quorum::of(&checks);
        let escalation = checks
            .tasks
            .iter()
            .filter_map(|task| task.gate.escalate.clone())
            .min_by_key(|escalation| escalation.after);
        let data = ConfirmationData {
            kind: PauseKind::Approval,
            confirmation_id: confirmation_id.clone(),
            confirmation_round: round,
            tasks: plan.tasks,
            options: options.clone(),
            timeout_seconds: timeout_seconds(timeout),
            expires_at: crate::clock::rfc3339(expires_at),
            risk_level: plan.risk_level,
            last_round,
            required: quorum.required,
            approvers: quorum.groups,
            on_timeout: rejects_on_timeout.is_some().then(|| "reject".to_owned()),
            escalate_to: escalation.as_ref().map(|e| e.to.clone()),
            escalates_at: escalation.map(|e| crate::clock::rfc3339(asked_at + e.after)),
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
            frame: None,
        }
    }

    /// Takes the decision of a plan and sends `confirmation_received`.
    fn answered(&mut self, decision: Decision, asked: Asked) -> Result<Approval, RunError> {
        let action = match &decision {
            Decision::Confirm(..) => Action::Confirm,
            Decision::Modify(_) => Action::Modify,
            Decision::Cancel(_) => Action::Cancel,
            Decision::TimedOut(_) => Action::TimeoutReject,
            // Not offered on a plan: the manager never takes it.
            _ => return Err(RunError::unacted(ErrorType::Internal)),
        };
        let round = asked.round;
        let decisions = match &decision {
            Decision::Confirm(decisions, _) | Decision::TimedOut(decisions) => Some(decisions),
            _ => None,
        };
        let text = match action {
            Action::TimeoutReject => format!(
                "No answer in time for round {round}: every task is rejected (on_timeout = \
                 reject)"
            ),
            _ => format!("Received {} for round {round}", action.as_str()),
        };
        let received = Chunk::confirmation_received(
            self.session_id(),
            text,
            action,
            &asked.confirmation_id,
            round,
            decisions,
        );
        // Written even if the run was told to stop meanwhile: this decision
        // was acknowledged to a reply before the stop (later replies are
        // refused), so the stream shows it; the stop ends the run next.
        self.replay.push(received);
        match decision {
            Decision::Confirm(decisions, grant) => {
                // Kept by the caller before the run goes on (`keep_grant`).
                self.pending_grant = grant.map(|grant| Box::new((*grant, asked.confirmation_id)));
                Ok(Approval::Confirm(decisions))
            }
            Decision::TimedOut(decisions) => Ok(Approval::Confirm(decisions)),
            Decision::Modify(text) => Ok(Approval::Modify(text)),
            _ => Err(RunError::Cancelled(CancelReason::User)),
        }
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
