//! HTTP handlers: extract, validate, call the manager or the runs, respond.

use actix_web::http::{header, Method, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;

use super::error::{ChatError, Refusal};
use super::AppState;
use crate::audit;
use crate::cluster::forward;
use crate::confirmation::{Accepted, SessionKey};
use crate::protocol::{meta, ChatRequest, Chunk, ErrorType, ValidRequest, MAX_BODY_BYTES};
use crate::run::{Place, ReattachError};
use crate::sse;
use crate::store::redis::Remote;
use crate::store::Fault;

/// The browser chat page, embedded at build time.
const INDEX_HTML: &str = include_str!("../../clients/web/index.html");
/// The JS client module the page imports, served at a stable path.
const CLIENT_MJS: &str = include_str!("../../clients/js/chatgate-client.mjs");
/// The page runs its own inline module and talks to its own origin only.
const PAGE_CSP: &str = "default-src 'none'; script-src 'self' 'unsafe-inline'; \
                        style-src 'unsafe-inline'; connect-src 'self'; base-uri 'none'; \
                        form-action 'none'; frame-ancestors 'none'";

/// The chat endpoint's path.
pub const CHAT_PATH: &str = "/api/v1/chat/stream";

pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource(CHAT_PATH)
            .route(web::post().to(chat_stream))
            .route(web::method(Method::OPTIONS).to(preflight))
            .default_service(web::to(method_not_allowed)),
    )
    .route("/healthz", web::get().to(health))
    .route("/health", web::get().to(health))
    // simacode's paths, for its clients and probes.
    .route("/health/", web::get().to(health))
    .route("/health/live", web::get().to(health))
    .route("/health/ready", web::get().to(ready))
    .route("/readyz", web::get().to(ready))
    .route("/metrics", web::get().to(metrics))
    .route("/", web::get().to(index))
    .route("/chatgate-client.mjs", web::get().to(client_module))
    .default_service(web::to(not_found));
}

/// Any other method on the chat endpoint: 405, `Allow: POST`, and the error
/// as the endpoint's one-chunk stream.
async fn method_not_allowed(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let err = ChatError::MethodNotAllowed(req.method().to_string());
    let mut response = state.refuse(Refusal::from(err));
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
    response
}

/// Any other path: 404 with a JSON body that says where the API is.
async fn not_found(req: HttpRequest) -> HttpResponse {
    HttpResponse::NotFound().json(serde_json::json!({
        "error_type": "not_found",
        "error": format!(
            "no such path: {}; the chat endpoint is POST {CHAT_PATH}, health GET /healthz",
            req.path()
        ),
    }))
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
    if let Some(audit) = state
        .runs
        .settings
        .audit
        .as_ref()
        .filter(|a| !a.is_healthy())
    {
        return HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "status": "audit_unavailable",
            "audit_log": audit.path().display().to_string(),
            "error": "the audit log cannot be written: nothing runs until it can",
        }));
    }
    if let Err(store) = state.runs.settings.store.health() {
        return HttpResponse::ServiceUnavailable().json(serde_json::json!({
            "status": "store_unavailable",
            "store": store,
            "error": "the store cannot be reached: decisions are refused until it can",
        }));
    }
    if state.runs.shutdown.is_cancelled() {
        HttpResponse::ServiceUnavailable().json(serde_json::json!({ "status": "shutting_down" }))
    } else {
        HttpResponse::Ok().json(serde_json::json!({ "status": "ready" }))
    }
}

/// Prometheus text (0.0.4) by default, OpenMetrics when the scraper asks
/// for it in `Accept`.
async fn metrics(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let openmetrics = req
        .headers()
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("application/openmetrics-text"));
    let runs = &state.runs;
    let counts = runs.manager.counts();
    let gauges = crate::metrics::RunGauges {
        active: counts.active,
        paused: counts.paused,
        detached: runs.logs.detached(),
    };
    let (content_type, body) = if openmetrics {
        (
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            runs.metrics.render_openmetrics(gauges),
        )
    } else {
        (
            "text/plain; version=0.0.4; charset=utf-8",
            runs.metrics.render_text(gauges),
        )
    };
    HttpResponse::Ok().content_type(content_type).body(body)
}

/// `POST /api/v1/chat/stream`: a chat message starts a run; a
/// `CONFIRM_ACTION` message decides the pause of the session's run.
async fn chat_stream(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let mut response = match chat(&req, payload, &state).await {
        Ok(response) => response,
        Err(refusal) => state.refuse(refusal),
    };
    allow_origin(&req, &state, &mut response);
    response
}

