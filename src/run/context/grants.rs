//! Grants for a run: keeping the one a confirm gives (store, then the
//! `granted` audit record and the `grant.created` webhook, before the run
//! goes on), and spending one call of a live grant that covers a call the
//! run would otherwise ask about.

use serde_json::Value;

use super::RunContext;
use crate::pause::grant::GrantSpec;
use crate::protocol::{meta, ApprovedBy, ChunkType};
use crate::run::journal::GrantEvent;
use crate::run::outcome::RunError;
use crate::session::run_log;
use crate::store::{Grant, GrantScope};
use crate::tools::rules::{all_match, matchers_of_json};
use crate::tools::Tool;

impl RunContext {
    /// The stored name of the requester's namespace, as grants keep it.
    fn grant_namespace(&self) -> String {
        let name = self.settings.namespaces.name(self.session_key().owner);
        Grant::namespace_of(name.as_deref())
    }

    /// Keeps the grant `spec` given on pause `confirmation_id`: in the
    /// store, then on the record (an unwritable audit log takes it back
    /// and ends the run), announced, and shown on the stream. A store that
    /// cannot keep it (or a namespace that holds the most grants) is shown
    /// too; the decision stands either way.
    pub(crate) async fn keep_grant(
        &mut self,
        (spec, confirmation_id): (GrantSpec, String),
    ) -> Result<(), RunError> {
        let now = crate::clock::now_ms();
        let grant = Grant {
            id: uuid::Uuid::new_v4().to_string(),
            scope: spec.scope,
            namespace: self.grant_namespace(),
            key: self.key_label(),
            session_id: self.session_id().to_owned(),
            tools: spec.tools,
            args: spec.args,
            schemas: spec.schemas,
            created_at_ms: now,
            expires_at_ms: now + spec.ttl.as_millis() as u64,
            max_calls: spec.max_calls,
            calls_left: spec.max_calls,
            granted_by: spec.granted_by,
            max_risk: spec.max_risk,
        };
        let store = self.settings.store.clone();
        let not_kept = match store.add_grant(&grant).await {
            Ok(true) => None,
            Ok(false) => Some(format!(
                "the key's namespace holds {} live grants already",
                crate::store::grant::MAX_GRANTS_PER_NAMESPACE
            )),
            Err(err) => {
                run_log!(Error, self.tag(), "cannot keep a grant: {err}");
                Some("the store cannot keep it now".to_owned())
            }
        };
        if let Some(why) = not_kept {
            let text = format!("Not granted: {why}; later calls will be asked");
            return self.emit(ChunkType::Status, text).await;
        }
        let created = GrantEvent::Created {
            run: self.subject(),
            grant: &grant,
            confirmation_id: &confirmation_id,
        };
        let entry = self.settings.journal().grant(created);
        if let Err(err) = self.audit(entry.audit.as_ref()).await {
            let _ = store.revoke_grant(&grant.id).await;
            return Err(err);
        }
        self.settings.announce(&entry.events).await;
        let whom = match grant.scope {
            GrantScope::Session => "this session",
            GrantScope::Key => "every session of this key",
        };
        let text = format!(
            "Granted: {} for {whom} for {}, up to {} call(s) (grant {})",
            grant.tools.join(", "),
            humantime::format_duration(std::time::Duration::from_secs(
                (grant.expires_at_ms - grant.created_at_ms) / 1000
            )),
            grant.max_calls,
            grant.id
        );
        let chunk = self
            .chunk(ChunkType::Status, text)
            .with_meta(meta::GRANT, grant.view());
        self.send(chunk).await
    }

    /// One call of a live grant that covers a call of `tool` with `args`
    /// in this session: spent (atomically, for every replica), it names
    /// the grant; `None` when no grant covers the call or all that do are
    /// spent. A store that cannot answer covers nothing (the call is asked).
    pub(crate) async fn spend_grant(
        &mut self,
        tool: &Tool,
        args: &Value,
        risk: crate::protocol::RiskLevel,
    ) -> Option<ApprovedBy> {
        if !tool.grantable {
            return None;
        }
        let store = self.settings.store.clone();
        let namespace = self.grant_namespace();
        let grants = match store.grants(Some(&namespace)).await {
            Ok(grants) => grants,
            Err(err) => {
                run_log!(Error, self.tag(), "cannot look up grants: {err}");
                return None;
            }
        };
        // Oldest first: the grant that runs out first is spent first.
        for grant in grants.iter().rev() {
            // Never a call above what its granting key may decide itself.
            if !grant.covers(self.session_id(), &tool.name, &tool.schema_hash)
                || !crate::decider::within(risk, grant.max_risk)
            {
                continue;
            }
            let fits = matchers_of_json(&grant.args)
                .map(|matchers| all_match(&matchers, args))
                .unwrap_or(false);
            if !fits {
                continue;
            }
            match store.take_grant_call(&grant.id).await {
                Ok(Some(_)) => {
                    self.note_granted(super::cleared::Granted {
                        id: grant.id.clone(),
                        granted_by: grant.granted_by.clone(),
                        created_at_ms: grant.created_at_ms,
                    });
                    return Some(ApprovedBy::Grant(grant.id.clone()));
                }
                Ok(None) => continue,
                Err(err) => {
                    run_log!(Error, self.tag(), "cannot spend a grant's call: {err}");
                    return None;
                }
            }
        }
        None
    }
}
