//! What a run left for later, as people ask for it: its kept outcome
//! (`--keep-outcome`: its final chunk and its pauses), and what decided a
//! pause, from its run's log while it lasts, a remembered note when the
//! log just went, then the kept outcome.

use std::sync::Arc;

use super::registry::ReplayRegistry;
use super::settings::RunSettings;
use crate::session::SessionKey;
use crate::store::{Outcome, PauseNote, StoreError};

/// The kept outcomes and decided pauses, looked up. Cheap-clone handle.
#[derive(Clone)]
pub struct Kept {
    settings: Arc<RunSettings>,
    replays: ReplayRegistry,
}

impl Kept {
    pub fn new(settings: Arc<RunSettings>, replays: ReplayRegistry) -> Kept {
        Kept { settings, replays }
    }
}

impl Kept {
    /// The kept outcome of `key`'s latest run that ended (`--keep-outcome`).
    pub async fn outcome(&self, key: &SessionKey) -> Result<Option<Outcome>, StoreError> {
        if self.settings.keep_outcome.is_zero() {
            return Ok(None);
        }
        let namespace = self.settings.namespaces.name(key.owner);
        self.settings
            .store
            .outcome(namespace.as_deref(), &key.session_id)
            .await
    }

    /// For an approver, who names a run by one of its pauses: the kept
    /// outcome of session `session_id`, in whichever namespace, whose run
    /// asked the pause `confirmation_id`.
    pub async fn outcome_by_pause(
        &self,
        session_id: &str,
        confirmation_id: &str,
    ) -> Result<Option<Outcome>, StoreError> {
        for owner in self.settings.namespaces.owners() {
            let key = SessionKey::new(owner, session_id);
            if let Some(outcome) = self.outcome(&key).await? {
                if outcome
                    .pauses
                    .iter()
                    .any(|p| p.confirmation_id == confirmation_id)
                {
                    return Ok(Some(outcome));
                }
            }
        }
        Ok(None)
    }

    /// For an approver's reply: the pause `confirmation_id` of session
    /// `session_id`, in whichever namespace, as its run's kept outcome
    /// noted it, when a reply decided it.
    pub async fn decided_by_pause(
        &self,
        session_id: &str,
        confirmation_id: &str,
    ) -> Option<PauseNote> {
        let outcome = self
            .outcome_by_pause(session_id, confirmation_id)
            .await
            .ok()??;
        outcome
            .pauses
            .into_iter()
            .find(|p| p.confirmation_id == confirmation_id && p.decided.is_some())
    }

    /// What decided the pause `confirmation_id` of the run on `key`, while
    /// its log or its kept outcome says.
    pub async fn decided_note(&self, key: &SessionKey, confirmation_id: &str) -> Option<PauseNote> {
        let logged = self
            .replays
            .find(key)
            .and_then(|log| log.decided(Some(confirmation_id)))
            .or_else(|| self.replays.remembered_decision(key, confirmation_id));
        match logged {
            Some(note) => Some(note),
            None => {
                self.decided_by_pause(&key.session_id, confirmation_id)
                    .await
            }
        }
    }
}
