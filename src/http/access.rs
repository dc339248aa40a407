//! Who may use the chat endpoint: API keys, and which browser origins.
//!
//! - With API keys configured, every chat request needs
//!   `Authorization: Bearer <key>`. The key's position in the list is the
//!   run's owner; sessions live in their owner's namespace (see
//!   [`crate::session::SessionKey`]), so one key can neither see nor
//!   touch another key's runs.
//! - Approver keys (`--approver-key`) belong to no namespace: such a key
//!   may list and decide every namespace's pending pauses and re-attach to
//!   them, each named by its confirmation id, but not start runs
//!   ([`Caller::Approver`]).
//! - Browsers: a request the browser marks `Sec-Fetch-Site: cross-site` is
//!   refused unless its `Origin` is on the `--cors-origin` allowlist; allowed
//!   origins get `Access-Control-Allow-Origin` (never `*`).
//! - DNS rebinding: without keys, the `Host` header must name loopback
//!   (`localhost`, `*.localhost`, a loopback IP), the bound address, or an
//!   `--allowed-host`. A page whose own name an attacker points at 127.0.0.1
//!   sends its own name as Host, so it is refused. (With keys, the key is
//!   what a page on another name cannot have.)

use std::net::{IpAddr, SocketAddr};

use actix_web::http::header::{self, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::ChatError;

/// SHA-256 of a key: what the policy keeps and compares, so comparisons
/// take the same time whatever the lengths, and no key sits in memory as text.
type KeyDigest = [u8; 32];

/// Who a request comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// A key's namespace (its place in the list), or `None` without keys.
    Owner(Option<u32>),
    /// The approver key at this place in the approvers' list.
    Approver(u32),
}

impl Caller {
    /// The label records and listings show: `key-N`, `approver-N` or
    /// `anonymous`.
    pub fn label(self) -> String {
        match self {
            Caller::Owner(owner) => crate::session::owner_label(owner),
            Caller::Approver(i) => format!("approver-{}", i + 1),
        }
    }
}

#[derive(Debug, Clone)]
pub struct AccessPolicy {
    key_digests: Vec<KeyDigest>,
    approver_digests: Vec<KeyDigest>,
    /// Each key's keys-file attributes (labels, groups, scopes), in order.
    key_attrs: Vec<KeyAttrs>,
    approver_attrs: Vec<KeyAttrs>,
    cors_origins: Vec<String>,
    /// Lower-cased host names accepted besides loopback and the bound address.
    allowed_hosts: Vec<String>,
    bound: IpAddr,
}

impl AccessPolicy {
    /// A policy for `keys` (none: the endpoint is open), in order: a key's
    /// place in the list is its owner.
    pub fn new(keys: &[&str], cors_origins: Vec<String>) -> AccessPolicy {
        AccessPolicy {
            key_digests: keys.iter().copied().map(digest).collect(),
            approver_digests: Vec::new(),
            key_attrs: Vec::new(),
            approver_attrs: Vec::new(),
            cors_origins,
            allowed_hosts: Vec::new(),
            bound: IpAddr::from([127, 0, 0, 1]),
        }
    }

    /// Accepts `Host` values naming `bound` (the listening address) or one
    /// of `allowed_hosts`, besides loopback names.
    pub fn with_hosts(mut self, bound: SocketAddr, allowed_hosts: &[String]) -> AccessPolicy {
        self.bound = bound.ip();
        self.allowed_hosts = allowed_hosts
            .iter()
            .map(|host| normalize_host(host).to_owned())
            .filter(|host| !host.is_empty())
            .collect();
        self
    }

    /// Adds approver keys (see [`Caller::Approver`]).
    pub fn with_approvers(mut self, approvers: &[&str]) -> AccessPolicy {
        self.approver_digests = approvers.iter().copied().map(digest).collect();
        self
    }

    /// The keys' attributes (from the keys file), in the keys' order; a
    /// key without any has the defaults.
    pub fn with_attributes(
        mut self,
        keys: Vec<KeyAttrs>,
        approvers: Vec<KeyAttrs>,
    ) -> AccessPolicy {
        self.key_attrs = keys;
        self.approver_attrs = approvers;
        self
    }

