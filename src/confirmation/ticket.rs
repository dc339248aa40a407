//! A decision on its way to its run ([`DecisionTicket`]): delivered once it
//! is recorded, failed when it cannot be, or withdrawn (the pause waits
//! again as if the reply had never come).

use super::{Decision, DecisionTicket};
use crate::protocol::ErrorType;

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
        let Some(tx) = self.decide_tx.take() else {
            return;
        };
        let mut registry = self.manager.lock();
        let pause = registry
            .sessions
            .get_mut(&self.key)
            .filter(|entry| entry.run_id == self.run_id)
            .and_then(|entry| entry.pause.as_mut())
            .filter(|pause| pause.decide_tx.is_none());
        match pause {
            Some(pause) => match pause.settling {
                Some(reason) => {
                    let _ = tx.send(Decision::Cancel(reason));
                }
                None => pause.decide_tx = Some(tx),
            },
            // The run is gone: nobody waits on the sender.
            None => drop(tx),
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
