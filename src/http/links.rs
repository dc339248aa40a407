//! `GET` and `POST /d/<token>`: a decision link (`--link-secret`).
//!
//! A GET shows the pause as the card shows it and its actions, and never
//! decides (mail scanners fetch links). A POST (a form: `action=confirm` or
//! `cancel`, `reject=<task index>` per task to reject with a confirm,
//! `answer=...`, `skip`, and `a.<question id>=<value>` per answer) decides
//! through the same path as a reply on the chat endpoint, as the token's
//! label: scopes, self-approval and quorums hold, and the decision is made
//! once. A forged, altered, expired or other-secret token is 404 with no
//! detail (counted: `chatgate_link_refusals_total`). A run another replica
//! owns is answered by that replica (the request passed on as it came).
//! The token never reaches a log (the access log writes `/d/<token>`).

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::{json, Map, Value};

use super::access::Caller;
use super::forward;
use super::state::AppState;
use crate::confirmation::DecideError;
use crate::notify::links::Token;
use crate::protocol::{meta, ChunkType, ReplyMessage, TaskDecisionRequest};
use crate::run::decide::{Reply, ReplyError};
use crate::run::inbox::Interaction;
use crate::run::place::Place;
use crate::session::{RunTag, SessionKey};

pub mod page;

/// Most bytes a link's form may be.
pub const MAX_FORM_BYTES: usize = 16 * 1024;

pub async fn show(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    answer(&req, web::Bytes::new(), &state, false).await
}

pub async fn decide(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> HttpResponse {
    answer(&req, body, &state, true).await
}

async fn answer(req: &HttpRequest, body: web::Bytes, state: &AppState, post: bool) -> HttpResponse {
    let text = req.match_info().get("token").unwrap_or_default().to_owned();
    follow(state, req, &text, body, post).await
}

/// Shows (`post` false) or decides (`post`: `body` is the form) the pause
/// of the link token `text`, here or at the replica that holds its run.
/// Every answer says what it did in its `X-Chatgate-Outcome` header.
pub async fn follow(
    state: &AppState,
    req: &HttpRequest,
    text: &str,
    body: web::Bytes,
    post: bool,
) -> HttpResponse {
    let Some(token) = state
        .runs
        .settings()
        .links
        .as_ref()
        .and_then(|links| links.verify(text, crate::clock::now_ms()))
    else {
        state.runs.metrics().link_refused();
        return page::not_found();
    };
    let forwarded = forward::forwarded(state.runs.cluster().map(|c| c.as_ref()), req.headers())
        .is_ok_and(|f| f.is_some());
    let key = match state.runs.locate(&token.confirmation_id).await {
        Ok(Some(key)) => key,
        Ok(None) => return page::gone(&token),
        Err(_) => return page::unavailable(),
    };
    let caller = match state.access.caller_of_label(&token.label) {
        Some(caller) if state.access.may_see(caller, key.owner) => caller,
        // A label the keys file no longer has (or its scope changed).
        _ => return page::refused("this link's key may no longer decide this pause"),
    };
    match state.runs.place(&key).await {
        Ok(Place::Here) => {}
        Ok(Place::Replica(peer)) if !forwarded => {
            let Some(cluster) = state.runs.cluster() else {
                return page::unavailable();
            };
            let path = format!("/d/{text}");
            let tag = RunTag::session(&key);
            return forward::pass_link(cluster, &peer, &tag, req, &path, post, body.clone())
                .await
                .unwrap_or_else(|_| page::unavailable());
        }
        _ => return page::unavailable(),
    }
    if !post {
        return show_pause(state, &key, &token).await;
    }
    if body.len() > MAX_FORM_BYTES {
        return page::refused("the form is too large");
    }
    let Ok(form) = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&body) else {
        return page::refused("the form could not be read");
    };
    decide_pause(req, state, &key, &token, caller, &form, forwarded).await
}

