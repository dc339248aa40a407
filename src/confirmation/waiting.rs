//! What the registry can tell an inbox: the pauses nobody has decided yet
//! ([`ConfirmationManager::waiting`]), without their data (the run's log
//! holds the request as it was sent).

use std::time::SystemTime;

use super::{ConfirmationManager, Entry};
use crate::protocol::PauseKind;
use crate::session::SessionKey;

/// A pause nobody has decided yet.
#[derive(Debug, Clone)]
pub struct Waiting {
    pub key: SessionKey,
    pub confirmation_id: String,
    pub kind: PauseKind,
    pub asked_at: SystemTime,
    pub expires_at: SystemTime,
}

impl ConfirmationManager {
    /// The undecided pauses of the sessions `mine` accepts, in no order.
    pub fn waiting(&self, mine: impl Fn(&SessionKey) -> bool) -> Vec<Waiting> {
        let registry = self.lock();
        registry
            .sessions
            .iter()
            .filter(|(key, entry)| entry.waits() && mine(key))
            .filter_map(|(key, entry): (&SessionKey, &Entry)| {
                let pause = entry.pause.as_ref()?;
                Some(Waiting {
                    key: key.clone(),
                    confirmation_id: pause.confirmation_id.clone(),
                    kind: pause.asking.kind(),
                    asked_at: pause.asked_at,
                    expires_at: pause.expires_at,
                })
            })
            .collect()
    }
}