    fn attrs(&self, caller: Caller) -> Option<&KeyAttrs> {
        match caller {
            Caller::Owner(Some(i)) => self.key_attrs.get(i as usize),
            Caller::Owner(None) => None,
            Caller::Approver(i) => self.approver_attrs.get(i as usize),
        }
    }

    /// What records name `caller` by: its `label=`, else its place label.
    pub fn label(&self, caller: Caller) -> String {
        self.attrs(caller)
            .and_then(|attrs| attrs.label.clone())
            .unwrap_or_else(|| caller.label())
    }

    /// The approvers, as decision links name and scope them.
    pub fn people(&self) -> Vec<crate::notify::links::Person> {
        (0..self.approver_digests.len())
            .map(|i| {
                let caller = Caller::Approver(i as u32);
                let attrs = self.attrs(caller).cloned().unwrap_or_default();
                crate::notify::links::Person {
                    label: self.label(caller),
                    groups: attrs.groups,
                    max_risk: attrs.max_risk,
                    namespaces: attrs.namespaces,
                    email: attrs.email,
                }
            })
            .collect()
    }

    /// The caller whose records name it `label` (labels are unique): a
    /// decision link decides as it.
    pub fn caller_of_label(&self, label: &str) -> Option<Caller> {
        let owners = (0..self.key_digests.len()).map(|i| Caller::Owner(Some(i as u32)));
        let approvers = (0..self.approver_digests.len()).map(|i| Caller::Approver(i as u32));
        let anonymous = (!self.requires_keys()).then_some(Caller::Owner(None));
        owners
            .chain(approvers)
            .chain(anonymous)
            .find(|caller| self.label(*caller) == label)
    }

    /// The approver whose keys-file line says `slack=<user_id>`.
    /// How many approver keys a Slack user id maps to (`slack=`).
    pub fn slack_people(&self) -> usize {
        self.approver_attrs
            .iter()
            .filter(|attrs| attrs.slack.is_some())
            .count()
    }

    pub fn caller_of_slack(&self, user_id: &str) -> Option<Caller> {
        (0..self.approver_attrs.len() as u32)
            .map(Caller::Approver)
            .find(|caller| {
                self.attrs(*caller)
                    .and_then(|a| a.slack.as_deref())
                    .is_some_and(|id| id == user_id)
            })
    }

    /// `caller` as the decision path checks it.
    pub fn decider(&self, caller: Caller) -> crate::confirmation::Decider {
        let attrs = self.attrs(caller);
        crate::confirmation::Decider {
            label: self.label(caller),
            groups: attrs.map(|a| a.groups.clone()).unwrap_or_default(),
            max_risk: attrs
                .and_then(|a| a.max_risk)
                .unwrap_or(crate::protocol::RiskLevel::High),
            requester: matches!(caller, Caller::Owner(_)),
        }
    }

    /// Whether `caller` may see and decide the pauses of the namespace of
    /// `owner`: its own, or, for an approver, any of its `namespaces=`
    /// (requester key labels; all without).
    pub fn may_see(&self, caller: Caller, owner: Option<u32>) -> bool {
        match caller {
            Caller::Owner(own) => own == owner,
            Caller::Approver(_) => match self.attrs(caller).and_then(|a| a.namespaces.as_ref()) {
                None => true,
                Some(labels) => labels.contains(&self.label(Caller::Owner(owner))),
            },
        }
    }

    /// An approver's `namespaces=` (requester key labels), `None` for
    /// every namespace (and for a requester key).
    pub fn namespaces(&self, caller: Caller) -> Option<Vec<String>> {
        match caller {
            Caller::Owner(_) => None,
            Caller::Approver(_) => self.attrs(caller).and_then(|a| a.namespaces.clone()),
        }
    }

    pub fn requires_keys(&self) -> bool {
        !self.key_digests.is_empty()
    }

    /// A `GET` of a JSON endpoint (the inbox, the tools, an outcome): its
    /// `Host` and `Origin` checked, then who it comes from.
    pub fn json_caller(&self, headers: &HeaderMap) -> Result<Caller, ChatError> {
        self.check_host(headers)?;
        self.check_origin(headers)?;
        self.caller(headers)
    }

