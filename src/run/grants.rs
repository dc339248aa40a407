//! Live grants as their namespace's key (or an approver) sees them, and
//! their revoke: the store's at once for every replica, on the record
//! (`grant_revoked`) and announced (`grant.revoked`).

use std::sync::Arc;

use serde_json::Value;

use super::journal::{Entry, GrantEvent};
use super::settings::RunSettings;
use crate::session::{run_log, RunTag, SessionKey};
use crate::store::{Grant, StoreError};

/// Whose grants a caller sees.
#[derive(Debug, Clone)]
pub enum GrantsOf {
    /// A requester key's namespace (its place in the list; `None`: no keys).
    Namespace(Option<u32>),
    /// An approver: every namespace's (`None`), or those of the requester
    /// keys its `namespaces=` names (their labels), as its inbox is scoped.
    Approver(Option<Vec<String>>),
}

/// Live grants, an owned part of [`super::Runs`] (`runs.grants()`):
/// listed as a caller sees them, revoked, and whether a namespace holds
/// the most a reply may add to.
#[derive(Clone)]
pub struct Grants {
    settings: Arc<RunSettings>,
}

impl Grants {
    pub(super) fn new(settings: Arc<RunSettings>) -> Grants {
        Grants { settings }
    }

    /// Whether the namespace of `key` holds the most live grants (a store
    /// that cannot tell says no: the run's own add is bounded anyway).
    pub(super) async fn full(&self, key: &SessionKey) -> bool {
        let namespace = self.settings.namespaces.name(key.owner);
        let namespace = Grant::namespace_of(namespace.as_deref());
        self.settings
            .store
            .grants(Some(&namespace))
            .await
            .is_ok_and(|grants| grants.len() >= crate::store::grant::MAX_GRANTS_PER_NAMESPACE)
    }

    fn grants_namespace(&self, of: &GrantsOf) -> Option<String> {
        match of {
            GrantsOf::Namespace(owner) => {
                let name = self.settings.namespaces.name(*owner);
                Some(Grant::namespace_of(name.as_deref()))
            }
            GrantsOf::Approver(_) => None,
        }
    }

    /// The live grants `of` sees, newest first.
    async fn visible(&self, of: &GrantsOf) -> Result<Vec<Grant>, StoreError> {
        let namespace = self.grants_namespace(of);
        let mut grants = self.settings.store.grants(namespace.as_deref()).await?;
        if let GrantsOf::Approver(Some(labels)) = of {
            grants.retain(|grant| labels.contains(&grant.key));
        }
        Ok(grants)
    }

    /// The live grants `of` sees, newest first, as the API lists them.
    pub async fn list(&self, of: GrantsOf) -> Result<Vec<Value>, StoreError> {
        let grants = self.visible(&of).await?;
        Ok(grants.iter().map(Grant::view).collect())
    }

    /// Revokes grant `id` when `of` may see it (`Ok(false)`: no such grant
    /// for this caller). `by` and `client` say who, on the record.
    pub async fn revoke(
        &self,
        of: GrantsOf,
        id: &str,
        by: &str,
        client: Option<&str>,
    ) -> Result<bool, StoreError> {
        let store = &self.settings.store;
        let visible = self.visible(&of).await?;
        if !visible.iter().any(|grant| grant.id == id) {
            return Ok(false);
        }
        let Some(grant) = store.revoke_grant(id).await? else {
            return Ok(false);
        };
        let owner = self.settings.namespaces.owner(Some(&grant.namespace));
        let session =
            owner.map(|owner| RunTag::session(&SessionKey::new(owner, &grant.session_id)));
        run_log!(
            Info,
            session.as_ref(),
            "grant {id} of {} revoked by {by}",
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