/// The page of a pending pause, or of what became of it.
async fn show_pause(state: &AppState, key: &SessionKey, token: &Token) -> HttpResponse {
    match state.runs.pending_here(key, &token.confirmation_id) {
        Some(item) => page::pause(&item, &token.label),
        None => match state.runs.decided_note(key, &token.confirmation_id).await {
            Some(note) => page::decided(&note),
            None => page::gone(token),
        },
    }
}

async fn decide_pause(
    req: &HttpRequest,
    state: &AppState,
    key: &SessionKey,
    token: &Token,
    caller: Caller,
    form: &[(String, String)],
    forwarded: bool,
) -> HttpResponse {
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let action = field("action").unwrap_or("");
    let item = state.runs.pending_here(key, &token.confirmation_id);
    let (action_name, decisions, answers) = match action {
        "confirm" => {
            let rejected: Vec<TaskDecisionRequest> = form
                .iter()
                .filter(|(k, _)| k == "reject")
                .filter_map(|(_, v)| v.parse::<usize>().ok())
                .map(|index| TaskDecisionRequest {
                    index: index as u64,
                    decision: "reject".to_owned(),
                    reason: Some("rejected on the decision page".to_owned()),
                    args: None,
                    result: None,
                })
                .collect();
            let decisions = (!rejected.is_empty()).then_some(rejected);
            ("confirm", decisions, None)
        }
        "cancel" => ("cancel", None, None),
        "skip" => ("skip", None, None),
        "answer" => ("answer", None, Some(answers_of(form, item.as_ref()))),
        _ => return page::refused("choose an action"),
    };
    let client = forward::client_address(req, forwarded);
    let decider = state.access.decider(caller);
    let message = ReplyMessage {
        action: action_name.to_owned(),
        text: None,
    };
    let reply = Reply {
        message: &message,
        confirmation_id: Some(&token.confirmation_id),
        decisions: decisions.as_deref(),
        answers: answers.as_ref(),
        grant: None,
        client: client.as_deref(),
        decider: &decider,
        not_after: None,
    };
    match state.runs.decide(key, reply).await {
        Ok(decided) => {
            let ack = decided.acknowledgement(&key.session_id);
            if ack.chunk_type == ChunkType::ApprovalRecorded {
                let approvals = ack
                    .metadata
                    .get(meta::APPROVALS)
                    .cloned()
                    .unwrap_or(json!([]));
                page::recorded(&decider.label, &approvals, ack.metadata.get(meta::REQUIRED))
            } else {
                page::done(action, &decider.label)
            }
        }
        Err(ReplyError::Decided(note)) => page::decided(&note),
        Err(ReplyError::Refused(DecideError::NoPending)) => {
            match state.runs.decided_note(key, &token.confirmation_id).await {
                Some(note) => page::decided(&note),
                None => page::gone(token),
            }
        }
        Err(err) => page::refused(&err.to_string()),
    }
}

/// A form's answers: `a.<id>` fields, several of one id a list (a
/// multi-select); a question with a schema gets its value as JSON when it
/// reads as JSON (a number, a boolean).
fn answers_of(form: &[(String, String)], item: Option<&Interaction>) -> Map<String, Value> {
    let questions = item
        .and_then(|item| item.confirmation_data.get("questions"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut answers = Map::new();
    for q in &questions {
        let Some(id) = q.get("id").and_then(Value::as_str) else {
            continue;
        };
        let name = format!("a.{id}");
        let given: Vec<&str> = form
            .iter()
            .filter(|(k, v)| *k == name && !v.trim().is_empty())
            .map(|(_, v)| v.as_str())
            .collect();
        if given.is_empty() {
            continue;
        }
        let multi = q.get("multi_select").and_then(Value::as_bool) == Some(true);
        let typed = q.get("schema").is_some();
        let value = if multi {
            Value::from(given)
        } else if typed {
            serde_json::from_str(given[0]).unwrap_or_else(|_| Value::from(given[0]))
        } else {
            Value::from(given[0])
        };
        answers.insert(id.to_owned(), value);
    }
    answers
}

/// `/d/<token>` as the access log writes it.
pub fn logged_path(path: &str) -> &str {
    if path.starts_with("/d/") {
        "/d/<token>"
    } else {
        path
    }
}
