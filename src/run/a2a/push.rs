//! A task's push deliveries: each of its updates POSTed to each of its
//! push configs, in order.

use serde_json::Value;
use tokio::sync::mpsc;

use crate::protocol::a2a::PushConfig;
use crate::session::{run_log, RunTag, SessionKey};

/// Delivers the updates `queue` brings to the configs `configs` names at
/// each: a POST of each update (a `StreamResponse`) with the config's
/// token (`X-A2A-Notification-Token`) and authentication; no redirect is
/// followed, a failed delivery is logged by the URL's origin only.
pub(super) async fn deliver(
    http: reqwest::Client,
    key: SessionKey,
    configs: impl Fn() -> Vec<PushConfig>,
    mut queue: mpsc::Receiver<Value>,
) {
    while let Some(event) = queue.recv().await {
        for config in configs() {
            let mut request = http
                .post(&config.url)
                .header("content-type", "application/a2a+json")
                .body(event.to_string());
            if let Some(token) = &config.token {
                request = request.header("X-A2A-Notification-Token", token);
            }
            if let Some(auth) = &config.authentication {
                let value = match &auth.credentials {
                    Some(credentials) => format!("{} {credentials}", auth.scheme),
                    None => auth.scheme.clone(),
                };
                request = request.header("authorization", value);
            }
            let outcome = request.send().await;
            let failed = match &outcome {
                Ok(response) if response.status().is_success() => None,
                Ok(response) => Some(format!("answered {}", response.status())),
                Err(err) => Some(crate::redact::request_error(err)),
            };
            if let Some(why) = failed {
                let origin = crate::redact::origin(&config.url);
                run_log!(Warn, RunTag::session(&key), "A2A push to {origin}: {why}");
            }
        }
    }
}

/// Whether `host` (a URL's, lower-case as a URL writes it) is one of
/// `allowed`: a name itself, a subdomain of a `*.` entry, an address
/// written the same (`[::1]` for IPv6). No entry: any host.
pub(super) fn host_allowed(allowed: &[String], host: &str) -> bool {
    allowed.is_empty()
        || allowed.iter().any(|entry| match entry.strip_prefix("*.") {
            Some(domain) => host
                .strip_suffix(domain)
                .is_some_and(|sub| sub.len() > 1 && sub.ends_with('.')),
            None => entry == host,
        })
}

#[cfg(test)]
mod tests {
    use super::host_allowed;

    #[test]
    fn push_hosts_match_names_subdomains_and_addresses_only() {
        let allowed: Vec<String> = [
            "hooks.example.com",
            "*.agents.example",
            "127.0.0.1",
            "[::1]",
        ]
        .map(String::from)
        .to_vec();
        for host in [
            "hooks.example.com",
            "a.agents.example",
            "b.c.agents.example",
            "127.0.0.1",
            "[::1]",
        ] {
            assert!(host_allowed(&allowed, host), "{host}");
        }
        for host in [
            "agents.example",
            "evilagents.example",
            "hooks.example.com.evil",
            "xhooks.example.com",
            "127.0.0.2",
            "localhost",
            "169.254.169.254",
        ] {
            assert!(!host_allowed(&allowed, host), "{host}");
        }
        assert!(host_allowed(&[], "169.254.169.254"), "no list: any host");
    }
}
