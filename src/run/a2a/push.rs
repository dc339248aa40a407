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