    /// Who the request comes from: an approver when it presents an
    /// approver key, else its owner as [`AccessPolicy::owner`] says.
    pub fn caller(&self, headers: &HeaderMap) -> Result<Caller, ChatError> {
        if !self.approver_digests.is_empty() {
            let presented = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(bearer_token)
                .map(digest);
            if let Some(presented) = presented {
                let mut found = None;
                for (i, key) in self.approver_digests.iter().enumerate() {
                    if bool::from(key.ct_eq(&presented)) {
                        found = Some(i as u32);
                    }
                }
                if let Some(i) = found {
                    return Ok(Caller::Approver(i));
                }
            }
        }
        self.owner(headers).map(Caller::Owner)
    }

    /// Without keys, refuses a `Host` that could be a rebound DNS name (see
    /// the module docs). A request without `Host` (HTTP/1.0) is not a
    /// browser's and passes.
    pub fn check_host(&self, headers: &HeaderMap) -> Result<(), ChatError> {
        if self.requires_keys() {
            return Ok(());
        }
        let Some(value) = headers.get(header::HOST) else {
            return Ok(());
        };
        let host = value.to_str().map(normalize_host).unwrap_or_default();
        let allowed = match host.parse::<IpAddr>() {
            // A literal address can only reach us if it is one of ours:
            // rebinding needs a name.
            Ok(ip) => ip.is_loopback() || ip == self.bound || self.bound.is_unspecified(),
            Err(_) => {
                host == "localhost"
                    || host.ends_with(".localhost")
                    || self.allowed_hosts.contains(&host)
            }
        };
        if allowed {
            Ok(())
        } else {
            Err(ChatError::ForbiddenHost)
        }
    }

    /// The owner of the request: `None` when keys are off, else the index of
    /// the presented key. A missing or unknown key is `Unauthorized`.
    pub fn owner(&self, headers: &HeaderMap) -> Result<Option<u32>, ChatError> {
        if self.key_digests.is_empty() {
            return Ok(None);
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_token)
            .ok_or(ChatError::Unauthorized)?;
        // Digests have one length, and every key is compared in constant
        // time, so the time taken says nothing about which key came close,
        // nor how long it is.
        let presented = digest(presented);
        let mut found = None;
        for (i, key) in self.key_digests.iter().enumerate() {
            if bool::from(key.ct_eq(&presented)) {
                found = Some(i as u32);
            }
        }
        found.map(Some).ok_or(ChatError::Unauthorized)
    }

    /// Refuses cross-site browser requests from origins not on the allowlist.
    pub fn check_origin(&self, headers: &HeaderMap) -> Result<(), ChatError> {
        let cross_site = headers
            .get("sec-fetch-site")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site"));
        if cross_site && self.allowed_origin(headers).is_none() {
            return Err(ChatError::ForbiddenOrigin);
        }
        Ok(())
    }

    /// The request's `Origin` when it is on the allowlist.
    pub fn allowed_origin<'h>(&self, headers: &'h HeaderMap) -> Option<&'h str> {
        let origin = headers.get(header::ORIGIN)?.to_str().ok()?;
        self.cors_origins
            .iter()
            .any(|allowed| allowed == origin)
            .then_some(origin)
    }

    /// A JSON endpoint's answer to an allowed cross-site request carries
    /// `Access-Control-Allow-Origin` (and `Vary: Origin`).
    pub fn allow_origin(&self, headers: &HeaderMap, response: &mut actix_web::HttpResponse) {
        let Some(origin) = self.allowed_origin(headers) else {
            return;
        };
        if let Ok(value) = header::HeaderValue::from_str(origin) {
            let headers = response.headers_mut();
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
            headers.insert(header::VARY, header::HeaderValue::from_static("Origin"));
        }
    }
}

fn digest(key: &str) -> KeyDigest {
    Sha256::digest(key.as_bytes()).into()
}

/// The token of `Bearer <token>`; the scheme in any letter case (RFC 7235).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The host name of a `Host` value: the port and a trailing dot removed,
/// brackets of an IPv6 literal removed, lower-cased.
fn normalize_host(value: &str) -> String {
    let value = value.trim();
    let name = if let Some(rest) = value.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default()
    } else {
        match value.rsplit_once(':') {
            Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
            _ => value,
        }
    };
    name.trim_end_matches('.').to_ascii_lowercase()
}

