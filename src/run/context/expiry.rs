//! A task's own expiry (#42): each task of a plan waits its own `timeout`
//! (its tool's or rule's, else `--confirm-timeout`). A task whose
//! `on_timeout = "reject"` expires before the pause's own deadline is
//! rejected alone (`expired`), kept, recorded and shown as a `decide` of
//! it would be, and the run goes on with the others pending; the pause's
//! own deadline (the first task that cancels, else the last that rejects)
//! ends it as before.

use std::time::{Duration, SystemTime};

use super::asked::Asked;
use super::RunContext;
use crate::cluster::SETTLE_RETRY;
use crate::confirmation::tasks::{ExpireError, Expired, EXPIRED_BY};
use crate::protocol::{Chunk, ErrorType, PauseKind};
use crate::run::journal::{Pause, TasksDecided};
use crate::run::outcome::RunError;
use crate::session::run_log;
use crate::store::PauseProgress;

/// How long a task's expiry waits for a step being kept before it tries
/// again.
const BUSY_RETRY: Duration = Duration::from_millis(50);

impl RunContext {
    /// When the pause's own deadline is, as a wall-clock time.
    fn pause_deadline(asked: &Asked) -> SystemTime {
        SystemTime::now() + asked.timeout.saturating_sub(asked.paused_at.elapsed())
    }

    /// How long until the next pending task that silence rejects expires
    /// before the pause's own deadline: when the wait wakes to reject it
    /// alone.
    pub(super) fn next_task_expiry(&self, asked: &Asked) -> Option<Duration> {
        let deadline = Self::pause_deadline(asked);
        let tasks = self.slot.task_expiries(self.settings.confirm_timeout)?;
        let next = tasks
            .iter()
            .filter(|task| task.rejects && task.at < deadline)
            .map(|task| task.at)
            .min()?;
        Some(next.duration_since(SystemTime::now()).unwrap_or_default())
    }

    /// Rejects the pending tasks whose own expiry has passed (before the
    /// pause's deadline): kept in the store, recorded in the audit log
    /// (`decided_task`, by `timeout`), announced (`interaction.progress`)
    /// and shown (`decision_recorded`), then counted, which wakes the run
    /// as a `decide` does.
    pub(super) async fn expire_due(&mut self, asked: &Asked) -> Result<(), RunError> {
        let now = SystemTime::now();
        let deadline = Self::pause_deadline(asked);
        let Some(tasks) = self.slot.task_expiries(self.settings.confirm_timeout) else {
            return Ok(());
        };
        let due: Vec<usize> = tasks
            .iter()
            .filter(|task| task.rejects && task.at <= now && task.at < deadline)
            .map(|task| task.index)
            .collect();
        if due.is_empty() {
            return Ok(());
        }
        let expired = loop {
            match self.slot.expire_tasks(&due) {
                Ok(expired) => break expired,
                Err(ExpireError::Busy) => tokio::time::sleep(BUSY_RETRY).await,
                Err(ExpireError::Decided) => return Ok(()),
            }
        };
        let key = self.session_key().clone();
        let id = expired.confirmation_id.clone();
        let withdraw = |ctx: &RunContext, expired: &Expired| {
            let tasks: Vec<usize> = expired.now.0.iter().map(|d| d.index).collect();
            ctx.slot
                .manager()
                .withdraw_tasks(&key, &id, &tasks, &expired.approvals_before);
        };
        if let Some(run) = &expired.stored {
            let step = PauseProgress::tasks(&id, &expired.decided, &expired.task_approvals);
            if let Err(err) = self.settings.store.record_progress(run, &key, &step).await {
                // Not kept, not counted: tried again at the next wake.
                run_log!(Warn, self.tag().pause(&id), "{err}");
                withdraw(self, &expired);
                tokio::time::sleep(SETTLE_RETRY).await;
                return Ok(());
            }
        }
        let journal = self.settings.journal();
        let decided = TasksDecided {
            pause: Pause {
                confirmation_id: &id,
                kind: PauseKind::Approval,
            },
            round: expired.round,
            by: EXPIRED_BY,
            client: None,
            now: &expired.now,
            pending: &expired.pending,
            approving: &[],
            via: None,
        };
        let (audits, events) = journal.tasks_decided(self.subject(), decided);
        for audit in &audits {
            if journal.audit(Some(audit)).await.is_err() {
                withdraw(self, &expired);
                return Err(RunError::unacted(ErrorType::AuditUnavailable));
            }
        }
        self.slot.manager().approval_kept(&key, &id);
        self.settings.announce(&events).await;
        let shown =
            Chunk::decision_recorded(self.session_id(), &id, &expired.now, &expired.pending);
        self.replay.push(shown);
        Ok(())
    }
}
