//! `POST /api/v1/slack/actions`: the Slack app's interactivity request URL
//! (`--slack-signing-secret`). A button of a message chatgate posted
//! (`--slack-webhook`) was pressed.
//!
//! The request must be signed by Slack (`X-Slack-Signature`, a timestamp
//! within 5 minutes; else 401, nothing read). Its `payload` form field is
//! a `block_actions` payload: the presser (`user.id`) is mapped to an
//! approver key through the keys file's `slack=` attribute, and the button
//! (`approve`: confirm; `reject`: cancel, nothing runs) decides the pause
//! its `value` (a decision token) names, as that approver: a reply built
//! here goes through the door every decision takes
//! ([`Runs::decide_pause`](crate::run::Runs::decide_pause): scopes, quorums,
//! self-approval and the journal hold), and a run another replica holds is
//! decided there. Slack's reply is worded from the typed outcome. Slack is
//! answered 200 at once; the message is then updated through the
//! payload's `response_url` ("Approved by lead-1", or who decided first),
//! and a presser who is no approver is told so in an ephemeral reply.

use actix_web::{web, HttpRequest, HttpResponse};
use secrecy::ExposeSecret;
use serde_json::{json, Value};

use super::forward;
use super::links::{self, Outcome, Routed};
use super::state::AppState;
use crate::notify::links::Token;
use crate::notify::slack;
use crate::protocol::{Action, ReplyMessage, ReplyPayload, TaskDecisionRequest};
use crate::run::decide::Reply;
use crate::session::{run_log, RunTag};

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
    if !signed(&app, &req, &body) {
        return HttpResponse::Unauthorized().body("not signed by Slack");
    }
    let Some(payload) = block_actions(&body) else {
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
    if button == "open" {
        // A link button: Slack opened the page; nothing to decide.
        return HttpResponse::Ok().finish();
    }
    let forwarded = forward::forwarded(state.runs.cluster().map(|c| c.as_ref()), req.headers())
        .ok()
        .flatten();
    let mut about = None;
    let pressed = match press(
        &state,
        &req,
        &body,
        (&user, button, value),
        forwarded,
        &mut about,
    )
    .await
    {
        Pressed::PassedOn => return HttpResponse::Ok().finish(),
        Pressed::Outcome(outcome) => reply_to(*outcome, &payload["message"]),
        Pressed::Told(why) => ephemeral(&why),
    };
    if let Some(url) = response_url {
        tokio::spawn(update(app, url, pressed, about));
    }
    HttpResponse::Ok().finish()
}

/// Updates the pressed message through the payload's `response_url`.
async fn update(
    app: std::sync::Arc<super::state::SlackApp>,
    url: String,
    pressed: Value,
    about: Option<RunTag>,
) {
    // The body as `.json()` would send it, without needing reqwest's `json`
    // feature (off in a build without `openai`).
    let request = app
        .http
        .post(&url)
        .header(reqwest::header::CONTENT_TYPE, "application/json")
        .body(pressed.to_string());
    if let Err(err) = request.send().await {
        run_log!(
            Warn,
            about.as_ref(),
            "slack: the message could not be updated at {}: {}",
            crate::redact::origin(&url),
            crate::redact::request_error(&err)
        );
    }
}

/// Whether `body` is at most [`MAX_BODY_BYTES`] and signed by Slack with
/// the app's signing secret, within 5 minutes.
fn signed(app: &super::state::SlackApp, req: &HttpRequest, body: &[u8]) -> bool {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
    };
    body.len() <= MAX_BODY_BYTES
        && slack::verify(
            app.signing_secret.expose_secret(),
            header("x-slack-request-timestamp"),
            header("x-slack-signature"),
            body,
            crate::clock::now_secs(),
        )
}

/// The `payload` form field of `body`, when it is a `block_actions` one.
fn block_actions(body: &[u8]) -> Option<Value> {
    serde_urlencoded::from_bytes::<Vec<(String, String)>>(body)
        .ok()?
        .into_iter()
        .find(|(k, _)| k == "payload")
        .and_then(|(_, payload)| serde_json::from_str::<Value>(&payload).ok())
        .filter(|p| p["type"] == "block_actions")
}

