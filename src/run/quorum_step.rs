//! A reply that does not decide its pause but is a step towards it: one
//! approval of several a pause needs (a quorum), or some of its tasks
//! decided on their own (`decide`, #42). Either is kept with the paused
//! run's record (a durable store: a restart keeps it), recorded (the
//! audit records `approved` or `decided_task`, fail closed like a
//! decision), announced (`interaction.progress`), shown on the run's
//! stream ("1 of 2 approvals (lead-1)", or a `decision_recorded` chunk),
//! and acknowledged (`approval_recorded`, `decision_recorded`). The pause
//! stays pending, its expiry unchanged.
//!
//! A step counts only once it is kept: while one is being kept, the
//! registry counts no other (`DecideError::Counting`, 503), so no quorum is
//! completed, and no task decided twice, with a step that is then lost. One
//! whose fate in the store is unknown (no answer in time) is told 504
//! `outcome_unknown` and settled in the background: the same step is
//! written again (it is idempotent: the tally as it stands) until the store
//! takes it, and only then is it recorded, announced and counted.

use super::decide::{DecidePath, Decided, Reply, ReplyError, Step};
use super::journal::{Entry, Pause, PauseEvent, Subject, TasksDecided};
use crate::cluster::SETTLE_RETRY;
use crate::confirmation::Accepted;
use crate::protocol::Via;
use crate::protocol::{meta, Chunk, ChunkType};
use crate::session::run_log;
use crate::session::{RunTag, SessionKey};
use crate::store::{Fault, PauseProgress};

impl Step {
    /// What the store keeps of it: the pause's tally as it stands.
    fn kept_as(&self, confirmation_id: &str) -> PauseProgress {
        match self {
            Step::Approval(progress) => PauseProgress::approvals(
                confirmation_id,
                &progress.approvals,
                progress.required,
                &progress.rejected,
            ),
            Step::Tasks(partial) => {
                PauseProgress::tasks(confirmation_id, &partial.decided, &partial.task_approvals)
            }
        }
    }

    /// Takes it back out of the registry's tally (not kept).
    fn withdraw(&self, path: &DecidePath, key: &SessionKey, confirmation_id: &str, label: &str) {
        match self {
            Step::Approval(_) => path.manager.withdraw_approval(key, confirmation_id, label),
            Step::Tasks(partial) => {
                let tasks: Vec<usize> = partial.now.0.iter().map(|d| d.index).collect();
                path.manager.withdraw_tasks(
                    key,
                    confirmation_id,
                    &tasks,
                    &partial.approvals_before,
                );
            }
        }
    }
}

impl DecidePath {
    pub(super) async fn step_recorded(
        &self,
        key: &SessionKey,
        reply: &Reply<'_>,
        accepted: Accepted,
        step: Step,
    ) -> Result<Decided, ReplyError> {
        let label = reply.decider.label.as_str();
        let id = accepted.confirmation_id.as_str();
        // Kept with the paused run's record first (a restart keeps it):
        // not kept, not counted, and the pause waits on.
        if let Some(run) = &accepted.stored {
            let kept = step.kept_as(id);
            if let Err(err) = self.settings.store.record_progress(run, key, &kept).await {
                run_log!(
                    Error,
                    RunTag::of(key, accepted.run_id).pause(&accepted.confirmation_id),
                    "{err}"
                );
                match err.fault {
                    Fault::Unknown => {
                        let path = self.clone();
                        let (key, run) = (key.clone(), run.clone());
                        let (label, client) = (label.to_owned(), reply.client.map(str::to_owned));
                        let via = reply.via;
                        tokio::spawn(async move {
                            let settling = Settling {
                                run: &run,
                                kept: &kept,
                                step: &step,
                                accepted: &accepted,
                                label: &label,
                                client,
                                via,
                            };
                            path.settle_step(&key, settling).await;
                        });
                        return Err(ReplyError::OutcomeUnknown);
                    }
                    Fault::Moved => {
                        step.withdraw(self, key, id, label);
                        self.replays.hand_over(key);
                    }
                    Fault::Unreachable | Fault::Lost => step.withdraw(self, key, id, label),
                }
                return Err(ReplyError::StoreUnavailable);
            }
        }
        self.step_kept(key, &accepted, &step, (label, reply.client, reply.via))
            .await?;
        let (progress, partial) = match step {
            Step::Approval(progress) => (Some(progress), None),
            Step::Tasks(partial) => (None, Some(partial)),
        };
        Ok(Decided {
            action: accepted.action,
            confirmation_id: accepted.confirmation_id.clone(),
            round: accepted.confirmation_round,
            given: None,
            kind: accepted.kind,
            approved_by: Vec::new(),
            progress,
            partial,
        })
    }

