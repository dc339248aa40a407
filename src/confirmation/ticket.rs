//! A decision on its way to its run ([`DecisionTicket`]): delivered once it
//! is recorded, failed when it cannot be, or withdrawn (the pause waits
//! again as if the reply had never come); and a paused run taken by a new
//! message ([`Superseding`]), handed over once that is recorded.

use super::{Begun, Decision, DecisionTicket, Entry, RunSlot, Superseding};
use crate::protocol::{CancelReason, ErrorType};

impl DecisionTicket {
    pub fn deliver(mut self) {
        if let (Some(tx), Some(decision)) = (self.decide_tx.take(), self.decision.take()) {
            // The run may have ended meanwhile (a stop): then nobody waits.
            let _ = tx.send(decision);
        }
    }

    pub fn fail(mut self, error_type: ErrorType) {
        if let Some(tx) = self.decide_tx.take() {
            let _ = tx.send(Decision::Failed(error_type));
        }
    }

    /// Takes the decision back (it could not be recorded): the pause is
    /// undecided again and a later reply may decide it. If the run's own
    /// fallback (its timeout or a stop) came due meanwhile, that fallback
    /// decides it now, as it would have without this reply.
    pub fn withdraw(mut self) {
        if let Some(tx) = self.decide_tx.take() {
            self.manager.lock().give_back(&self.key, self.run_id, tx);
        }
    }

    /// The store did not say whether it recorded the decision: until that
    /// is settled (delivered or withdrawn), other replies are told to retry.
    pub fn in_doubt(&self) {
        let mut registry = self.manager.lock();
        let pause = registry
            .sessions
            .get_mut(&self.key)
            .filter(|entry| entry.run_id == self.run_id)
            .and_then(|entry| entry.pause.as_mut());
        if let Some(pause) = pause {
            pause.in_doubt = true;
        }
    }
}

impl Drop for DecisionTicket {
    fn drop(&mut self) {
        if let Some(tx) = self.decide_tx.take() {
            let _ = tx.send(Decision::Failed(ErrorType::Internal));
        }
    }
}

impl Superseding {
    /// The superseded run's id in a durable store, if its pause is kept there.
    pub fn stored(&self) -> Option<&std::sync::Arc<str>> {
        self.stored.as_ref()
    }

    /// The superseded run's number.
    pub fn run_id(&self) -> u64 {
        self.old_run_id
    }

    /// The superseded pause's confirmation id.
    pub fn confirmation_id(&self) -> &str {
        &self.confirmation_id
    }

    /// What the superseded pause asked.
    pub fn kind(&self) -> crate::protocol::PauseKind {
        self.kind
    }

    /// The supersede is recorded: the old run is told, and the new run takes
    /// the session.
    pub fn complete(mut self) -> RunSlot {
        let mut registry = self.manager.lock();
        if let Some(tx) = self.decide_tx.take() {
            // The old run may have just dropped its receiver (it is ending
            // anyway); either way it no longer owns the session.
            let _ = tx.send(Decision::Cancel(CancelReason::Superseded));
        }
        registry.insert(
            self.key.clone(),
            Entry {
                run_id: self.new_run_id,
                pause: None,
                restoring: false,
            },
        );
        drop(registry);
        RunSlot {
            manager: self.manager.clone(),
            key: self.key.clone(),
            run_id: self.new_run_id,
        }
    }

    /// The supersede is recorded but the new run does not start (its
    /// request was answered already): the old run ends `superseded`.
    pub fn abandon(mut self) {
        if let Some(tx) = self.decide_tx.take() {
            let _ = tx.send(Decision::Cancel(CancelReason::Superseded));
        }
    }

    /// The supersede could not be recorded: the pause waits again.
    pub fn withdraw(mut self) {
        if let Some(tx) = self.decide_tx.take() {
            self.manager
                .lock()
                .give_back(&self.key, self.old_run_id, tx);
        }
    }
}

impl Drop for Superseding {
    fn drop(&mut self) {
        if let Some(tx) = self.decide_tx.take() {
            self.manager
                .lock()
                .give_back(&self.key, self.old_run_id, tx);
        }
    }
}

impl Begun {
    /// The new run's slot, the supersede (if any) completed at once: for
    /// callers with nothing to record (no durable store).
    pub fn now(self) -> RunSlot {
        match self {
            Begun::Fresh(slot) => slot,
            Begun::Supersedes(taken) => taken.complete(),
        }
    }
}