/// What a press did.
enum Pressed {
    /// A decision was taken, refused or not known: what it did.
    Outcome(Box<Outcome>),
    /// Nothing was asked of the pause: only the presser is told.
    Told(String),
    /// The run's owner is another replica: the press went there as it
    /// came, and that replica answers Slack.
    PassedOn,
}

/// Decides the pause the button's token names as the presser's approver
/// key, through the decision link's door (its scope, quorum and journal),
/// here or at the replica that holds its run. `about`: the pause's run,
/// once found (what the press's later log lines are about).
async fn press(
    state: &AppState,
    req: &HttpRequest,
    body: &web::Bytes,
    (user, button, value): (&str, &str, &str),
    forwarded: Option<forward::Forwarded>,
    about: &mut Option<RunTag>,
) -> Pressed {
    let Some(link_maker) = &state.runs.settings().links else {
        return Pressed::Told("this chatgate makes no decision links".to_owned());
    };
    // The token, and the previews the button showed (#43).
    let (value, digests) = slack::read_value(value);
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
    let Some(button) = slack::Button::of(button) else {
        return Pressed::Told("unknown button".to_owned());
    };
    let token = Token {
        label: state.access.label(caller),
        ..token
    };
    let target = match links::target(state, token).await {
        Ok(target) => target,
        Err(outcome) => return Pressed::Outcome(Box::new(outcome)),
    };
    *about = Some(RunTag::session(&target.key).pause(&target.token.confirmation_id));
    let path = req.path();
    match links::route(
        state,
        req,
        (path, &target),
        true,
        body.clone(),
        forwarded.as_ref(),
    )
    .await
    {
        Routed::Here => {}
        Routed::PassedOn(_) => return Pressed::PassedOn,
        Routed::Not(outcome) => return Pressed::Outcome(Box::new(outcome)),
    }
    let client = forward::client_address(req, forwarded.is_some());
    let from = (client.as_deref(), forwarded.and_then(|f| f.not_after));
    Pressed::Outcome(Box::new(
        decide(state, &target, (button, &digests), from).await,
    ))
}

/// The button's reply on the decision path as the presser's key: a
/// confirm or a cancel of the pause, or a `decide` of one task.
async fn decide(
    state: &AppState,
    target: &links::Target,
    (button, digests): (slack::Button, &[(usize, &str)]),
    (client, not_after): (Option<&str>, Option<std::time::SystemTime>),
) -> Outcome {
    // An approval names the previews its message showed (#43).
    let shown = |index: usize| {
        digests
            .iter()
            .find(|(at, _)| *at == index)
            .map(|(_, digest)| (*digest).to_owned())
    };
    let task = |index: usize, decision: &str| TaskDecisionRequest {
        index: Some(index as u64),
        task_id: None,
        decision: decision.to_owned(),
        reason: None,
        args: None,
        result: None,
        preview_digest: (decision == "approve").then(|| shown(index)).flatten(),
    };
    // Of the tasks its message showed, those still pending (others may
    // have been decided on their own since).
    let pending = state
        .runs
        .inbox()
        .pending_here(&target.key, &target.token.confirmation_id)
        .map(|item| item.pending)
        .unwrap_or_default();
    let (action, decisions) = match button {
        slack::Button::Approve if !digests.is_empty() => (
            Action::Confirm,
            Some(
                digests
                    .iter()
                    .filter(|(index, _)| pending.contains(index))
                    .map(|(index, _)| task(*index, "approve"))
                    .collect(),
            ),
        ),
        slack::Button::Approve => (Action::Confirm, None),
        slack::Button::Reject => (Action::Cancel, None),
        slack::Button::RunAgain => (Action::RunAgain, None),
        slack::Button::Skip => (Action::Skip, None),
        slack::Button::ApproveTask(index) => (Action::Decide, Some(vec![task(index, "approve")])),
        slack::Button::RejectTask(index) => (Action::Decide, Some(vec![task(index, "reject")])),
    };
    let message = ReplyMessage {
        action: action.as_str().to_owned(),
        text: None,
    };
    let decider = state.access.decider(target.caller);
    let reply = Reply {
        message: &message,
        confirmation_id: Some(&target.token.confirmation_id),
        payload: ReplyPayload {
            decisions: decisions.as_deref(),
            ..ReplyPayload::default()
        },
        client,
        decider: &decider,
        not_after,
        via: crate::protocol::Via::Slack,
    };
    state.runs.decide_pause(&target.key, reply).await
}

