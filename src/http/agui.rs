//! `POST /api/v1/agui`: the AG-UI face. Another door into the same runs:
//! a `RunAgentInput` without `resume` starts a run on its thread (the
//! chatgate session) as a chat message would; one with `resume` decides
//! the thread's pause through the one decision path (the caller's key,
//! scopes, quorum and self-approval hold, `via: agui`). The run's chunks
//! come back as AG-UI events ([`crate::protocol::agui::translate`]); a
//! pause ends the AG-UI run with its interrupts.
//!
//! A request that cannot be read or is not allowed is answered with the
//! chat endpoint's status and one `RUN_ERROR` (its `code` the
//! `error_type`); everything after that is a 200 stream of events, a
//! refused decision a `RUN_ERROR` in it.

mod answer;
mod resume;

use actix_web::{web, HttpRequest, HttpResponse};
use bytes::Bytes;

use super::access::Caller;
use super::chat::{self, allow_origin};
use super::error::{ChatError, Refusal};
use super::event_stream;
use super::forward::{self, Forwarding};
use super::state::AppState;
use crate::protocol::agui::translate::Translator;
use crate::protocol::agui::{self, Event, RunAgentInput, MAX_AGUI_BODY_BYTES};
use crate::protocol::{is_valid_session_id, ChatRequest, ValidRequest};
use crate::run::start::Started;
use crate::session::SessionKey;
use answer::{ended, streamed, Incoming};

/// `POST /api/v1/agui`: an AG-UI run (a new message, or a `resume`).
pub async fn run(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let mut response = match agui_run(&req, payload, &state).await {
        Ok(response) => response,
        Err(refusal) => refuse(&state, refusal),
    };
    allow_origin(&req, &state, &mut response);
    response
}

/// `GET /api/v1/agui/capabilities`: what this agent supports, as AG-UI's
/// `AgentCapabilities` (its tools: the ones the caller may see offered).
pub async fn capabilities(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if let Err(err) = state.access.json_caller(req.headers()) {
        state.runs.metrics().error(err.error_type());
        return err.to_json_response();
    }
    let tools = state.runs.settings().tools.iter().map(|tool| {
        serde_json::json!({
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        })
    });
    let body = agui::capabilities(env!("CARGO_PKG_VERSION"), tools.collect());
    HttpResponse::Ok()
        .insert_header((actix_web::http::header::CACHE_CONTROL, "no-store"))
        .json(body)
}

/// A refused request: the table's status, and one `RUN_ERROR`.
fn refuse(state: &AppState, refusal: Refusal) -> HttpResponse {
    let (status, error_type) = refusal.error.wire();
    state.runs.metrics().error(error_type);
    let event = Event::error(error_type.as_str(), refusal.error.to_string());
    event_stream::frames(status, Bytes::from(event.frame()))
}

async fn agui_run(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<HttpResponse, Refusal> {
    let headers = req.headers();
    state.access.check_host(headers)?;
    state.access.check_origin(headers)?;
    let forwarded = forward::forwarded(state.runs.cluster().map(|c| c.as_ref()), headers)?;
    let caller = state.access.caller(headers)?;
    let read = chat::read_json_body(req, payload, MAX_AGUI_BODY_BYTES);
    let body = tokio::time::timeout(state.request_timeout, read)
        .await
        .map_err(|_| ChatError::RequestTimeout)??;
    let input = read_input(&body)?;
    let resuming = input.resume.as_ref().is_some_and(|r| !r.is_empty());
    let incoming = Incoming {
        req,
        state,
        caller,
        forwarded,
        body,
        input,
    };
    match resuming {
        true => resume::resume(incoming).await,
        false => start(incoming).await,
    }
}

/// The body as a `RunAgentInput`, its bounds checked.
fn read_input(body: &[u8]) -> Result<RunAgentInput, ChatError> {
    let input: RunAgentInput = serde_json::from_slice(body).map_err(|err| {
        ChatError::InvalidRequest(format!("body is not a valid RunAgentInput: {err}"))
    })?;
    if !is_valid_session_id(&input.thread_id) {
        return Err(ChatError::InvalidRequest(
            "threadId must be 1-128 characters without control characters".to_owned(),
        ));
    }
    if input.run_id.is_empty() || input.run_id.chars().count() > 128 {
        return Err(ChatError::InvalidRequest(
            "runId must be 1-128 characters".to_owned(),
        ));
    }
    let entries = input.resume.as_ref().map_or(0, Vec::len);
    if entries > agui::MAX_RESUME_ENTRIES {
        return Err(ChatError::InvalidRequest(format!(
            "resume has {entries} entries; a pause has at most {} interrupts",
            agui::MAX_RESUME_ENTRIES
        )));
    }
    Ok(input)
}

/// A new message on the thread: a run, as the chat endpoint starts one,
/// here or at the replica that owns the session.
async fn start(incoming: Incoming<'_>) -> Result<HttpResponse, Refusal> {
    let Incoming {
        req, state, input, ..
    } = &incoming;
    let thread = input.thread_id.as_str();
    super::access_log::note_session(req, thread);
    let refused = |err: ChatError| Refusal::new(err, thread);
    let message = chat_message(input).map_err(refused)?;
    let Caller::Owner(owner) = incoming.caller else {
        return Err(refused(ChatError::ForbiddenRole));
    };
    if state.runs.is_shutting_down() {
        return Err(refused(ChatError::ShuttingDown));
    }
    let key = SessionKey::new(owner, thread);
    let translator = Translator::new(thread, &input.run_id);
    if state.runs.waits(&key) {
        return Ok(ended(translator, pending_interrupts()));
    }
    let not_after = incoming.forwarded.and_then(|f| f.not_after);
    let started = state.runs.start(key.clone(), message, not_after).await;
    match started.map_err(|err| refused(err.into()))? {
        Started::Here(subscription) => Ok(streamed(translator, Vec::new(), subscription)),
        Started::Elsewhere(_) if incoming.forwarded.is_some() => {
            Err(refused(ChatError::owner_unavailable()))
        }
        Started::Elsewhere(peer) => {
            let forwarding = Forwarding::Change;
            chat::forward_to(state, &peer, &key, req, incoming.body.clone(), forwarding)
                .await
                .map_err(refused)
        }
    }
}

/// The last user message, checked as the chat endpoint checks a message.
fn chat_message(input: &RunAgentInput) -> Result<String, ChatError> {
    let text = input.last_user_text().ok_or_else(|| {
        ChatError::InvalidRequest(
            "messages has no user message with text (and there is no resume)".to_owned(),
        )
    })?;
    let request = ChatRequest {
        message: Some(text),
        session_id: Some(input.thread_id.clone()),
        ..ChatRequest::default()
    };
    match request.validate(None)? {
        ValidRequest::Chat { message, .. } => Ok(message),
        ValidRequest::Reply { .. } | ValidRequest::Reattach { .. } => {
            Err(ChatError::InvalidRequest(
                "on the AG-UI endpoint a pause is answered with `resume`, not a \
                 CONFIRM_ACTION message"
                    .to_owned(),
            ))
        }
    }
}

/// AG-UI's rule: a thread with open interrupts takes no new input until
/// they are resumed.
fn pending_interrupts() -> Vec<Event> {
    vec![Event::error(
        crate::protocol::ErrorType::SessionBusy.as_str(),
        "this thread's run waits on interrupts: resume them (resume[], `cancelled` to \
         decline) before sending a new message",
    )]
}
