//! Grants as stores keep them: a person's "allow this for a while", with a
//! budget of calls that every replica spends from atomically.
//!
//! A grant belongs to the namespace of the requester's key (its stored
//! name; `-` without keys) and covers later calls of its `tools` whose
//! arguments its matchers (`args`) accept, in its session (`scope =
//! session`) or every session of the key (`scope = key`), until it expires
//! or its calls are spent. It names each tool's parameters' hash: a tool
//! whose schema changed is not covered.

use std::collections::HashMap;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};

use crate::protocol::RiskLevel;

/// Most live grants one namespace may hold: the next is refused
/// (`too_many_grants`).
pub const MAX_GRANTS_PER_NAMESPACE: usize = 1_000;

/// Who a grant covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrantScope {
    /// The later runs of the session it was given in.
    Session,
    /// Every session of the requester's key.
    Key,
}

/// One grant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grant {
    pub id: String,
    pub scope: GrantScope,
    /// The stored name of the requester key's namespace (`-`: no keys).
    pub namespace: String,
    /// The requester key's label.
    pub key: String,
    /// The session it was given in (the one it covers, for `session`).
    pub session_id: String,
    pub tools: Vec<String>,
    /// Rule matchers over the arguments, as given.
    pub args: Map<String, Value>,
    /// The SHA-256 of each tool's parameters, in the order of `tools`.
    pub schemas: Vec<String>,
    pub created_at_ms: u64,
    pub expires_at_ms: u64,
    pub max_calls: u32,
    /// What is left (the store's count is the one that counts).
    pub calls_left: u32,
    /// Who granted it: the deciding key's label.
    pub granted_by: String,
    /// The highest risk the granting key may decide (`max_risk=`): the
    /// grant covers no call above it (grants of older versions: any).
    #[serde(default = "any_risk")]
    pub max_risk: RiskLevel,
}

fn any_risk() -> RiskLevel {
    RiskLevel::High
}

impl Grant {
    /// The stored name of a namespace as grants keep it.
    pub fn namespace_of(namespace: Option<&str>) -> String {
        namespace.unwrap_or("-").to_owned()
    }

    pub fn is_live(&self, now_ms: u64) -> bool {
        self.expires_at_ms > now_ms && self.calls_left > 0
    }

    /// Whether it may cover a call in session `session_id` (of its
    /// namespace) of `tool` whose parameters hash to `schema`; its
    /// matchers are the caller's to check.
    pub fn covers(&self, session_id: &str, tool: &str, schema: &str) -> bool {
        (self.scope == GrantScope::Key || self.session_id == session_id)
            && self
                .tools
                .iter()
                .zip(&self.schemas)
                .any(|(name, hash)| name == tool && hash == schema)
    }

    /// As `GET /api/v1/grants` lists it.
    pub fn view(&self) -> Value {
        let time = crate::clock::rfc3339_ms;
        json!({
            "id": self.id,
            "scope": self.scope,
            "session_id": self.session_id,
            "key": self.key,
            "tools": self.tools,
            "args": self.args,
            "created_at": time(self.created_at_ms),
            "expires_at": time(self.expires_at_ms),
            "max_calls": self.max_calls,
            "calls_left": self.calls_left,
            "granted_by": self.granted_by,
            "max_risk": self.max_risk,
        })
    }
}

/// The grants of a store of one process (the memory store's).
#[derive(Debug, Default)]
pub struct MemoryGrants {
    by_id: Mutex<HashMap<String, Grant>>,
}

impl MemoryGrants {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Grant>> {
        // Plain data; a panic elsewhere leaves nothing half-done.
        self.by_id.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds `grant` unless its namespace holds the most live ones already.
    pub fn add(&self, grant: &Grant, now_ms: u64) -> bool {
        let mut grants = self.lock();
        grants.retain(|_, g| g.is_live(now_ms));
        let live = grants
            .values()
            .filter(|g| g.namespace == grant.namespace)
            .count();
        if live >= MAX_GRANTS_PER_NAMESPACE {
            return false;
        }
        grants.insert(grant.id.clone(), grant.clone());
        true
    }