/// Slack's reply to a press that reached the pause: the channel message is
/// replaced only when the pause is decided (its buttons go); an approval
/// towards a quorum keeps the buttons and shows the progress; a refusal or
/// a press to retry is told to the presser alone.
fn reply_to(outcome: Outcome, message: &Value) -> Value {
    let replace = |text: String| {
        json!({"replace_original": true, "text": text, "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": slack::escape(&text)}}]})
    };
    match outcome {
        Outcome::Decided { label, decided } => match (decided.progress, decided.partial) {
            // Some tasks decided (or approved towards their quorum): the
            // buttons stay for the others, the progress line says where
            // it stands.
            (_, Some(partial)) => {
                let text = partial_text(&label, &partial);
                match slack::with_progress(message, &text) {
                    Some(blocks) => {
                        json!({"replace_original": true, "text": text, "blocks": blocks})
                    }
                    None => ephemeral(&text),
                }
            }
            (Some(progress), None) => {
                let text = format!(
                    "Approval recorded: {} of {} ({})",
                    progress.approvals.len(),
                    progress.required,
                    progress.approvals.join(", ")
                );
                match slack::with_progress(message, &text) {
                    Some(blocks) => {
                        json!({"replace_original": true, "text": text, "blocks": blocks})
                    }
                    None => ephemeral(&text),
                }
            }
            (None, None) => replace(match decided.action {
                Action::Confirm => format!("Approved by {}", decided.approved_by.join(", ")),
                Action::Cancel => format!("Rejected by {label}"),
                other => format!("{} by {label}", other.as_str()),
            }),
        },
        Outcome::AlreadyDecided(note) => replace(match &note.decided {
            Some(decided) => format!(
                "Already decided: {} by {}",
                decided.action.as_str(),
                decided.by
            ),
            None => "Already decided".to_owned(),
        }),
        Outcome::Gone => {
            replace("No longer waiting: it was decided, it expired, or its run ended".to_owned())
        }
        Outcome::NotFound => ephemeral("this button is no longer valid (its pause expired)"),
        Outcome::Refused(why) => ephemeral(&format!("Nothing was decided: {why}")),
        Outcome::AlreadyApproved(label) => ephemeral(&format!(
            "Nothing was decided: {label} has approved this already; it waits for the others"
        )),
        Outcome::Unavailable => ephemeral(
            "Nothing was decided: chatgate cannot take it just now; press again in a few seconds",
        ),
        Outcome::Unknown => ephemeral(
            "Whether your press was taken is not known yet (it is being settled); press again \
             in a few seconds to see what became of the pause",
        ),
    }
}

/// The progress line of a press that decided some tasks (or approved them
/// towards their quorum) and left others pending.
fn partial_text(label: &str, partial: &crate::confirmation::quorum::Partial) -> String {
    let mut said: Vec<String> = partial
        .now
        .0
        .iter()
        .map(|d| format!("task {} {} by {label}", d.index, d.verdict.state().as_str()))
        .collect();
    said.extend(partial.approving.iter().map(|task| task.progress()));
    let pending: Vec<String> = partial.pending.iter().map(usize::to_string).collect();
    format!("{}; still pending: {}", said.join("; "), pending.join(", "))
}

/// A reply only the presser sees; the channel message stays as it was.
fn ephemeral(text: &str) -> Value {
    json!({"response_type": "ephemeral", "replace_original": false, "text": text})
}