/// CORS preflight: allowed origins may POST JSON with a bearer key.
async fn preflight(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    if let Err(err) = state.access.check_host(req.headers()) {
        return state.refuse(Refusal::from(err));
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

async fn chat(
    req: &HttpRequest,
    payload: web::Payload,
    state: &AppState,
) -> Result<HttpResponse, Refusal> {
    let headers = req.headers();
    state.access.check_host(headers)?;
    state.access.check_origin(headers)?;
    let forwarded = forward::is_forwarded(state.runs.cluster.as_deref(), headers)?;
    let owner = state.access.owner(headers)?;
    let (request, body) = tokio::time::timeout(state.request_timeout, read_request(req, payload))
        .await
        .map_err(|_| ChatError::RequestTimeout)??;
    let last_event_id = headers.get("last-event-id").map(|v| v.as_bytes());
    match request.validate(last_event_id)? {
        ValidRequest::Reattach {
            session_id,
            last_seen,
        } => {
            let key = SessionKey::new(owner, &session_id);
            if let Some(owner) = elsewhere(state, &key, forwarded, &session_id).await? {
                return forward_to(state, &owner, req, body, &session_id).await;
            }
            let subscription = state.runs.reattach(key, last_seen).map_err(|err| {
                let err = match err {
                    ReattachError::NoSuchRun => ChatError::NoSuchRun,
                    ReattachError::Beyond(beyond) => ChatError::InvalidRequest(format!(
                        "Last-Event-ID {last_seen} is beyond the last chunk sent ({})",
                        beyond.last_sent
                    )),
                };
                Refusal::new(err, &session_id)
            })?;
            Ok(sse::stream_response(subscription))
        }
        ValidRequest::Reply {
            session_id,
            reply,
            confirmation_id,
            decisions,
        } => {
            let key = SessionKey::new(owner, &session_id);
            if let Some(owner) = elsewhere(state, &key, forwarded, &session_id).await? {
                return forward_to(state, &owner, req, body, &session_id).await;
            }
            let accepted = state
                .runs
                .manager
                .decide(
                    &key,
                    &reply,
                    confirmation_id.as_deref(),
                    decisions.as_deref(),
                )
                .map_err(|err| Refusal::new(err, &session_id))?;
            let chunk = Chunk::confirmation_received(
                &session_id,
                format!("Received {}", accepted.action.as_str()),
                accepted.action,
                &accepted.confirmation_id,
                accepted.confirmation_round,
                accepted.decisions.as_ref(),
            )
            .finished();
            let client = forward::client_address(req, forwarded);
            deliver(state, client, &key, accepted)
                .await
                .map_err(|err| Refusal::new(err, &session_id))?;
            Ok(sse::single_chunk(StatusCode::OK, chunk))
        }
        ValidRequest::Chat {
            session_id,
            message,
        } => {
            let session_id = session_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
            if state.runs.shutdown.is_cancelled() {
                return Err(Refusal::new(ChatError::ShuttingDown, &session_id));
            }
            let key = SessionKey::new(owner, &session_id);
            let place = state.runs.claim(&key).await.map_err(|err| {
                log::error!("{err}");
                Refusal::new(ChatError::StoreUnreachable, &session_id)
            })?;
            let stored_id = match place {
                Place::Here(stored_id) => stored_id,
                // Forwarded here, yet another replica owns it now: no second hop.
                Place::Owner(_) if forwarded => {
                    return Err(Refusal::new(ChatError::owner_unavailable(), &session_id))
                }
                Place::Owner(owner) => {
                    return forward_to(state, &owner, req, body, &session_id).await
                }
                Place::Draining => return Err(Refusal::new(ChatError::ShuttingDown, &session_id)),
            };
            let subscription = state
                .runs
                .start(key, message, stored_id)
                .map_err(|err| Refusal::new(err, &session_id))?;
            Ok(sse::stream_response(subscription))
        }
    }
}

/// The owner when another replica owns `key`'s run; `None` when the
/// request is answered here (a forwarded request always is).
async fn elsewhere(
    state: &AppState,
    key: &SessionKey,
    forwarded: bool,
    session_id: &str,
) -> Result<Option<Remote>, Refusal> {
    if forwarded {
        return Ok(None);
    }
    match state.runs.place(key).await {
        Ok(Place::Here(_)) => Ok(None),
        Ok(Place::Owner(owner)) => Ok(Some(owner)),
        Ok(Place::Draining) => Err(Refusal::new(ChatError::ShuttingDown, session_id)),
        Err(err) => {
            log::error!("{err}");
            Err(Refusal::new(ChatError::StoreUnreachable, session_id))
        }
    }
}

/// The owner's answer to the client's request.
async fn forward_to(
    state: &AppState,
    owner: &Remote,
    req: &HttpRequest,
    body: bytes::Bytes,
    session_id: &str,
) -> Result<HttpResponse, Refusal> {
    let Some(cluster) = &state.runs.cluster else {
        return Err(Refusal::new(ChatError::owner_unavailable(), session_id));
    };
    state.runs.metrics.forwarded();
    cluster
        .forward(owner, req, body)
        .await
        .map_err(|err| Refusal::new(err, session_id))
}

/// Hands an accepted decision to its run: at once without an audit log;
/// with one, only once the `decided` record is on disk. If it cannot be
/// written the run ends with `audit_unavailable` and the reply gets 503: a
/// decision is never acted on unrecorded, nor acknowledged unacted.
async fn deliver(
    state: &AppState,
    client: Option<String>,
    key: &SessionKey,
    accepted: Accepted,
) -> Result<(), ChatError> {
    // A decision on a stored pause is recorded in the store first: a
    // decision answered 200 must survive a crash that follows.
    if let Some(run) = &accepted.stored {
        let decision = serde_json::json!({
            "action": accepted.action.as_str(),
            "confirmation_id": accepted.confirmation_id,
            "decisions": accepted.decisions,
        });
        if let Err(err) = state
            .runs
            .settings
            .store
            .record_decision(run, decision)
            .await
        {
            log::error!("{err}");
            let refused = match err.fault {
                // Not recorded, so not taken: the pause waits on, for a retry.
                Fault::Unreachable => {
                    accepted.ticket.withdraw();
                    ChatError::StoreUnavailable
                }
                Fault::Moved => {
                    // Another replica took this run over: the copy here is
                    // suspended, and its client re-attaches to the owner.
                    accepted.ticket.withdraw();
                    state.runs.relinquish(key);
                    ChatError::StoreUnavailable
                }
                // Nobody can decide it any more: it ends, nothing run, with
                // an error chunk that says so.
                Fault::Lost => {
                    accepted.ticket.fail(ErrorType::StoreUnavailable);
                    ChatError::StoreLost
                }
            };
            return Err(refused);
        }
    }
    let Some(audit) = state.runs.settings.audit.clone() else {
        accepted.ticket.deliver();
        return Ok(());
    };
    let mut fields =
        audit::run_fields(accepted.run_id, &key.session_id, accepted.stored.as_deref());
    fields.insert(
        meta::CONFIRMATION_ID.into(),
        accepted.confirmation_id.into(),
    );
    fields.insert("round".into(), accepted.confirmation_round.into());
    fields.insert(meta::ACTION.into(), accepted.action.as_str().into());
    fields.insert(
        meta::DECISIONS.into(),
        serde_json::to_value(&accepted.decisions).unwrap_or_default(),
    );
    fields.insert("key".into(), audit::key_label(key.owner).into());
    fields.insert("client".into(), client.into());
    let ticket = accepted.ticket;
    // A task of its own: a client that goes away while the record is being
    // written cannot leave its decision half done.
    let written = tokio::spawn(async move {
        match audit.write("decided", fields).await {
            Ok(()) => {
                ticket.deliver();
                true
            }
            Err(_) => {
                ticket.fail(ErrorType::AuditUnavailable);
                false
            }
        }
    })
    .await;
    match written {
        Ok(true) => Ok(()),
        _ => Err(ChatError::AuditUnavailable),
    }
}

/// Reads and decodes the body: JSON only, at most [`MAX_BODY_BYTES`].
/// Returns the request and the body as it came (a replica forwards it).
async fn read_request(
    req: &HttpRequest,
    mut payload: web::Payload,
) -> Result<(ChatRequest, bytes::Bytes), ChatError> {
    let content_type = req
        .headers()
        .get(header::CONTENT_TYPE)
        .map(|value| String::from_utf8_lossy(value.as_bytes()).into_owned());
    let is_json = content_type
        .as_deref()
        .and_then(|value| value.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("application/json"));
    if !is_json {
        return Err(ChatError::UnsupportedMediaType(content_type));
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<usize>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES) {
        return Err(ChatError::PayloadTooLarge);
    }
    let mut body = bytes::BytesMut::with_capacity(declared.unwrap_or(1024).min(MAX_BODY_BYTES));
    while let Some(piece) = payload.next().await {
        let piece =
            piece.map_err(|err| ChatError::InvalidRequest(format!("unreadable body: {err}")))?;
        if body.len() + piece.len() > MAX_BODY_BYTES {
            return Err(ChatError::PayloadTooLarge);
        }
        body.extend_from_slice(&piece);
    }
    let request = serde_json::from_slice(&body).map_err(|err| {
        ChatError::InvalidRequest(format!("body is not a valid chat request: {err}"))
    })?;
    Ok((request, body.freeze()))
}