    /// The live grants of `namespace` (`None`: every namespace), newest first.
    pub fn list(&self, namespace: Option<&str>, now_ms: u64) -> Vec<Grant> {
        let mut grants = self.lock();
        grants.retain(|_, g| g.is_live(now_ms));
        let mut listed: Vec<Grant> = grants
            .values()
            .filter(|g| namespace.is_none_or(|ns| g.namespace == ns))
            .cloned()
            .collect();
        newest_first(&mut listed);
        listed
    }

    /// Uses one call of grant `id`: the calls left after it, or `None` when
    /// it is gone, expired or spent.
    pub fn take(&self, id: &str, now_ms: u64) -> Option<u32> {
        let mut grants = self.lock();
        let grant = grants.get_mut(id).filter(|g| g.is_live(now_ms))?;
        grant.calls_left -= 1;
        Some(grant.calls_left)
    }

    pub fn revoke(&self, id: &str) -> Option<Grant> {
        self.lock().remove(id)
    }
}

/// Newest first (by creation, then id, so the order is stable).
pub fn newest_first(grants: &mut [Grant]) {
    grants.sort_by(|a, b| {
        b.created_at_ms
            .cmp(&a.created_at_ms)
            .then_with(|| b.id.cmp(&a.id))
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grant(id: &str, namespace: &str, created: u64) -> Grant {
        Grant {
            id: id.into(),
            scope: GrantScope::Session,
            namespace: namespace.into(),
            key: "key-1".into(),
            session_id: "s".into(),
            tools: vec!["deploy".into()],
            args: Map::new(),
            schemas: vec!["h".into()],
            created_at_ms: created,
            expires_at_ms: 10_000,
            max_calls: 2,
            calls_left: 2,
            granted_by: "key-1".into(),
            max_risk: RiskLevel::Medium,
        }
    }

    #[test]
    fn calls_are_spent_one_at_a_time_and_expiry_ends_a_grant() {
        let grants = MemoryGrants::default();
        assert!(grants.add(&grant("a", "n", 1), 0));
        assert_eq!(grants.take("a", 5), Some(1));
        assert_eq!(grants.take("a", 5), Some(0));
        assert_eq!(grants.take("a", 5), None, "spent");
        assert!(grants.add(&grant("b", "n", 2), 0));
        assert_eq!(grants.take("b", 10_000), None, "expired");
        assert!(grants.list(None, 10_000).is_empty());
    }

    #[test]
    fn a_namespace_holds_at_most_so_many_live_grants_and_lists_newest_first() {
        let grants = MemoryGrants::default();
        for n in 0..MAX_GRANTS_PER_NAMESPACE {
            assert!(grants.add(&grant(&format!("g{n}"), "n", n as u64), 0));
        }
        assert!(!grants.add(&grant("over", "n", 0), 0));
        assert!(grants.add(&grant("other", "m", 0), 0), "per namespace");
        let listed = grants.list(Some("n"), 0);
        assert_eq!(listed.len(), MAX_GRANTS_PER_NAMESPACE);
        assert_eq!(listed[0].id, format!("g{}", MAX_GRANTS_PER_NAMESPACE - 1));
        assert!(grants.revoke("g0").is_some());
        assert!(grants.add(&grant("over", "n", 0), 0), "room again");
    }

    #[test]
    fn a_grant_covers_its_session_or_its_key_and_only_the_schema_it_saw() {
        let mut g = grant("a", "n", 1);
        assert!(g.covers("s", "deploy", "h"));
        assert!(!g.covers("t", "deploy", "h"), "another session");
        assert!(!g.covers("s", "deploy", "changed"), "another schema");
        assert!(!g.covers("s", "other", "h"));
        g.scope = GrantScope::Key;
        assert!(g.covers("t", "deploy", "h"));
    }
}
