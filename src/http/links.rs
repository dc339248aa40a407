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
use serde::Deserialize;
use serde_json::{Map, Value};

use super::access::Caller;
use super::error::ChatError;
use super::forward;
use super::state::AppState;
use crate::notify::links::Token;
use crate::protocol::{PauseData, ReplyMessage, ReplyPayload, TaskDecisionRequest};
use crate::run::decide::Reply;
use crate::run::inbox::Interaction;
use crate::run::place::Place;
use crate::session::{RunTag, SessionKey};

pub mod page;

pub use crate::run::door::Outcome;

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

/// A link token's pause, found: its run, and who decides it.
pub struct Target {
    pub token: Token,
    pub key: SessionKey,
    pub caller: Caller,
}

/// Finds the pause `token` names and the key its label decides as: its
/// scope must still admit it.
pub async fn target(state: &AppState, token: Token) -> Result<Target, Outcome> {
    // A label the keys file no longer has sees no namespace.
    let caller = state.access.caller_of_label(&token.label);
    let may_see = |owner| caller.is_some_and(|caller| state.access.may_see(caller, owner));
    let key = state
        .runs
        .pause_for(&token.confirmation_id, may_see)
        .await?;
    let caller = caller.expect("a namespace was seen");
    Ok(Target { token, key, caller })
}

/// Where a link's (or a button's) decision is taken.
pub enum Routed {
    /// Here: this replica holds the run.
    Here,
    /// Passed on as it came to the replica that holds the run, which
    /// answered (`response`).
    PassedOn(HttpResponse),
    /// Nowhere: what the person is told.
    Not(Outcome),
}

/// Routes `req` (to `path`, its `body` as it came) about `target` to the
/// replica that holds the run: here, or passed on (once: a forwarded
/// request is never passed on again).
pub async fn route(
    state: &AppState,
    req: &HttpRequest,
    (path, target): (&str, &Target),
    post: bool,
    body: web::Bytes,
    forwarded: Option<&forward::Forwarded>,
) -> Routed {
    match state.runs.place(&target.key).await {
        Ok(Place::Here) => Routed::Here,
        Ok(Place::Replica(peer)) if forwarded.is_none() => {
            let Some(cluster) = state.runs.cluster() else {
                return Routed::Not(Outcome::Unavailable);
            };
            let tag = RunTag::session(&target.key);
            match forward::pass_link(cluster, &peer, &tag, req, path, post, body).await {
                Ok(response) => Routed::PassedOn(response),
                Err(ChatError::OutcomeUnknown) => Routed::Not(Outcome::Unknown),
                Err(_) => Routed::Not(Outcome::Unavailable),
            }
        }
        _ => Routed::Not(Outcome::Unavailable),
    }
}

/// Shows (`post` false) or decides (`post`: `body` is the form) the pause
/// of the link token `text`, here or at the replica that holds its run.
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
    let forwarded =
        match forward::forwarded(state.runs.cluster().map(|c| c.as_ref()), req.headers()) {
            Ok(forwarded) => forwarded,
            Err(_) => return page::refused("not a replica of this cluster"),
        };
    let target = match target(state, token).await {
        Ok(target) => target,
        Err(outcome) => return page::of(outcome),
    };
    let path = format!("/d/{text}");
    match route(
        state,
        req,
        (&path, &target),
        post,
        body.clone(),
        forwarded.as_ref(),
    )
    .await
    {
        Routed::Here => {}
        Routed::PassedOn(response) => return response,
        Routed::Not(outcome) => return page::of(outcome),
    }
    if !post {
        return show_pause(state, &target).await;
    }
    if body.len() > MAX_FORM_BYTES {
        return page::refused("the form is too large");
    }
    let Ok(form) = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&body) else {
        return page::refused("the form could not be read");
    };
    let not_after = forwarded.and_then(|f| f.not_after);
    let client = forward::client_address(req, forwarded.is_some());
    page::of(decide_form(state, &target, &form, client.as_deref(), not_after).await)
}

