//! A call a crash cut short, put to a person (#44; what a reply may be is
//! checked in `crate::pause::reconcile`): audited before it is asked,
//! built into an `input_request` of kind `reconcile` (the task, its
//! idempotency key, when its attempt started), decided as the task's
//! approval was; `run_again`, `skip` or `cancel` acknowledged with
//! `confirmation_received`.
//!
//! It is not stored as a pause: the run's record keeps its decided plan,
//! and the journal entry of the call (started, never finished, and the
//! deadline it was asked with) is what asks it again after another
//! restart, with the same `confirmation_id` and deadline. `run_again` is
//! recorded by the next attempt's `started`, `skip` by the entry's
//! `finished`, before the run acts on either.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::confirmation::slot::PendingDecision;
use crate::confirmation::Decision;
use crate::pause::Asking;
use crate::protocol::{
    Action, CancelReason, Chunk, ErrorType, PauseKind, ReconcileData, RiskLevel, TaskSpec,
};
use crate::run::context::asked::{Asked, Received, Request};
use crate::run::context::pause::{timeout_seconds, Kind};
use crate::run::context::RunContext;
use crate::run::journal::PauseEvent;
use crate::run::outcome::RunError;
use crate::run::plan::Resumed;
use crate::store::CallEntry;
use crate::tools::Tool;

/// Whether a call a crash cut short took effect, as a run asks it.
pub(in crate::run::context) struct Reconcile {
    pub(in crate::run::context) task: TaskSpec,
    pub(in crate::run::context) entry: CallEntry,
}

/// What a person chose.
pub(in crate::run::context) enum Reconciled {
    /// Call it again with the same key.
    RunAgain,
    /// Record it as not run.
    Skip,
}

impl Reconcile {
    /// The call of `entry` (task `tool` with `args`) put to a person.
    pub(in crate::run::context) fn of(
        tool: &Tool,
        args: &serde_json::Value,
        entry: CallEntry,
    ) -> Reconcile {
        let task = TaskSpec {
            index: entry.index,
            description: format!("{} (cut short by a restart)", tool.name),
            tool: tool.name.clone(),
            args: Some(args.clone()),
            risk_level: Some(tool.risk),
            ..TaskSpec::default()
        };
        Reconcile { task, entry }
    }
}

impl Kind for Reconcile {
    type Answer = Reconciled;
    type Wire = ReconcileData;
    const STORED: bool = false;

    async fn request(self, ctx: &mut RunContext) -> Result<Option<Request>, RunError> {
        let Reconcile { task, mut entry } = self;
        let confirmation_id = pause_id(&entry);
        let started_at = crate::clock::rfc3339_ms(entry.started_at_ms);
        // Asked before (and kept): its deadline stands across restarts.
        let now = SystemTime::now();
        let expires_at = match entry.asked_until_ms {
            Some(ms) => crate::clock::at(ms),
            None => now + ctx.settings.confirm_timeout,
        };
        let asked = PauseEvent::Reconciling {
            confirmation_id: &confirmation_id,
            task: &task,
            idempotency_key: &entry.key,
            started_at: &started_at,
            attempt: entry.attempt,
        };
        ctx.audit_first(asked).await?;
        if entry.asked_until_ms.is_none() {
            entry.asked_until_ms = Some(crate::clock::ms(expires_at));
            ctx.keep_entry(&entry).await?;
        }
        let checks = ctx.plan_check(std::slice::from_ref(&task));
        let quorum = crate::pause::plan_check::Quorum::of(&checks);
        let timeout = expires_at.duration_since(now).unwrap_or(Duration::ZERO);
        let options = Action::RECONCILE.to_vec();
        let (index, tool) = (task.index, task.tool.clone());
        let data = ReconcileData {
            kind: PauseKind::Reconcile,
            confirmation_id: confirmation_id.clone(),
            title: format!("Did task {index} ({tool}) take effect?"),
            message: format!(
                "The server stopped while task {index} ({tool}) was running (attempt {}, \
                 started {started_at}); it may have taken effect. run_again calls it again with \
                 the same idempotency key, skip records it as not run, cancel ends the run.",
                entry.attempt
            ),
            risk_level: task.risk_level.unwrap_or(RiskLevel::Low),
            task: Box::new(task),
            idempotency_key: entry.key.clone(),
            started_at,
            attempt: entry.attempt,
            options: options.clone(),
            required: quorum.required,
            approvers: quorum.groups,
            timeout_seconds: timeout_seconds(timeout),
            expires_at: crate::clock::rfc3339(expires_at),
        };
        Ok(Some(Request {
            chunk: Chunk::reconcile_request(ctx.session_id(), data),
            asking: Asking::Reconcile(Arc::new(checks)),
            options,
            confirmation_id,
            round: ctx.round,
            state: None,
            expires_at,
            timeout,
            rejects_on_timeout: None,
            timers: None,
            frame: None,
        }))
    }

