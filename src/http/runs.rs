//! `GET /api/v1/runs/{session_id}`: how the session's latest run ended, for
//! `--keep-outcome` after its end (an agent that started a run and left
//! reads it whenever it comes back): its final chunk, its pauses and who
//! decided them, and what ran. The caller's own namespace; an approver key,
//! which sees every namespace, names the run by one of its pauses
//! (`?confirmation_id=ID`).

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Value};

use super::access::Caller;
use super::error::ChatError;
use super::state::AppState;
use crate::protocol::{is_valid_session_id, meta, RequestError};
use crate::session::RunTag;
use crate::session::SessionKey;
use crate::store::Outcome;

/// The query string: an approver names a pause of the run.
#[derive(Debug, serde::Deserialize)]
pub struct ByPause {
    confirmation_id: Option<String>,
}

pub async fn outcome(
    req: HttpRequest,
    session_id: web::Path<String>,
    query: web::Query<ByPause>,
    state: web::Data<AppState>,
) -> HttpResponse {
    match read(&req, &session_id, query.confirmation_id.as_deref(), &state).await {
        Ok(response) => response,
        Err(err) => {
            state.runs.metrics().error(err.error_type());
            err.to_json_response()
        }
    }
}

async fn read(
    req: &HttpRequest,
    session_id: &str,
    confirmation_id: Option<&str>,
    state: &AppState,
) -> Result<HttpResponse, ChatError> {
    let headers = req.headers();
    let caller = state.access.json_caller(headers)?;
    if !is_valid_session_id(session_id) {
        return Err(RequestError::BadSessionId.into());
    }
    let outcome = match caller {
        Caller::Owner(owner) => {
            let key = SessionKey::new(owner, session_id);
            let outcome = state.runs.kept().outcome(&key).await;
            outcome.map_err(ChatError::store(Some(RunTag::session(&key))))?
        }
        Caller::Approver(_) => {
            let id = confirmation_id.ok_or(ChatError::ApproverWithoutConfirmationId)?;
            let outcome = state.runs.kept().outcome_by_pause(session_id, id).await;
            outcome.map_err(ChatError::store(None))?
        }
    }
    .ok_or(ChatError::NoSuchOutcome)?;
    let mut response = HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(described(&outcome));
    state.access.allow_origin(headers, &mut response);
    Ok(response)
}

/// An outcome as the endpoint shows it.
fn described(outcome: &Outcome) -> Value {
    let last = &outcome.final_chunk;
    let at = crate::clock::rfc3339_ms;
    let pauses: Vec<Value> = outcome
        .pauses
        .iter()
        .map(|pause| match &pause.decided {
            Some(decided) => {
                let mut shown = json!({
                    "confirmation_id": pause.confirmation_id,
                    "action": decided.action.as_str(),
                    "decided_by": decided.by,
                    "decided_at": at(decided.at_ms),
                });
                // A confirm names every approver (a quorum's, in order).
                if decided.action == crate::protocol::Action::Confirm {
                    shown["approved_by"] = match decided.approved_by.as_slice() {
                        [] => json!([decided.by]),
                        all => json!(all),
                    };
                }
                shown
            }
            None => json!({ "confirmation_id": pause.confirmation_id }),
        })
        .collect();
    json!({
        "session_id": outcome.session_id,
        "outcome": last.chunk_type,
        "reason": last.metadata.get(meta::REASON),
        "error_type": last.metadata.get(meta::ERROR_TYPE),
        "ended_at": at(outcome.ended_at_ms),
        "final_chunk": last,
        "pauses": pauses,
        "ran": outcome.ran,
    })
}
