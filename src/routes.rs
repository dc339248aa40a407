//! HTTP handlers: extract, validate, call the manager or start a run, respond.

use actix_web::http::{header, Method, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;

use crate::confirmation::SessionKey;
use crate::error::ChatError;
use crate::protocol::{
    is_valid_session_id, parse_reply, ChatRequest, Chunk, ChunkType, MAX_BODY_BYTES,
    MAX_MESSAGE_BYTES,
};
use crate::startup::AppState;
use crate::{run, sse};

/// The browser chat page, embedded at build time.
const INDEX_HTML: &str = include_str!("../clients/web/index.html");
/// The JS client module the page imports, served at a stable path.
const CLIENT_MJS: &str = include_str!("../clients/js/chatgate-client.mjs");
/// The page runs its own inline module and talks to its own origin only.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self' 'unsafe-inline'; \
                        style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; \
                        form-action 'none'; frame-ancestors 'none'";

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/api/v1/chat/stream", web::post().to(chat_stream))
        .route(
            "/api/v1/chat/stream",
            web::method(Method::OPTIONS).to(preflight),
        )
        .route("/healthz", web::get().to(health))
        .route("/health", web::get().to(health))
        .route("/readyz", web::get().to(ready))
        .route("/metrics", web::get().to(metrics))
        .route("/", web::get().to(index))
        .route("/chatgate-client.mjs", web::get().to(client_module));
}

async fn index() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CONTENT_SECURITY_POLICY, PAGE_CSP))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(INDEX_HTML)
}

async fn client_module() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(CLIENT_MJS)
}

/// Alive: answers as long as the process serves HTTP.
async fn health() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({ "status": "ok" }))
}

/// Ready for new runs: 503 from the moment shutdown starts.
async fn ready(state: web::Data<AppState>) -> HttpResponse {
    if state.shutdown.is_cancelled() {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({ "status": "shutting_down" }))
    } else {
        HttpResponse::Ok().json(serde_json::json!({ "status": "ready" }))
    }
}

async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(state.metrics.render(&state.manager, &state.logs))
}

/// `POST /api/v1/chat/stream`: a chat message starts a run; a
/// `CONFIRM_ACTION` message decides the pause of the session's run.
async fn chat_stream(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let mut response = chat_response(&req, payload, &state).await;
    allow_origin(&req, &state, &mut response);
    response
}

/// CORS preflight: allowed origins may POST JSON with a bearer key.
async fn preflight(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if let Err(err) = state.access.check_host(req.headers()) {
        return refuse(&state, &err, "");
    }
    let mut response = match state.access.allowed_origin(req.headers()) {
        Some(_) => HttpResponse::NoContent()
            .insert_header((header::ACCESS_CONTROL_ALLOW_METHODS, "POST"))
            .insert_header((
                header::ACCESS_CONTROL_ALLOW_HEADERS,
                "Content-Type, Authorization, Last-Event-ID",
            ))
            .insert_header((header::ACCESS_CONTROL_MAX_AGE, "600"))
            .finish(),
        None => HttpResponse::Forbidden().finish(),
    };
    allow_origin(&req, &state, &mut response);
    response
}

/// Names an allowed origin in the response (never `*`).
fn allow_origin(req: &HttpRequest, state: &AppState, response: &mut HttpResponse) {
    if let Some(origin) = state.access.allowed_origin(req.headers()) {
        if let Ok(value) = header::HeaderValue::from_str(origin) {
            let headers = response.headers_mut();
            headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, value);
            headers.insert(header::VARY, header::HeaderValue::from_static("Origin"));
        }
    }
}

