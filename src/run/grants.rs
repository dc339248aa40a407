//! Live grants as their namespace's key (or an approver) sees them, and
//! their revoke: the store's at once for every replica, on the record
//! (`grant_revoked`) and announced (`grant.revoked`).

use serde_json::Value;

use super::journal::{Entry, GrantEvent};
use super::Runs;
use crate::store::{Grant, StoreError};

/// Whose grants a caller sees.
#[derive(Debug, Clone, Copy)]
pub enum GrantsOf {
    /// A requester key's namespace (its place in the list; `None`: no keys).
    Namespace(Option<u32>),
    /// An approver: every namespace's.
    Every,
}

impl Runs {
    fn grants_namespace(&self, of: GrantsOf) -> Option<String> {
        match of {
            GrantsOf::Namespace(owner) => {
                let name = self.settings.namespaces.name(owner);
                Some(Grant::namespace_of(name.as_deref()))
            }
            GrantsOf::Every => None,
        }
    }

    /// The live grants `of` sees, newest first, as the API lists them.
    pub async fn grants(&self, of: GrantsOf) -> Result<Vec<Value>, StoreError> {
        let namespace = self.grants_namespace(of);
        let grants = self.settings.store.grants(namespace.as_deref()).await?;
        Ok(grants.iter().map(Grant::view).collect())
    }

    /// Revokes grant `id` when `of` may see it (`Ok(false)`: no such grant
    /// for this caller). `by` and `client` say who, on the record.
    pub async fn revoke_grant(
        &self,
        of: GrantsOf,
        id: &str,
        by: &str,
        client: Option<&str>,
    ) -> Result<bool, StoreError> {
        let namespace = self.grants_namespace(of);
        let store = &self.settings.store;
        let visible = store.grants(namespace.as_deref()).await?;
        if !visible.iter().any(|grant| grant.id == id) {
            return Ok(false);
        }
        let Some(grant) = store.revoke_grant(id).await? else {
            return Ok(false);
        };
        log::info!(
            "session={:?} key={} grant {id} revoked by {by}",
            grant.session_id,
            grant.key
        );
        let revoked = GrantEvent::Revoked {
            grant: &grant,
            by,
            client,
        };
        let journal = self.settings.journal();
        let Entry { audit, events, .. } = journal.grant(revoked);
        // The grant is gone either way: revoking is always safe.
        let _ = journal.audit(audit.as_ref()).await;
        self.settings.announce(&events).await;
        Ok(true)
    }
}