/// The page of a pending pause, or of what became of it.
async fn show_pause(state: &AppState, target: &Target) -> HttpResponse {
    let (key, token) = (&target.key, &target.token);
    match state.runs.inbox().pending_here(key, &token.confirmation_id) {
        Some(item) => page::pause(&item, &token.label),
        None => match state
            .runs
            .kept()
            .decided_note(key, &token.confirmation_id)
            .await
        {
            Some(note) => page::decided(&note),
            None => page::gone(token),
        },
    }
}

/// Decides the pause of `target` with `form` (`action=confirm` with a
/// `reject=<index>` per task to reject, `cancel`, `skip`, `answer` with
/// `a.<id>` answers) through the decision path, as the token's label.
pub async fn decide_form(
    state: &AppState,
    target: &Target,
    form: &[(String, String)],
    client: Option<&str>,
    not_after: Option<std::time::SystemTime>,
) -> Outcome {
    let (key, token) = (&target.key, &target.token);
    let field = |name: &str| {
        form.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let item = state.runs.inbox().pending_here(key, &token.confirmation_id);
    // A task's own button (`task=approve:N`): that task alone, a decide.
    let own = field("task").and_then(|task| task.split_once(':'));
    let action = match own {
        Some(_) => "decide",
        None => field("action").unwrap_or(""),
    };
    let (action_name, decisions, answers) = match action {
        "decide" => {
            let (decision, index) = own.unwrap_or_default();
            let decided = TaskDecisionRequest {
                index: index.parse().ok(),
                task_id: None,
                decision: decision.to_owned(),
                reason: (decision == "reject").then(|| "rejected on the decision page".to_owned()),
                args: None,
                result: None,
                preview_digest: (decision == "approve")
                    .then(|| field(&format!("digest.{index}")).map(str::to_owned))
                    .flatten(),
            };
            ("decide", Some(vec![decided]), None)
        }
        "confirm" => {
            let rejected: Vec<TaskDecisionRequest> = form
                .iter()
                .filter(|(k, _)| k == "reject")
                .filter_map(|(_, v)| v.parse::<usize>().ok())
                .map(|index| TaskDecisionRequest {
                    index: Some(index as u64),
                    task_id: None,
                    decision: "reject".to_owned(),
                    reason: Some("rejected on the decision page".to_owned()),
                    args: None,
                    result: None,
                    preview_digest: None,
                })
                .collect();
            // The tasks not rejected, approved as the page showed them:
            // each names the preview it showed (#43).
            let mut decisions = rejected;
            for (name, digest) in form {
                let Some(index) = name
                    .strip_prefix("digest.")
                    .and_then(|i| i.parse::<u64>().ok())
                else {
                    continue;
                };
                if decisions.iter().any(|d| d.index == Some(index)) {
                    continue;
                }
                decisions.push(TaskDecisionRequest {
                    index: Some(index),
                    task_id: None,
                    decision: "approve".to_owned(),
                    reason: None,
                    args: None,
                    result: None,
                    preview_digest: Some(digest.clone()),
                });
            }
            let decisions = (!decisions.is_empty()).then_some(decisions);
            ("confirm", decisions, None)
        }
        "cancel" => ("cancel", None, None),
        "skip" => ("skip", None, None),
        "run_again" => ("run_again", None, None),
        "answer" => ("answer", None, Some(answers_of(form, item.as_ref()))),
        _ => return Outcome::Refused("choose an action".to_owned()),
    };
    let decider = state.access.decider(target.caller);
    let message = ReplyMessage {
        action: action_name.to_owned(),
        text: None,
    };
    let reply = Reply {
        message: &message,
        confirmation_id: Some(&token.confirmation_id),
        payload: ReplyPayload {
            decisions: decisions.as_deref(),
            answers: answers.as_ref(),
            grant: None,
        },
        client,
        decider: &decider,
        not_after,
        via: crate::protocol::Via::Link,
    };
    state.runs.decide_pause(key, reply).await
}

/// A form's answers: `a.<id>` fields, several of one id a list (a
/// multi-select); a question with a schema gets its value as JSON when it
/// reads as JSON (a number, a boolean).
fn answers_of(form: &[(String, String)], item: Option<&Interaction>) -> Map<String, Value> {
    let asked = item.and_then(|item| PauseData::deserialize(&item.confirmation_data).ok());
    let questions = asked.as_ref().map_or(&[][..], PauseData::questions);
    let mut answers = Map::new();
    for q in questions {
        let id = q.id.as_str();
        let name = format!("a.{id}");
        let given: Vec<&str> = form
            .iter()
            .filter(|(k, v)| *k == name && !v.trim().is_empty())
            .map(|(_, v)| v.as_str())
            .collect();
        if given.is_empty() {
            continue;
        }
        let value = if q.multi_select {
            Value::from(given)
        } else if q.schema.is_some() {
            serde_json::from_str(given[0]).unwrap_or_else(|_| Value::from(given[0]))
        } else {
            Value::from(given[0])
        };
        answers.insert(id.to_owned(), value);
    }
    answers
}

/// A path as the access log writes it: every segment that is a decision
/// link's token, or follows a `d` segment, as `<token>`, however it is
/// spelt (`/d/<token>`, `//d/<token>`, `/%64/<token>`, a percent-encoded
/// token): the router serves them all, and none may reach a log.
pub fn logged_path(path: &str) -> std::borrow::Cow<'_, str> {
    let decoded = |segment: &str| {
        percent_encoding::percent_decode_str(segment)
            .decode_utf8_lossy()
            .into_owned()
    };
    let mut after_d = false;
    let mut masked = false;
    let segments: Vec<&str> = path
        .split('/')
        .map(|segment| {
            let text = decoded(segment);
            let hide = (after_d && !segment.is_empty()) || looks_like_token(&text);
            if !segment.is_empty() {
                after_d = text == "d";
            }
            masked |= hide;
            if hide {
                "<token>"
            } else {
                segment
            }
        })
        .collect();
    if masked {
        std::borrow::Cow::Owned(segments.join("/"))
    } else {
        std::borrow::Cow::Borrowed(path)
    }
}

