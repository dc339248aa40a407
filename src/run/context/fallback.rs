//! A pause the run itself ended (its timeout, a stop): recorded in a
//! durable store as a reply's decision is, so that an ended pause never
//! comes back, and announced (`interaction.expired`) with that record.

use super::RunContext;
use crate::confirmation::Decision;
use crate::protocol::{CancelReason, ChunkType, Decisions, TaskDecision, Verdict};
use crate::run::journal::{Entry, Pause, PauseEvent};
use crate::run::outcome::RunError;
use crate::store::Fault;

impl RunContext {
    /// Nobody answered a pause whose tasks all say `on_timeout = "reject"`
    /// (`rejects`: their indices): every task rejected, and the run goes
    /// on. Never an approval. Any other decision stands.
    pub(super) fn silence(&self, decision: Decision, rejects: Option<&[usize]>) -> Decision {
        let (Decision::Cancel(CancelReason::Timeout), Some(tasks)) = (&decision, rejects) else {
            return decision;
        };
        let rejected = tasks
            .iter()
            .map(|&index| TaskDecision {
                index,
                verdict: Verdict::Reject {
                    reason: Some("no answer in time".to_owned()),
                },
            })
            .collect();
        let text = "No answer in time: every task is rejected (on_timeout = reject)";
        self.log.push(self.chunk(ChunkType::Status, text));
        Decision::Confirm(Decisions(rejected), None)
    }

    /// A stored pause decided by the run's own fallback (its timeout): the
    /// decision is recorded as a reply's is, so that an ended pause never
    /// comes back; and if another replica owns the run now (this one's
    /// lease lapsed), the copy here is handed over rather than ended.
    pub(super) async fn record_fallback(
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
        let stored = self.stored_id.as_ref().filter(|_| self.pause_stored);
        let Entry {
            events,
            decision: recorded,
            ..
        } = self.fallback_entry(reason, confirmation_id);
        let Some(run) = stored else {
            self.settings.announce(&events).await;
            return Ok(decision);
        };
        if decided_elsewhere {
            return Ok(decision);
        }
        let Some(recorded) = recorded else {
            return Ok(decision);
        };
        let recording = self
            .settings
            .store
            .record_decision(run, self.session_key(), &recorded, &events)
            .await;
        if recording.is_ok() {
            self.settings.wake_sender(&events);
        }
        match recording {
            Err(err) if err.fault == Fault::Moved => {
                log::info!(
                    "{}: {err}: the paused run is handed to its new owner",
                    self.tag()
                );
                Err(RunError::Suspended)
            }
            // It ends here as decided; a restore finds its pause expired.
            Err(err) => {
                log::warn!("{}: {err}", self.tag());
                Ok(decision)
            }
            Ok(()) => Ok(decision),
        }
    }

    /// What is written of a pause the run itself ended: the decision kept,
    /// and for its timeout `interaction.expired` (a supersede's is written
    /// by its taker, before the new run can pause). Without webhooks no
    /// pause is remembered, and none is announced.
    fn fallback_entry(&self, reason: CancelReason, confirmation_id: &str) -> Entry {
        let kind = self.last_pause.as_deref().map(|(_, kind)| *kind);
        let withdrawn = PauseEvent::Withdrawn {
            pause: Pause {
                confirmation_id,
                kind: kind.unwrap_or_default(),
            },
            reason,
            timeout: self.settings.confirm_timeout,
        };
        let mut entry = self.settings.journal().pause(self.subject(), withdrawn);
        if kind.is_none() {
            entry.events.clear();
        }
        entry
    }
}
