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
    /// The session whose run holds (or held, while the run lives on) the
    /// pause `confirmation_id`, whatever its namespace: what an approver
    /// names a pause by. A scan, under the registry's lock: approvers act
    /// at a person's pace.
    pub fn find_pause(&self, confirmation_id: &str) -> Option<SessionKey> {
        let registry = self.lock();
        registry
            .sessions
            .iter()
            .find(|(_, entry)| {
                entry
                    .pause
                    .as_ref()
                    .is_some_and(|pause| pause.confirmation_id == confirmation_id)
            })
            .map(|(key, _)| key.clone())
    }

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
