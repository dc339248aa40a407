//! A pause the run itself ended (its timeout, a stop): recorded in a
//! durable store as a reply's decision is, so that an ended pause never
//! comes back, and announced (`interaction.expired`) with that record.

use std::time::Duration;

use super::asked::Asked;
use super::RunContext;
use crate::confirmation::Decision;
use crate::protocol::{CancelReason, Decisions, ErrorType, PauseKind, TaskDecision, Verdict};
use crate::run::journal::{Entry, Pause, PauseEvent};
use crate::run::outcome::RunError;
use crate::session::run_log;
use crate::store::Fault;

impl RunContext {
    /// Nobody answered a pause whose tasks all say `on_timeout = "reject"`
    /// (`rejects`: their indices): every task still pending rejected (one
    /// decided on its own keeps its decision), and the run goes on. Never
    /// an approval nobody gave. Any other decision stands.
    pub(super) fn silence(&self, decision: Decision, rejects: Option<&[usize]>) -> Decision {
        let (Decision::Cancel(CancelReason::Timeout), Some(tasks)) = (&decision, rejects) else {
            return decision;
        };
        let decided = self.slot.decided_so_far();
        let rejected = tasks
            .iter()
            .map(|&index| TaskDecision {
                index,
                verdict: decided.named(index).cloned().unwrap_or(Verdict::Reject {
                    reason: Some("no answer in time".to_owned()),
                }),
            })
            .collect();
        Decision::TimedOut(Decisions(rejected))
    }

    /// A pause decided by the run's own fallback (its timeout, or the
    /// reject its tasks say silence is): the decision is recorded as a
    /// reply's is (a stored pause: in the store, so that an ended pause
    /// never comes back), a timeout's reject audited too (fail closed:
    /// nobody answered, which tasks were rejected), and announced
    /// (`interaction.expired`, with the pause's own wait); if another
    /// replica owns the run now (this one's lease lapsed), the copy here
    /// is handed over rather than ended.
    pub(super) async fn record_fallback(
        &self,
        decision: Decision,
        asked: &Asked,
    ) -> Result<Decision, RunError> {
        let id = asked.confirmation_id.as_str();
        // In whole seconds, to the nearest (asked and registered a few
        // microseconds apart).
        let waited = self.slot.pause_span().map_or(asked.timeout, |span| {
            Duration::from_secs(((span.as_millis() + 500) / 1000) as u64)
        });
        let Entry {
            events,
            decision: recorded,
            audit,
        } = match &decision {
            // A reply's cancel and a supersede were recorded by their
            // taker; a shutdown keeps the pause for the next process.
            Decision::Cancel(
                CancelReason::User | CancelReason::Superseded | CancelReason::Shutdown,
            ) => return Ok(decision),
            Decision::Cancel(reason) => self.fallback_entry(*reason, id, waited),
            Decision::TimedOut(rejected) => self.timed_out_entry(rejected, asked, waited),
            _ => return Ok(decision),
        };
        let stored = self.stored_id.as_ref().filter(|_| self.pause_stored);
        let recording = match (stored, recorded) {
            (Some(run), Some(recorded)) => {
                let recording = self
                    .settings
                    .store
                    .record_decision(run, self.session_key(), &recorded, &events)
                    .await;
                if recording.is_ok() {
                    self.settings.wake_sender(&events);
                }
                recording
            }
            (Some(_), None) => Ok(()),
            (None, _) => {
                self.settings.announce(&events).await;
                Ok(())
            }
        };
        match recording {
            Err(err) if err.fault == Fault::Moved => {
                run_log!(
                    Info,
                    self.tag(),
                    "{err}: the paused run is handed to its new owner"
                );
                return Err(RunError::Suspended);
            }
            // It ends here as decided; a restore finds its pause expired.
            Err(err) => run_log!(Warn, self.tag(), "{err}"),
            Ok(()) => {}
        }
        if self.settings.journal().audit(audit.as_ref()).await.is_err() {
            return Err(RunError::unacted(ErrorType::AuditUnavailable));
        }
        Ok(decision)
    }

    /// What is written of a pause the run itself ended: the decision kept,
    /// and for its timeout `interaction.expired` (a supersede's is written
    /// by its taker, before the new run can pause). Without webhooks no
    /// pause is remembered, and none is announced.
    fn fallback_entry(
        &self,
        reason: CancelReason,
        confirmation_id: &str,
        waited: Duration,
    ) -> Entry {
        let kind = self.last_pause.as_deref().map(|(_, kind)| *kind);
        let withdrawn = PauseEvent::Withdrawn {
            pause: Pause {
                confirmation_id,
                kind: kind.unwrap_or_default(),
            },
            reason,
            timeout: waited,
        };
        let mut entry = self.settings.journal().pause(self.subject(), withdrawn);
        if kind.is_none() {
            entry.events.clear();
        }
        entry
    }

    /// What is written of a pause nobody answered whose tasks reject on
    /// timeout: the reject kept as its decision, the `timeout_rejected`
    /// audit record, and `interaction.expired` saying what was rejected.
    fn timed_out_entry(&self, rejected: &Decisions, asked: &Asked, waited: Duration) -> Entry {
        let mut entry = self.settings.journal().pause(
            self.subject(),
            PauseEvent::TimedOut {
                pause: Pause {
                    confirmation_id: &asked.confirmation_id,
                    kind: PauseKind::Approval,
                },
                round: asked.round,
                rejected,
                timeout: waited,
            },
        );
        if self.last_pause.is_none() {
            entry.events.clear();
        }
        entry
    }
}