pub use super::keys::{read_keys_file, KeyAttrs, KeysFile};

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        map
    }

    #[test]
    fn without_keys_everyone_is_the_same_anonymous_owner() {
        let policy = AccessPolicy::new(&[], vec![]);
        assert_eq!(policy.owner(&headers(&[])).unwrap(), None);
    }

    #[test]
    fn with_keys_the_key_s_position_is_the_owner() {
        let policy = AccessPolicy::new(&["alpha", "beta"], vec![]);
        for good in ["Bearer beta", "bearer beta", "BEARER  beta "] {
            let owner = policy.owner(&headers(&[("authorization", good)])).unwrap();
            assert_eq!(owner, Some(1), "{good:?}");
        }
        for bad in [
            &[][..],
            &[("authorization", "Bearer gamma")][..],
            &[("authorization", "Bearer betabeta")][..],
            &[("authorization", "beta")][..],
            &[("authorization", "Bearer ")][..],
            &[("authorization", "Basic beta")][..],
        ] {
            assert!(matches!(
                policy.owner(&headers(bad)),
                Err(ChatError::Unauthorized)
            ));
        }
    }

    #[test]
    fn an_approver_key_is_told_from_the_namespaces_keys() {
        let policy = AccessPolicy::new(&["alpha"], vec![]).with_approvers(&["boss", "deputy"]);
        let caller = |value: &'static str| policy.caller(&headers(&[("authorization", value)]));
        assert_eq!(caller("Bearer deputy").unwrap(), Caller::Approver(1));
        assert_eq!(caller("Bearer alpha").unwrap(), Caller::Owner(Some(0)));
        assert!(matches!(
            caller("Bearer bossy"),
            Err(ChatError::Unauthorized)
        ));
        assert_eq!(Caller::Approver(1).label(), "approver-2");
        assert_eq!(Caller::Owner(Some(0)).label(), "key-1");
    }

    #[test]
    fn a_keys_file_names_approver_keys_by_their_word() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(
            &path,
            "# keys\nalpha\n\napprover   boss\napproverkey\nbeta\n",
        )
        .unwrap();
        let file = read_keys_file(&path).unwrap();
        assert_eq!(file.keys, ["alpha", "approverkey", "beta"]);
        assert_eq!(file.approvers, ["boss"]);
    }

    #[test]
    fn cross_site_requests_need_an_allowed_origin() {
        let policy = AccessPolicy::new(&[], vec!["https://app.example".into()]);
        assert!(policy.check_origin(&headers(&[])).is_ok());
        assert!(policy
            .check_origin(&headers(&[("sec-fetch-site", "same-origin")]))
            .is_ok());
        assert!(policy
            .check_origin(&headers(&[
                ("sec-fetch-site", "cross-site"),
                ("origin", "https://app.example")
            ]))
            .is_ok());
        assert!(matches!(
            policy.check_origin(&headers(&[
                ("sec-fetch-site", "cross-site"),
                ("origin", "https://evil.example")
            ])),
            Err(ChatError::ForbiddenOrigin)
        ));
    }

    #[test]
    fn without_keys_only_loopback_the_bound_address_and_allowed_hosts_pass() {
        let bound: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let policy =
            AccessPolicy::new(&[], vec![]).with_hosts(bound, &["Chat.Example.com".to_owned()]);
        let host = |value: &'static str| policy.check_host(&headers(&[("host", value)]));
        for good in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LOCALHOST",
            "app.localhost:3000",
            "[::1]:8080",
            "127.0.0.2",
            "chat.example.com",
            "chat.example.com.:443",
        ] {
            assert!(host(good).is_ok(), "{good}");
        }
        for bad in [
            "rebind.attacker.example:8080",
            "10.0.0.5:8080",
            "localhost.evil",
            "",
        ] {
            assert!(matches!(host(bad), Err(ChatError::ForbiddenHost)), "{bad}");
        }
        assert!(
            policy.check_host(&headers(&[])).is_ok(),
            "no Host: not a browser"
        );

        let keyed = AccessPolicy::new(&["k"], vec![]).with_hosts(bound, &[]);
        assert!(keyed
            .check_host(&headers(&[("host", "rebind.attacker.example")]))
            .is_ok());
    }
}
