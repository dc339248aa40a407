//! The HTTP glue: handlers ([`routes`]), the error table ([`error`]), who may
//! call ([`access`]), per-connection deadlines ([`connection`]) and the
//! request log ([`access_log`]). Extract, validate, call [`crate::run`] or the
//! manager, respond: nothing else.

pub mod access;
pub mod access_log;
pub mod connection;
pub mod error;
pub mod routes;

use std::time::Duration;

use actix_web::HttpResponse;

use self::access::AccessPolicy;
use self::error::Refusal;
use crate::run::Runs;

pub use self::routes::configure;

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