    /// A step the store has kept: recorded in the audit log (not on the
    /// record, not counted), counted, announced and shown on the run's
    /// stream.
    async fn step_kept(
        &self,
        key: &SessionKey,
        accepted: &Accepted,
        step: &Step,
        (label, client, via): (&str, Option<&str>, Via),
    ) -> Result<(), ReplyError> {
        let id = accepted.confirmation_id.as_str();
        let pause = Pause {
            confirmation_id: id,
            kind: accepted.kind,
        };
        let run = Subject {
            key,
            run_id: accepted.run_id,
            stored: accepted.stored.as_deref(),
        };
        let journal = self.settings.journal();
        let round = accepted.confirmation_round;
        let (audits, events) = match step {
            Step::Approval(progress) => {
                let approved = PauseEvent::Approved {
                    pause,
                    round,
                    by: label,
                    client,
                    approvals: &progress.approvals,
                    required: progress.required,
                    via,
                };
                let Entry { audit, events, .. } = journal.pause(run, approved);
                (audit.into_iter().collect(), events)
            }
            Step::Tasks(partial) => {
                let decided = TasksDecided {
                    pause,
                    round,
                    by: label,
                    client,
                    now: &partial.now,
                    pending: &partial.pending,
                    approving: &partial.approving,
                    via: Some(via),
                };
                journal.tasks_decided(run, decided)
            }
        };
        for audit in &audits {
            if journal.audit(Some(audit)).await.is_err() {
                // Not on the record, so not counted: the pause waits on.
                step.withdraw(self, key, id, label);
                return Err(ReplyError::AuditUnavailable);
            }
        }
        self.manager.approval_kept(key, id);
        self.settings.announce(&events).await;
        if let Some(log) = self.replays.find(key) {
            log.push(shown(step, &key.session_id, id));
        }
        Ok(())
    }

    /// Writes the step again, [`SETTLE_RETRY`] apart, until the store
    /// takes it (it is then counted) or says the run is not here any more
    /// (it is then withdrawn). At shutdown it is left to the store: the
    /// next process restores the pause with what the store kept.
    async fn settle_step(&self, key: &SessionKey, settling: Settling<'_>) {
        let Settling {
            run,
            kept,
            step,
            accepted,
            label,
            client,
            via,
        } = settling;
        let id = accepted.confirmation_id.as_str();
        loop {
            tokio::select! {
                () = tokio::time::sleep(SETTLE_RETRY) => {}
                () = self.shutdown.cancelled() => return,
            }
            // Decided meanwhile (a cancel, the run's timeout), perhaps
            // paused again on a new round: nothing of this one to count.
            if !self.manager.waits_on(key, id) {
                step.withdraw(self, key, id, label);
                return;
            }
            match self.settings.store.record_progress(run, key, kept).await {
                Ok(()) => {
                    let counted = self
                        .step_kept(key, accepted, step, (label, client.as_deref(), via))
                        .await;
                    run_log!(
                        Info,
                        RunTag::of(key, accepted.run_id).pause(&accepted.confirmation_id),
                        "a step by {label} with an unknown outcome was {}",
                        if counted.is_ok() {
                            "kept; it counts"
                        } else {
                            "kept by the store but not recorded in the audit log; it does not count"
                        }
                    );
                    return;
                }
                Err(err) if err.fault == Fault::Moved => {
                    step.withdraw(self, key, id, label);
                    self.replays.hand_over(key);
                    return;
                }
                Err(err) if err.fault == Fault::Lost => {
                    step.withdraw(self, key, id, label);
                    return;
                }
                Err(_) => {}
            }
        }
    }
}

/// A step whose outcome in the store is unknown, being settled.
struct Settling<'a> {
    run: &'a str,
    kept: &'a PauseProgress,
    step: &'a Step,
    accepted: &'a Accepted,
    label: &'a str,
    client: Option<String>,
    via: Via,
}

/// What the run's stream shows of a kept step: the approvals so far, or
/// the tasks decided and those still pending (a `decision_recorded`
/// chunk, not final).
fn shown(step: &Step, session_id: &str, id: &str) -> Chunk {
    match step {
        Step::Approval(progress) => {
            let (approvals, required) = (&progress.approvals, progress.required);
            let text = format!(
                "{} of {required} approvals ({})",
                approvals.len(),
                approvals.join(", ")
            );
            Chunk::new(ChunkType::Status, text, session_id, 0)
                .with_meta(meta::CONFIRMATION_ID, id)
                .with_meta(meta::APPROVALS, approvals.clone())
                .with_meta(meta::REQUIRED, required)
        }
        Step::Tasks(partial) => super::decide::partial_chunk(session_id, id, partial),
    }
}
