//! What every handler shares ([`AppState`]), and the one place a refused
//! request is counted and answered.

use std::sync::Arc;
use std::time::Duration;

use secrecy::SecretString;

use actix_web::HttpResponse;

use super::access::AccessPolicy;
use super::error::Refusal;
use crate::run::Runs;

/// What every handler shares. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    pub runs: Runs,
    pub access: AccessPolicy,
    /// Time allowed to receive a request body.
    pub request_timeout: Duration,
    /// `--slack-signing-secret`: Slack's button presses are taken.
    pub slack: Option<Arc<SlackApp>>,
    /// The A2A face's tasks.
    pub a2a: Arc<crate::run::a2a::A2aTasks>,
    /// `--public-url`: where clients reach this server (the agent card's
    /// URL); without it, the request's own scheme and host.
    pub public_url: Option<String>,
}

/// The Slack app whose buttons chatgate takes.
pub struct SlackApp {
    /// Its signing secret.
    pub signing_secret: SecretString,
    /// For the messages' `response_url` updates.
    pub http: reqwest::Client,
}

impl AppState {
    /// Counts a refused request and answers it: the one place refusals are
    /// counted.
    pub fn refuse(&self, refusal: Refusal) -> HttpResponse {
        let Refusal { error, session_id } = refusal;
        self.runs.metrics().error(error.error_type());
        if error.is_refused_reply() {
            self.runs.metrics().decision("reply", "refused");
        }
        error.to_response(&session_id)
    }
}