    async fn take(
        ctx: &mut RunContext,
        decision: Decision,
        asked: Asked,
    ) -> Result<Reconciled, RunError> {
        let (action, chosen) = match decision {
            Decision::Confirm(..) => (Action::RunAgain, Some(Reconciled::RunAgain)),
            Decision::Skip => (Action::Skip, Some(Reconciled::Skip)),
            Decision::Cancel(_) => (Action::Cancel, None),
            // Not offered on a reconcile: the manager never takes it.
            _ => return Err(RunError::unacted(ErrorType::Internal)),
        };
        let received = Chunk::reconcile_received(
            ctx.session_id(),
            format!("Received {}", action.as_str()),
            action,
            &asked.confirmation_id,
        );
        // Written even after a stop, as for a plan.
        ctx.replay.push(received);
        chosen.ok_or(RunError::Cancelled(CancelReason::User))
    }

    fn received(decided: &Received<'_>) -> Chunk {
        Chunk::reconcile_received(
            decided.session_id,
            format!("Received {}", decided.action.as_str()),
            decided.action,
            decided.confirmation_id,
        )
        .with_approvers(decided.approved_by)
    }

    /// Never stored (asked again from its call's journal entry); read
    /// back, decided as its task's approval.
    fn restore_asking(ctx: &mut RunContext, task: &Box<TaskSpec>) -> Asking {
        Asking::Reconcile(Arc::new(ctx.plan_check(std::slice::from_ref(&**task))))
    }

    /// Never stored: asked again from its call's journal entry.
    async fn wait_restored(
        _ctx: &mut RunContext,
        _pending: PendingDecision,
        _asked: Asked,
    ) -> Result<Resumed, RunError> {
        Err(RunError::unacted(ErrorType::Internal))
    }

    /// Never stored: asked again from its call's journal entry.
    async fn take_decided(
        _ctx: &mut RunContext,
        _decision: Decision,
        _asked: Asked,
    ) -> Result<Resumed, RunError> {
        Err(RunError::unacted(ErrorType::Internal))
    }
}

impl RunContext {
    /// Puts the call of `entry` to a person and waits for the choice.
    pub(in crate::run::context) async fn reconcile(
        &mut self,
        asks: Reconcile,
    ) -> Result<Reconciled, RunError> {
        // Boxed, as in `confirm`; a reconcile is always asked.
        let Some((pending, asked)) = Box::pin(self.put_to_person(asks, false)).await? else {
            return Err(RunError::unacted(ErrorType::Internal));
        };
        let decision = self.wait_for(pending, &asked).await;
        // Whatever ended the wait, it is no longer listed aside.
        if let Some(run) = self.stored_id.clone() {
            let store = &self.settings.store;
            if let Err(err) = store.list_aside(&run, self.session_key(), None).await {
                crate::session::run_log!(Warn, self.tag(), "{err}; its listing lapses by itself");
            }
        }
        let decision = decision?;
        self.settled(Reconcile::KIND, &decision, &asked)?;
        Reconcile::take(self, decision, asked).await
    }
}

/// The id of the pause asking about `entry`'s attempt: the same each time
/// it is asked again after a restart (links and replies naming it still
/// decide it), another for another call or attempt.
fn pause_id(entry: &CallEntry) -> String {
    let digest = Sha256::new()
        .chain_update(b"reconcile\n")
        .chain_update(entry.confirmation_id.as_bytes())
        .chain_update(b"\n")
        .chain_update(entry.key.as_bytes())
        .chain_update(format!("\n{}\n{}", entry.index, entry.attempt).as_bytes())
        .finalize();
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&digest[..16]);
    uuid::Builder::from_sha1_bytes(bytes)
        .into_uuid()
        .to_string()
}
