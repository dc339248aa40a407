//! `GET /api/v1/interactions`: the inbox. Extract, check who may call,
//! read the page asked for, one call below HTTP ([`crate::run::Runs::inbox`]),
//! respond with JSON. Refusals are JSON too (`error_type`, `message`),
//! with the error table's status.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::access::Caller;
use super::error::ChatError;
use super::state::AppState;
use crate::run::inbox::{InboxQuery, INBOX_LIMIT, MAX_INBOX_LIMIT};

/// The query string, as sent.
#[derive(Debug, Deserialize)]
pub struct RawQuery {
    limit: Option<String>,
    after: Option<String>,
}

pub async fn interactions(
    req: HttpRequest,
    query: Result<web::Query<RawQuery>, actix_web::Error>,
    state: web::Data<AppState>,
) -> HttpResponse {
    match list(&req, query, &state).await {
        Ok(response) => response,
        Err(err) => {
            state.runs.metrics.error(err.error_type());
            err.to_json_response()
        }
    }
}

async fn list(
    req: &HttpRequest,
    query: Result<web::Query<RawQuery>, actix_web::Error>,
    state: &AppState,
) -> Result<HttpResponse, ChatError> {
    let headers = req.headers();
    let caller = state.access.json_caller(headers)?;
    let query = query
        .map_err(|err| ChatError::InvalidRequest(format!("a malformed query: {err}")))?
        .into_inner();
    let limit = match query.limit.as_deref() {
        None => INBOX_LIMIT,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_INBOX_LIMIT).contains(n))
            .ok_or_else(|| {
                ChatError::InvalidRequest(format!(
                    "limit must be a number from 1 to {MAX_INBOX_LIMIT}, not `{text}`"
                ))
            })?,
    };
    let query = InboxQuery {
        limit,
        after: query.after.filter(|after| !after.is_empty()),
    };
    let (items, role) = match caller {
        Caller::Owner(owner) => (state.runs.inbox(owner, &query).await?, "requester"),
        // An approver sees every namespace's.
        Caller::Approver(_) => (state.runs.inbox_of_all(&query).await?, "approver"),
    };
    // `role`: what the caller's key may do (an approver decides and
    // re-attaches, it starts no run), for a page to offer only that.
    let mut response = HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(serde_json::json!({ "interactions": items, "role": role }));
    state.access.allow_origin(headers, &mut response);
    Ok(response)
}
