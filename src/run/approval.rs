//! One approval of several a pause needs (a quorum): kept with the paused
//! run's record (a durable store: a restart keeps it), recorded (the audit
//! record `approved`, fail closed like a decision), announced
//! (`interaction.progress`), shown on the run's stream ("1 of 2 approvals
//! (lead-1)"), and acknowledged with `approval_recorded`. The pause stays
//! pending, its expiry unchanged.

use super::decide::{Decided, Reply, ReplyError};
use super::journal::{Entry, Pause, PauseEvent, Subject};
use super::Runs;
use crate::confirmation::quorum::Progress;
use crate::confirmation::Accepted;
use crate::protocol::{meta, Chunk, ChunkType};
use crate::session::SessionKey;
use crate::store::PauseProgress;

impl Runs {
    pub(super) async fn approval_recorded(
        &self,
        key: &SessionKey,
        reply: &Reply<'_>,
        accepted: Accepted,
        progress: Progress,
    ) -> Result<Decided, ReplyError> {
        let (approvals, required) = (progress.approvals.clone(), progress.required);
        // Kept with the paused run's record first (a restart keeps it):
        // not kept, not counted, and the pause waits on.
        if let Some(run) = &accepted.stored {
            let step = PauseProgress::approvals(&accepted.confirmation_id, &approvals, required);
            let kept = self.settings.store.record_progress(run, key, &step).await;
            if let Err(err) = kept {
                log::error!(
                    "{}: {err}",
                    crate::session::RunTag::of(key, accepted.run_id)
                );
                self.manager.withdraw_approval(
                    key,
                    &accepted.confirmation_id,
                    &reply.decider.label,
                );
                return Err(ReplyError::StoreUnavailable);
            }
        }
        let approved = PauseEvent::Approved {
            pause: Pause {
                confirmation_id: &accepted.confirmation_id,
                kind: accepted.kind,
            },
            round: accepted.confirmation_round,
            by: &reply.decider.label,
            client: reply.client,
            approvals: &approvals,
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
            self.manager
                .withdraw_approval(key, &accepted.confirmation_id, &reply.decider.label);
            return Err(ReplyError::AuditUnavailable);
        }
        self.settings.announce(&events).await;
        if let Some(log) = self.logs.find(key) {
            let text = format!(
                "{} of {required} approvals ({})",
                approvals.len(),
                approvals.join(", ")
            );
            let chunk = Chunk::new(ChunkType::Status, text, &key.session_id, 0)
                .with_meta(meta::CONFIRMATION_ID, accepted.confirmation_id.as_str())
                .with_meta(meta::APPROVALS, approvals.clone())
                .with_meta(meta::REQUIRED, required);
            log.push(chunk);
        }
        Ok(Decided {
            action: accepted.action,
            confirmation_id: accepted.confirmation_id.clone(),
            round: accepted.confirmation_round,
            decisions: None,
            answers: None,
            kind: accepted.kind,
            approved_by: Vec::new(),
            progress: Some(progress),
        })
    }
}