async fn chat_response(req: &HttpRequest, payload: web::Payload, state: &AppState) -> HttpResponse {
    let owner = match state
        .access
        .check_host(req.headers())
        .and_then(|()| state.access.check_origin(req.headers()))
        .and_then(|()| state.access.owner(req.headers()))
    {
        Ok(owner) => owner,
        Err(err) => return refuse(state, &err, ""),
    };
    let request =
        match tokio::time::timeout(state.request_timeout, read_request(req, payload)).await {
            Ok(Ok(request)) => request,
            Ok(Err(err)) => return refuse(state, &err, ""),
            Err(_) => return refuse(state, &ChatError::RequestTimeout, ""),
        };
    let session_id = match request.session_id.clone() {
        Some(id) if is_valid_session_id(&id) => id,
        Some(_) => {
            let err = ChatError::InvalidRequest(
                "session_id must be 1-128 characters of A-Z a-z 0-9 . _ : -".to_owned(),
            );
            return refuse(state, &err, "");
        }
        None => uuid::Uuid::new_v4().to_string(),
    };
    let key = SessionKey::new(owner, &session_id);
    let result = match last_event_id(req) {
        Some(Ok(last_seen)) => run::reattach(state, key, last_seen),
        Some(Err(err)) => Err(err),
        None => handle(request, key, state),
    };
    result.unwrap_or_else(|err| refuse(state, &err, &session_id))
}

/// The `Last-Event-ID` header, which turns a request into a re-attach.
fn last_event_id(req: &HttpRequest) -> Option<Result<u64, ChatError>> {
    let value = req.headers().get("last-event-id")?;
    Some(
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .ok_or_else(|| {
                ChatError::InvalidRequest(
                    "Last-Event-ID must be a chunk sequence number".to_owned(),
                )
            }),
    )
}

/// Counts and answers a refused request.
fn refuse(state: &AppState, err: &ChatError, session_id: &str) -> HttpResponse {
    state.metrics.error(err.error_type());
    if matches!(err, ChatError::MalformedReply(_) | ChatError::Decide(_)) {
        state.metrics.decision("reply", "refused");
    }
    err.to_response(session_id)
}

fn handle(
    request: ChatRequest,
    key: SessionKey,
    state: &AppState,
) -> Result<HttpResponse, ChatError> {
    let session_id = &*key.session_id;
    let message = request
        .message
        .ok_or_else(|| ChatError::InvalidRequest("message is required".to_owned()))?;
    if message.trim().is_empty() {
        return Err(ChatError::InvalidRequest(
            "message must not be empty".to_owned(),
        ));
    }
    if message.len() > MAX_MESSAGE_BYTES {
        return Err(ChatError::InvalidRequest(format!(
            "message is longer than {MAX_MESSAGE_BYTES} bytes"
        )));
    }

    if let Some(reply) = parse_reply(&message) {
        let reply = reply?;
        let accepted = state
            .manager
            .decide(&key, &reply, request.confirmation_id.as_deref())?;
        let chunk = Chunk::new(
            ChunkType::ConfirmationReceived,
            format!("Received {}", accepted.action.as_str()),
            session_id,
            1,
        )
        .with_meta("action", accepted.action.as_str())
        .with_meta("confirmation_id", accepted.confirmation_id)
        .with_meta("confirmation_round", accepted.confirmation_round)
        .finished();
        return Ok(sse::single_chunk(StatusCode::OK, &chunk));
    }

    if state.shutdown.is_cancelled() {
        return Err(ChatError::ShuttingDown);
    }
    let slot = state.manager.begin_run(key.clone(), state.run_limits)?;
    Ok(run::start(state, slot, key, message))
}

/// Reads and decodes the body: JSON only, at most [`MAX_BODY_BYTES`].
async fn read_request(
    req: &HttpRequest,
    mut payload: web::Payload,
) -> Result<ChatRequest, ChatError> {
    let is_json = req
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(ChatError::UnsupportedMediaType);
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES) {
        return Err(ChatError::PayloadTooLarge);
    }
    let mut body = web::BytesMut::with_capacity(declared.unwrap_or(1024).min(MAX_BODY_BYTES));
    while let Some(piece) = payload.next().await {
        let piece =
            piece.map_err(|err| ChatError::InvalidRequest(format!("unreadable body: {err}")))?;
        if body.len() + piece.len() > MAX_BODY_BYTES {
            return Err(ChatError::PayloadTooLarge);
        }
        body.extend_from_slice(&piece);
    }
    serde_json::from_slice(&body).map_err(|err| {
        ChatError::InvalidRequest(format!("body is not a valid chat request: {err}"))
    })
}
