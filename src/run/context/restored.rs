//! A pause restored from a store (a restart, or a takeover by another
//! replica): registered again with what its record keeps (its approvals,
//! its escalation and the expiry that moved with it), then waited on with
//! the time it has left, its timers and its `on_timeout` as when it was
//! asked.

use std::time::{Duration, Instant};

use super::asked::Asked;
use super::RunContext;
use crate::confirmation::slot::{PauseSpec, PendingDecision};
use crate::confirmation::Decision;
use crate::run::outcome::RunError;
use crate::run::plan::Resumed;
use crate::store::PausedRecord;

impl RunContext {
    /// Registers again the pause of a run restored from a store (its
    /// record is `record`): from here on a reply may decide it.
    pub(crate) fn restore_pause(
        &mut self,
        record: &PausedRecord,
    ) -> Result<PendingDecision, RunError> {
        let asking = self.restore_asking(&record.asked);
        let at = crate::clock::at;
        let progress = record.progress.clone().unwrap_or_default();
        if let Some(group) = &progress.escalated_to {
            // A re-attached client is sent the request as it stands now.
            let field = format!("\"escalated_to\":{}", serde_json::json!(group));
            self.replay
                .amend_request(&record.confirmation_id, field.as_bytes());
        }
        let spec = PauseSpec {
            confirmation_id: record.confirmation_id.clone(),
            round: record.round,
            options: record.options.clone(),
            kind: record.asked.kind(),
            asking,
            stored: self.stored_id.clone(),
            asked_at: at(record.asked_at_ms),
            expires_at: at(progress.expires_at_ms.unwrap_or(record.expires_at_ms)),
            tally: crate::confirmation::quorum::Tally {
                approvals: progress.approvals,
                rejected: progress.rejected,
                decided: progress.decided,
                task_approvals: progress.task_approvals,
                started: progress.started,
            },
            escalated_to: progress.escalated_to,
            escalations: progress.escalations,
            // Its tasks run as they are decided if its engine's do (one
            // that does not waits on through `Approval::Partly`).
            as_decided: record.asked.kind().asks_a_yes(),
        };
        let pending = self
            .slot
            .pause(spec, self.stop.token())
            .map_err(RunError::Cancelled)?;
        self.pause_stored = true;
        self.replay.pause_started();
        // What its record holds is not what its log does (a restore's
        // gap rules): a park writes the log.
        self.replay.pause_parkable(None);
        self.replay.note_pause(&record.confirmation_id);
        if record.asked.kind().asks_a_yes() {
            self.anchor_calls(&record.confirmation_id);
            // Tasks started while it waited go on from their journal.
            self.resume_journal(record.calls.clone());
        }
        Ok(pending)
    }

    /// Goes on from a restored pause whose decision was recorded before a
    /// crash cut its work short (#44): the decision is taken again as it
    /// was recorded, and the tasks its journal names go on where they were
    /// (see `exactly_once.rs`).
    pub(crate) async fn resume_decided(
        &mut self,
        record: &PausedRecord,
        decision: Decision,
    ) -> Result<Resumed, RunError> {
        let kind = record.asked.kind();
        self.replay.note_pause(&record.confirmation_id);
        if kind.asks_a_yes() {
            self.anchor_calls(&record.confirmation_id);
            self.resume_journal(record.calls.clone());
        }
        if self.settings.webhooks.is_some() {
            self.last_pause = Some(Box::new((record.confirmation_id.clone(), kind)));
        }
        let asked = Asked {
            confirmation_id: record.confirmation_id.clone(),
            round: record.round,
            paused_at: Instant::now(),
            sent: None,
            timeout: Duration::ZERO,
            rejects_on_timeout: None,
            timers: None,
        };
        self.take_decided(kind, decision, asked).await
    }

    /// Waits on a restored pause (see [`RunContext::restore_pause`]) with
    /// the time it has left, and takes its decision as
    /// [`RunContext::confirm`] (or [`RunContext::ask`]) would.
    pub(crate) async fn resume_pause(
        &mut self,
        pending: PendingDecision,
        record: &PausedRecord,
    ) -> Result<Resumed, RunError> {
        let now_ms = crate::clock::now_ms();
        let progress = record.progress.as_ref();
        let expires_at_ms = progress
            .and_then(|p| p.expires_at_ms)
            .unwrap_or(record.expires_at_ms);
        let left = Duration::from_millis(expires_at_ms.saturating_sub(now_ms));
        // What its tasks ask while it waits, as when it was asked: the
        // timers count from then (what came due meanwhile fires now, what
        // fired before does not again), silence rejects where they say so.
        let (rejects_on_timeout, timers) = match record.asked.plan_tasks() {
            Some(tasks) => {
                let checks = self.plan_check(tasks);
                let (_, rejects) = self.waiting_of(&checks);
                let asked_at = crate::clock::at(record.asked_at_ms);
                (rejects, self.timers_of(&checks, asked_at, progress))
            }
            None => (None, None),
        };
        let asked = Asked {
            confirmation_id: record.confirmation_id.clone(),
            round: record.round,
            paused_at: Instant::now(),
            sent: None,
            timeout: left,
            rejects_on_timeout,
            timers,
        };
        if self.settings.webhooks.is_some() {
            self.last_pause = Some(Box::new((
                record.confirmation_id.clone(),
                record.asked.kind(),
            )));
        }
        self.wait_restored(record.asked.kind(), pending, asked)
            .await
    }
}
