//! Who may use the chat endpoint: API keys, and which browser origins.
//!
//! - With API keys configured, every chat request needs
//!   `Authorization: Bearer <key>`. The key's position in the list is the
//!   run's owner; sessions live in their owner's namespace (see
//!   [`crate::confirmation::SessionKey`]), so one key can neither see nor
//!   touch another key's runs.
//! - Browsers: a request the browser marks `Sec-Fetch-Site: cross-site` is
//!   refused unless its `Origin` is on the `--cors-origin` allowlist; allowed
//!   origins get `Access-Control-Allow-Origin` (never `*`).

use std::path::Path;

use actix_web::http::header::{self, HeaderMap};

use crate::error::ChatError;

#[derive(Debug, Clone, Default)]
pub struct AccessPolicy {
    keys: Vec<String>,
    cors_origins: Vec<String>,
}

impl AccessPolicy {
    pub fn new(keys: Vec<String>, cors_origins: Vec<String>) -> AccessPolicy {
        AccessPolicy {
            keys: keys.into_iter().filter(|k| !k.is_empty()).collect(),
            cors_origins,
        }
    }

    pub fn requires_keys(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The owner of the request: `None` when keys are off, else the index of
    /// the presented key. A missing or unknown key is `Unauthorized`.
    pub fn owner(&self, headers: &HeaderMap) -> Result<Option<u32>, ChatError> {
        if self.keys.is_empty() {
            return Ok(None);
        }
        let presented = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .ok_or(ChatError::Unauthorized)?;
        // Every key is compared, each in constant time, so the time taken
        // says nothing about which key came close.
        let mut found = None;
        for (i, key) in self.keys.iter().enumerate() {
            if constant_time_eq(key.as_bytes(), presented.as_bytes()) {
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
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Reads API keys from a file: one per line; blank lines and `#` comments skipped.
pub fn read_keys_file(path: &Path) -> std::io::Result<Vec<String>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(str::to_owned)
        .collect())
}

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
        let policy = AccessPolicy::new(vec![], vec![]);
        assert_eq!(policy.owner(&headers(&[])).unwrap(), None);
    }

    #[test]
    fn with_keys_the_key_s_position_is_the_owner() {
        let policy = AccessPolicy::new(vec!["alpha".into(), "beta".into()], vec![]);
        assert_eq!(
            policy
                .owner(&headers(&[("authorization", "Bearer beta")]))
                .unwrap(),
            Some(1)
        );
        for bad in [
            &[][..],
            &[("authorization", "Bearer gamma")][..],
            &[("authorization", "beta")][..],
            &[("authorization", "Bearer ")][..],
        ] {
            assert!(matches!(
                policy.owner(&headers(bad)),
                Err(ChatError::Unauthorized)
            ));
        }
    }

    #[test]
    fn cross_site_requests_need_an_allowed_origin() {
        let policy = AccessPolicy::new(vec![], vec!["https://app.example".into()]);
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
}