/// `<id>.<label>.<expiry ms>.<hex mac>`: a decision token's shape.
fn looks_like_token(text: &str) -> bool {
    let parts: Vec<&str> = text.split('.').collect();
    parts.len() == 4
        && !parts[2].is_empty()
        && parts[2].bytes().all(|b| b.is_ascii_digit())
        && !parts[3].is_empty()
        && parts[3].bytes().all(|b| b.is_ascii_hexdigit())
}

#[cfg(test)]
mod tests {
    use super::logged_path;

    #[test]
    fn a_token_never_reaches_the_access_log_however_the_path_is_spelt() {
        let token = "5d0c0000-0000-4000-8000-000000000001.lead-1.2000.0123abcd";
        for path in [
            format!("/d/{token}"),
            format!("//d/{token}"),
            format!("/%64/{token}"),
            format!("/d//{token}"),
            format!("/x/{}", token.replace('.', "%2E")),
            "/d/anything-else".to_owned(),
        ] {
            let logged = logged_path(&path);
            assert!(logged.contains("<token>"), "{path} -> {logged}");
            assert!(!logged.contains("lead-1"), "{path} -> {logged}");
            assert!(!logged.contains("anything-else"), "{path} -> {logged}");
        }
        assert_eq!(logged_path("/d/abc"), "/d/<token>");
        assert_eq!(logged_path("/api/v1/chat/stream"), "/api/v1/chat/stream");
        assert_eq!(logged_path("/"), "/");
    }
}
