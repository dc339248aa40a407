//! One approval of several a pause needs (a quorum): kept with the paused
//! run's record (a durable store: a restart keeps it), recorded (the audit
//! record `approved`, fail closed like a decision), announced
//! (`interaction.progress`), shown on the run's stream ("1 of 2 approvals
//! (lead-1)"), and acknowledged with `approval_recorded`. The pause stays
//! pending, its expiry unchanged.
//!
//! An approval counts only once it is kept: while one is being kept, the
//! registry counts no other (`DecideError::Counting`, 503), so no quorum is
//! completed with an approval that is then lost. One whose fate in the
//! store is unknown (no answer in time) is told 504 `outcome_unknown` and
//! settled in the background: the same step is written again (it is
//! idempotent: the approvals as they stand) until the store takes it, and
//! only then is it recorded, announced and counted.

use super::decide::{Decided, Reply, ReplyError};
use super::journal::{Entry, Pause, PauseEvent, Subject};
use super::Runs;
use crate::cluster::SETTLE_RETRY;
use crate::confirmation::quorum::Progress;
use crate::confirmation::Accepted;
use crate::protocol::{meta, Chunk, ChunkType};
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::store::{Fault, PauseProgress};

impl Runs {
    pub(super) async fn approval_recorded(
        &self,
        key: &SessionKey,
        reply: &Reply<'_>,
        accepted: Accepted,
        progress: Progress,
    ) -> Result<Decided, ReplyError> {
        let label = reply.decider.label.as_str();
        let id = accepted.confirmation_id.as_str();
        // Kept with the paused run's record first (a restart keeps it):
        // not kept, not counted, and the pause waits on.
        if let Some(run) = &accepted.stored {
            let step = PauseProgress::approvals(
                id,
                &progress.approvals,
                progress.required,
                &progress.rejected,
            );
            if let Err(err) = self.settings.store.record_progress(run, key, &step).await {
                run_log!(
                    Error,
                    RunTag::of(key, accepted.run_id).pause(&accepted.confirmation_id),
                    "{err}"
                );
                match err.fault {
                    Fault::Unknown => {
                        let runs = self.clone();
                        let (key, run) = (key.clone(), run.clone());
                        let (label, client) = (label.to_owned(), reply.client.map(str::to_owned));
                        tokio::spawn(async move {
                            runs.settle_approval(&key, &run, &step, &accepted, &label, client)
                                .await;
                        });
                        return Err(ReplyError::OutcomeUnknown);
                    }
                    Fault::Moved => {
                        self.manager.withdraw_approval(key, id, label);
                        self.relinquish(key);
                    }
                    Fault::Unreachable | Fault::Lost => {
                        self.manager.withdraw_approval(key, id, label);
                    }
                }
                return Err(ReplyError::StoreUnavailable);
            }
        }
        self.approval_kept(key, &accepted, &progress, label, reply.client)
            .await?;
        Ok(Decided {
            action: accepted.action,
            confirmation_id: accepted.confirmation_id.clone(),
            round: accepted.confirmation_round,
            given: None,
            kind: accepted.kind,
            approved_by: Vec::new(),
            progress: Some(progress),
        })
    }

    /// An approval the store has kept: recorded in the audit log (not on
    /// the record, not counted), counted, announced and shown on the run's
    /// stream.
    async fn approval_kept(
        &self,
        key: &SessionKey,
        accepted: &Accepted,
        progress: &Progress,
        label: &str,
        client: Option<&str>,
    ) -> Result<(), ReplyError> {
        let (approvals, required) = (&progress.approvals, progress.required);
        let id = accepted.confirmation_id.as_str();
        let approved = PauseEvent::Approved {
            pause: Pause {
                confirmation_id: id,
                kind: accepted.kind,
            },
            round: accepted.confirmation_round,
            by: label,
            client,
            approvals,
            required,
        };
        let run = Subject {
            key,
            run_id: accepted.run_id,
            stored: accepted.stored.as_deref(),
        };
        let journal = self.settings.journal();
        let Entry { audit, events, .. } = journal.pause(run, approved);
        if journal.audit(audit.as_ref()).await.is_err() {
            // Not on the record, so not counted: the pause waits on.
            self.manager.withdraw_approval(key, id, label);
            return Err(ReplyError::AuditUnavailable);
        }
        self.manager.approval_kept(key, id);
        self.settings.announce(&events).await;
        if let Some(log) = self.logs.find(key) {
            let text = format!(
                "{} of {required} approvals ({})",
                approvals.len(),
                approvals.join(", ")
            );
            let chunk = Chunk::new(ChunkType::Status, text, &key.session_id, 0)
                .with_meta(meta::CONFIRMATION_ID, id)
                .with_meta(meta::APPROVALS, approvals.clone())
                .with_meta(meta::REQUIRED, required);
            log.push(chunk);
        }
        Ok(())
    }

    /// Writes `step` again, [`SETTLE_RETRY`] apart, until the store takes
    /// it (the approval is then counted) or says the run is not here any
    /// more (it is then withdrawn). At shutdown it is left to the store:
    /// the next process restores the pause with what the store kept.
    async fn settle_approval(
        &self,
        key: &SessionKey,
        run: &str,
        step: &PauseProgress,
        accepted: &Accepted,
        label: &str,
        client: Option<String>,
    ) {
        let id = accepted.confirmation_id.as_str();
        loop {
            tokio::select! {
                () = tokio::time::sleep(SETTLE_RETRY) => {}
                () = self.shutdown.cancelled() => return,
            }
            // Decided meanwhile (a cancel, the run's timeout), perhaps
            // paused again on a new round: nothing of this one to count.
            if !self.manager.waits_on(key, id) {
                self.manager.withdraw_approval(key, id, label);
                return;
            }
            match self.settings.store.record_progress(run, key, step).await {
                Ok(()) => {
                    let progress = Progress {
                        approvals: step.approvals.clone(),
                        required: step.required,
                        groups: Vec::new(),
                        rejected: step.rejected.clone(),
                    };
                    let kept = self
                        .approval_kept(key, accepted, &progress, label, client.as_deref())
                        .await;
                    run_log!(
                        Info,
                        RunTag::of(key, accepted.run_id).pause(&accepted.confirmation_id),
                        "an approval by {label} with an unknown outcome was {}",
                        if kept.is_ok() {
                            "kept; it counts"
                        } else {
                            "kept by the store but not recorded in the audit log; it does not count"
                        }
                    );
                    return;
                }
                Err(err) if err.fault == Fault::Moved => {
                    self.manager.withdraw_approval(key, id, label);
                    self.relinquish(key);
                    return;
                }
                Err(err) if err.fault == Fault::Lost => {
                    self.manager.withdraw_approval(key, id, label);
                    return;
                }
                Err(_) => {}
            }
        }
    }
}
