//! `GET /api/v1/interactions`: the inbox. Extract, check who may call,
//! read the page asked for, one call below HTTP ([`crate::run::inbox::Inbox::list`]),
//! respond with JSON. Refusals are JSON too (`error_type`, `message`),
//! with the error table's status.

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::access::Caller;
use super::error::ChatError;
use super::state::AppState;
use crate::decider::{may_decide, Decider};
use crate::protocol::Action;
use crate::run::inbox::{InboxQuery, Interaction, INBOX_LIMIT, MAX_INBOX_LIMIT};

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
            state.runs.metrics().error(err.error_type());
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
    let query = inbox_query(query)?;
    let (listed, role) = match caller {
        Caller::Owner(owner) => (state.runs.inbox().list(owner, &query).await, "requester"),
        // An approver sees every namespace's its scope takes in.
        Caller::Approver(_) => {
            let decider = state.access.decider(caller);
            // What it may decide, by the one rule (a cancel: an
            // approver sees what is its to decide, approved or not).
            // Listed too where it may decide one pending task alone (#42).
            let in_scope = |owner: Option<u32>, item: &Interaction| {
                state.access.may_see(caller, owner)
                    && (may_decide(&decider, &item.deciding(&decider), Action::Cancel).is_ok()
                        || !tasks_for(&decider, item).is_empty())
            };
            (
                state.runs.inbox().list_all(&query, in_scope).await,
                "approver",
            )
        }
    };
    let items = listed.map_err(ChatError::store(None))?;
    let decider = state.access.decider(caller);
    let items: Vec<Interaction> = items
        .into_iter()
        .map(|mut item| {
            if item.kind.asks_a_yes() || item.kind.asks_run_again() {
                item.why_not = why_not(&decider, &item);
                item.may_approve = Some(item.why_not.is_none());
                item.may_decide_tasks = Some(tasks_for(&decider, &item));
            }
            item
        })
        .collect();
    // `role`: what the caller's key may do (an approver decides and
    // re-attaches, it starts no run), for a page to offer only that.
    let mut response = HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(serde_json::json!({ "interactions": items, "role": role, "label": decider.label }));
    state.access.allow_origin(headers, &mut response);
    Ok(response)
}

/// The page a query asks for: `limit` (1 to [`MAX_INBOX_LIMIT`], else
/// 400) and `after`.
fn inbox_query(
    query: Result<web::Query<RawQuery>, actix_web::Error>,
) -> Result<InboxQuery, ChatError> {
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
    Ok(InboxQuery {
        limit,
        after: query.after.filter(|after| !after.is_empty()),
    })
}

/// The pending tasks of `item` that `decider` may decide alone, by the
/// one rule asked of each.
fn tasks_for(decider: &Decider, item: &Interaction) -> Vec<usize> {
    item.pending_tasks()
        .filter(|who| {
            may_decide(decider, &item.deciding_task(who, decider), Action::Confirm).is_ok()
        })
        .map(|who| who.index)
        .collect()
}

/// Why `decider` may not approve `item` (it may still cancel), if it may
/// not: what a page shows instead of a Confirm button. It approved already
/// (a quorum's count), or the one rule says no.
fn why_not(decider: &Decider, item: &Interaction) -> Option<String> {
    let approvals = item.approvals.as_deref().unwrap_or_default();
    if approvals.contains(&decider.label) {
        let left = item.required.unwrap_or(1).saturating_sub(approvals.len());
        return Some(format!(
            "{} approved it already; it waits for {left} more approval(s)",
            decider.label
        ));
    }
    // A confirm decides the tasks still pending: the one rule asked of
    // each (#42), the riskiest first, as the decide path asks it.
    let mut pending: Vec<_> = item.pending_tasks().collect();
    pending.sort_by_key(|who| (std::cmp::Reverse(who.risk), std::cmp::Reverse(who.index)));
    let refused = match pending.is_empty() {
        true => may_decide(decider, &item.deciding(decider), Action::Confirm).err(),
        false => pending.into_iter().find_map(|who| {
            may_decide(decider, &item.deciding_task(who, decider), Action::Confirm).err()
        }),
    };
    refused.map(|refusal| refusal.text().to_owned())
}
