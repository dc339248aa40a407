//! Who a session belongs to: the session id within the namespace of the API
//! key that started it ([`SessionKey`]), and how a store names that
//! namespace so that it survives a change of the keys' order
//! ([`Namespaces`]). Plain data, no I/O.

use std::sync::Arc;

/// Identifies a session: the session id within the
/// namespace of the API key that started it (`None` when keys are off).
/// Runs of one key are invisible to every other key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey {
    pub owner: Option<u32>,
    /// Shared: a run's key is held by the registry, the run, its log and its
    /// client stream, and every copy of a held run costs memory.
    pub session_id: Arc<str>,
}

impl SessionKey {
    pub fn new(owner: Option<u32>, session_id: &str) -> SessionKey {
        SessionKey {
            owner,
            session_id: Arc::from(session_id),
        }
    }
}

/// How a record names who acted: the API key's label (`key-2`, its place in
/// the list, never the key), or `anonymous` without keys.
pub fn owner_label(owner: Option<u32>) -> String {
    owner.map_or_else(|| "anonymous".to_owned(), |i| format!("key-{}", i + 1))
}

/// What every log line about a run starts with, so that one run's lines
/// (one decision's) can be found together: `session="demo-1" run=7
/// key=key-1` (the session as a JSON string, as the access log writes it;
/// the run's number in this process, when known).
#[derive(Debug, Clone, Copy)]
pub struct RunTag<'a> {
    pub key: &'a SessionKey,
    pub run: Option<u64>,
}

impl<'a> RunTag<'a> {
    pub fn of(key: &'a SessionKey, run: u64) -> RunTag<'a> {
        RunTag {
            key,
            run: Some(run),
        }
    }

    /// A session's, before (or without) a run of this process.
    pub fn session(key: &'a SessionKey) -> RunTag<'a> {
        RunTag { key, run: None }
    }
}

impl std::fmt::Display for RunTag<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let session = serde_json::Value::from(self.key.session_id.as_ref());
        write!(f, "session={session}")?;
        if let Some(run) = self.run {
            write!(f, " run={run}")?;
        }
        write!(f, " key={}", owner_label(self.key.owner))
    }
}

/// The stored names of the API keys' namespaces.
///
/// In memory a run's owner is its key's place in this process's list (see
/// [`SessionKey`]); that place changes when keys are added, removed or
/// reordered, between restarts or between replicas. What is stored names
/// the key instead: `k` and 32 hex digits of a SHA-256 of the key (the key
/// itself is never stored). So a stored run is only ever restored into its
/// own key's namespace, and one whose key is no longer configured is
/// reachable by nobody.
#[derive(Debug, Clone, Default)]
pub struct Namespaces {
    names: Arc<[String]>,
    /// Each key's `label=` from the keys file, if it has one.
    labels: Arc<[Option<String>]>,
}

impl Namespaces {
    /// The namespaces of `keys`, in their order (the owners' indices).
    pub fn of_keys<'a>(keys: impl IntoIterator<Item = &'a str>) -> Namespaces {
        use sha2::{Digest, Sha256};
        let names = keys
            .into_iter()
            .map(|key| {
                let digest = Sha256::new()
                    .chain_update(b"chatgate namespace\0")
                    .chain_update(key.as_bytes())
                    .finalize();
                format!("k{}", hex::encode(&digest[..16]))
            })
            .collect();
        Namespaces {
            names,
            labels: Arc::from(Vec::new()),
        }
    }

    /// The keys' labels (`label=`), in the keys' order.
    pub fn with_labels(mut self, labels: Vec<Option<String>>) -> Namespaces {
        self.labels = labels.into();
        self
    }

    /// What records name `owner`'s key by: its `label=`, else `key-N`
    /// (`anonymous` without keys).
    pub fn label(&self, owner: Option<u32>) -> String {
        owner
            .and_then(|i| self.labels.get(i as usize).cloned().flatten())
            .unwrap_or_else(|| owner_label(owner))
    }

    /// The stored name of `owner`'s namespace (`None`: no keys). An owner
    /// this table does not know (no server makes one) gets a name no key's
    /// namespace has, never another key's or the keyless one.
    pub fn name(&self, owner: Option<u32>) -> Option<String> {
        owner.map(|i| {
            self.names
                .get(i as usize)
                .cloned()
                .unwrap_or_else(|| format!("unknown-{i}"))
        })
    }

    /// Every owner: each key's place, or `None` without keys.
    pub fn owners(&self) -> Vec<Option<u32>> {
        if self.names.is_empty() {
            vec![None]
        } else {
            (0..self.names.len() as u32).map(Some).collect()
        }
    }

    /// The owner a stored `namespace` belongs to in this process, or
    /// `None` when no client can reach it now (its key is not configured;
    /// or it was stored without keys and keys are required now, or the
    /// other way round).
    pub fn owner(&self, namespace: Option<&str>) -> Option<Option<u32>> {
        match namespace {
            None if self.names.is_empty() => Some(None),
            None => None,
            Some(name) => self
                .names
                .iter()
                .position(|n| n == name)
                .map(|i| Some(i as u32)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_namespace_names_its_key_whatever_the_keys_order() {
        let before = Namespaces::of_keys(["alpha-key", "beta-key"]);
        let after = Namespaces::of_keys(["gamma-key", "beta-key"]);

        let beta = before.name(Some(1)).unwrap();
        assert_eq!(after.name(Some(1)).as_deref(), Some(beta.as_str()));
        assert_eq!(after.owner(Some(&beta)), Some(Some(1)));
        // alpha-key was removed: its runs are nobody's, not gamma-key's.
        let alpha = before.name(Some(0)).unwrap();
        assert_eq!(after.owner(Some(&alpha)), None);
        assert_ne!(alpha, beta);
        assert!(beta.starts_with('k') && beta.len() == 33);
        assert!(!beta.contains("beta"), "the key is never stored");
    }

    #[test]
    fn keyless_runs_belong_to_a_server_without_keys_only() {
        let keyless = Namespaces::of_keys([]);
        let keyed = Namespaces::of_keys(["alpha-key"]);

        assert_eq!(keyless.name(None), None);
        assert_eq!(keyless.owner(None), Some(None));
        assert_eq!(keyed.owner(None), None);
        assert_eq!(keyless.owner(keyed.name(Some(0)).as_deref()), None);
        // An index no key has is never another namespace.
        assert_eq!(keyed.name(Some(7)).as_deref(), Some("unknown-7"));
    }
}
