//! What every handler shares ([`AppState`]), and the one place a refused
//! request is counted and answered.

use std::time::Duration;

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
}

impl AppState {
    /// Counts a refused request and answers it: the one place refusals are
    /// counted.
    pub fn refuse(&self, refusal: Refusal) -> HttpResponse {
        let Refusal { error, session_id } = refusal;
        self.runs.metrics.error(error.error_type());
        if error.is_refused_reply() {
            self.runs.metrics.decision("reply", "refused");
        }
        error.to_response(&session_id)
    }
}
