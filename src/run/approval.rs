//! One approval of several a pause needs (a quorum): kept with the paused
//! run's record (a durable store: a restart keeps it), recorded (the audit
//! record `approved`, fail closed like a decision), announced
//! (`interaction.progress`), shown on the run's stream ("1 of 2 approvals
//! (lead-1)"), and acknowledged with `approval_recorded`. The pause stays
//! pending, its expiry unchanged.

use super::decide::{Decided, Reply, ReplyError};
use super::Runs;
use crate::audit::{AuditRecord, RunFields};
use crate::confirmation::quorum::Progress;
use crate::confirmation::Accepted;
use crate::protocol::{meta, Chunk, ChunkType};
use crate::session::SessionKey;
use crate::store::PauseProgress;
use crate::webhook::{About, Event};

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
        if let Some(audit) = &self.settings.audit {
            let record = AuditRecord::Approved {
                run: RunFields::new(accepted.run_id, &key.session_id, accepted.stored.as_deref()),
                confirmation_id: accepted.confirmation_id.clone(),
                round: accepted.confirmation_round,
                key: reply.decider.label.clone(),
                client: reply.client.map(str::to_owned),
                approvals: approvals.clone(),
                required,
            };
            if audit.write(&record).await.is_err() {
                // Not on the record, so not counted: the pause waits on.
                self.manager.withdraw_approval(
                    key,
                    &accepted.confirmation_id,
                    &reply.decider.label,
                );
                return Err(ReplyError::AuditUnavailable);
            }
        }
        let events = self.settings.event_rows(|| {
            let about = About {
                key,
                confirmation_id: &accepted.confirmation_id,
                kind: accepted.kind,
            };
            Event::progress(&about, &approvals, required, &reply.decider.label)
        });
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
