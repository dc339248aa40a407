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
use crate::confirmation::Decider;
use crate::protocol::RiskLevel;
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
        // An approver sees every namespace's its scope takes in.
        Caller::Approver(_) => {
            let decider = state.access.decider(caller);
            let in_scope = |owner: Option<u32>, item: &Interaction| {
                let escalated = item
                    .escalated_to
                    .as_ref()
                    .is_some_and(|group| decider.groups.contains(group));
                let in_groups =
                    escalated || item.approvers.iter().all(|g| decider.groups.contains(g));
                state.access.may_see(caller, owner)
                    && in_groups
                    && item.tasks.iter().all(|task| {
                        let risk = task
                            .risk_level
                            .as_ref()
                            .and_then(|risk| serde_json::from_value::<RiskLevel>(risk.clone()).ok())
                            .unwrap_or(RiskLevel::Low);
                        risk <= decider.max_risk
                    })
            };
            (state.runs.inbox_of_all(&query, in_scope).await?, "approver")
        }
    };
    let decider = state.access.decider(caller);
    let items: Vec<Interaction> = items
        .into_iter()
        .map(|mut item| {
            if item.kind == crate::protocol::PauseKind::Approval {
                item.why_not = why_not(&decider, &item);
                item.may_approve = Some(item.why_not.is_none());
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

/// Why `decider` may not approve `item` (it may still cancel), if it may
/// not: what a page shows instead of a Confirm button.
fn why_not(decider: &Decider, item: &Interaction) -> Option<String> {
    let approvals = item.approvals.as_deref().unwrap_or_default();
    if approvals.contains(&decider.label) {
        let left = item.required.unwrap_or(1).saturating_sub(approvals.len());
        return Some(format!(
            "{} approved it already; it waits for {left} more approval(s)",
            decider.label
        ));
    }
    let escalated = item
        .escalated_to
        .as_ref()
        .is_some_and(|group| decider.groups.contains(group));
    if decider.requester
        && (!item.approvers.is_empty() && !escalated || !item.requester_may_approve)
    {
        let by = if item.approvers.is_empty() {
            "other people".to_owned()
        } else {
            format!("the group {}", item.approvers.join(" and "))
        };
        return Some(format!(
            "the requester's own key ({}) may not approve it: it is decided by {by} (this key \
             may cancel)",
            decider.label
        ));
    }
    if let Some(group) = item
        .approvers
        .iter()
        .find(|g| !escalated && !decider.groups.contains(g))
    {
        return Some(format!(
            "it is decided by the group {group}; this key ({}) is not in it",
            decider.label
        ));
    }
    None
}
