//! `POST /api/v1/slack/actions`: the Slack app's interactivity request URL
//! (`--slack-signing-secret`). A button of a message chatgate posted
//! (`--slack-webhook`) was pressed.
//!
//! The request must be signed by Slack (`X-Slack-Signature`, a timestamp
//! within 5 minutes; else 401, nothing read). Its `payload` form field is
//! a `block_actions` payload: the presser (`user.id`) is mapped to an
//! approver key through the keys file's `slack=` attribute, and the button
//! (`approve`: confirm; `reject`: cancel, nothing runs) decides the pause
//! its `value` (a decision token) names, as that approver, through the
//! decision link's path (so scopes, quorums, self-approval and the journal
//! hold, and a run another replica holds is decided there). Slack is
//! answered 200 at once; the message is then updated through the
//! payload's `response_url` ("Approved by lead-1", or who decided first),
//! and a presser who is no approver is told so in an ephemeral reply.

use actix_web::{web, HttpRequest, HttpResponse};
use secrecy::ExposeSecret;
use serde_json::{json, Value};

use super::links;
use super::state::AppState;
use crate::notify::links::Token;
use crate::notify::slack;

/// Most bytes an interactivity request may be (Slack's are a few KiB).
pub const MAX_BODY_BYTES: usize = 64 * 1024;

pub async fn actions(
    req: HttpRequest,
    body: web::Bytes,
    state: web::Data<AppState>,
) -> HttpResponse {
    let Some(app) = state.slack.clone() else {
        return HttpResponse::NotFound().finish();
    };
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    let signed = body.len() <= MAX_BODY_BYTES
        && slack::verify(
            app.signing_secret.expose_secret(),
            header("x-slack-request-timestamp"),
            header("x-slack-signature"),
            &body,
            crate::clock::now_secs(),
        );
    if !signed {
        return HttpResponse::Unauthorized().body("not signed by Slack");
    }
    let payload = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&body)
        .ok()
        .and_then(|form| form.into_iter().find(|(k, _)| k == "payload"))
        .and_then(|(_, payload)| serde_json::from_str::<Value>(&payload).ok());
    let Some(payload) = payload.filter(|p| p["type"] == "block_actions") else {
        return HttpResponse::BadRequest().body("expected a block_actions payload");
    };
    let user = payload["user"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let response_url = payload["response_url"].as_str().map(str::to_owned);
    let action = &payload["actions"][0];
    let (button, value) = (
        action["action_id"].as_str().unwrap_or_default(),
        action["value"].as_str().unwrap_or_default(),
    );
    let reply = match decide(&state, &req, &user, button, value).await {
        Pressed::Decided(outcome) => {
            json!({"replace_original": true, "text": outcome, "blocks": [
                {"type": "section", "text": {"type": "mrkdwn", "text": slack::escape(&outcome)}}]})
        }
        Pressed::Told(why) => {
            json!({"response_type": "ephemeral", "replace_original": false, "text": why})
        }
    };
    if let Some(url) = response_url {
        tokio::spawn(async move {
            if let Err(err) = app.http.post(&url).json(&reply).send().await {
                log::warn!(
                    "slack: the message could not be updated at {}: {}",
                    crate::redact::origin(&url),
                    crate::redact::request_error(&err)
                );
            }
        });
    }
    HttpResponse::Ok().finish()
}

/// What a press did.
enum Pressed {
    /// A decision was taken or refused: the message says it to everyone.
    Decided(String),
    /// Nothing was asked of the pause: only the presser is told.
    Told(String),
}

async fn decide(
    state: &AppState,
    req: &HttpRequest,
    user: &str,
    button: &str,
    value: &str,
) -> Pressed {
    let Some(link_maker) = &state.runs.settings().links else {
        return Pressed::Told("this chatgate makes no decision links".to_owned());
    };
    let Some(token) = link_maker.verify(value, crate::clock::now_ms()) else {
        state.runs.metrics().link_refused();
        return Pressed::Told("this button is no longer valid (its pause expired)".to_owned());
    };
    let Some(caller) = state.access.caller_of_slack(user) else {
        return Pressed::Told(format!(
            "you ({user}) are not an approver here: no approver key of the keys file says \
             slack={user}; nothing was decided"
        ));
    };
    let action = match button {
        "approve" => "confirm",
        "reject" => "cancel",
        _ => return Pressed::Told("unknown button".to_owned()),
    };
    let label = state.access.label(caller);
    let as_approver = link_maker.token(&Token {
        label: label.clone(),
        ..token
    });
    let form = web::Bytes::from(format!("action={action}"));
    let answer = links::follow(state, req, &as_approver, form, true).await;
    let outcome = answer
        .headers()
        .get(links::page::OUTCOME)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("Nothing was decided")
        .to_owned();
    let outcome = if let Some(by) = outcome.strip_prefix("Confirmed by ") {
        format!("Approved by {by}")
    } else if let Some(by) = outcome.strip_prefix("Cancelled by ") {
        format!("Rejected by {by}")
    } else {
        outcome
    };
    Pressed::Decided(outcome)
}
