//! `POST /api/v1/chat/stream`: extract, check who may call, read and
//! validate the request, then one call below HTTP (start a run, decide a
//! pause, re-attach) or a forward to the replica that owns the session;
//! respond. A refusal goes through the error table ([`super::error`]).

use actix_web::http::{header, StatusCode};
use actix_web::{web, HttpRequest, HttpResponse};
use futures_util::StreamExt;

use super::access::Caller;
use super::access_log;
use super::error::{ChatError, Refusal};
use super::event_stream;
use super::forward::{self, Forwarded, Forwarding};
use super::state::AppState;
use crate::cluster::Peer;
use crate::confirmation::DecideError;
use crate::protocol::{ChatRequest, ReplyPayload, ValidRequest, MAX_BODY_BYTES};
use crate::run::decide::{Reply, ReplyError};
use crate::run::place::Place;
use crate::run::start::Started;
use crate::run::ReattachError;
use crate::session::{RunTag, SessionKey};

/// `POST /api/v1/chat/stream`: a chat message starts a run; a
/// `CONFIRM_ACTION` message decides the pause of the session's run.
pub async fn chat_stream(
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
pub async fn preflight(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
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
pub(super) fn allow_origin(req: &HttpRequest, state: &AppState, response: &mut HttpResponse) {
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
    let forwarded = forward::forwarded(state.runs.cluster().map(|c| c.as_ref()), headers)?;
    let caller = state.access.caller(headers)?;
    let (request, body) = tokio::time::timeout(state.request_timeout, read_request(req, payload))
        .await
        .map_err(|_| ChatError::RequestTimeout)??;
    let last_event_id = headers.get("last-event-id").map(|v| v.as_bytes());
    let incoming = Incoming {
        req,
        state,
        caller,
        forwarded,
        body,
    };
    match request.validate(last_event_id)? {
        ValidRequest::Reattach {
            session_id,
            last_seen,
            confirmation_id,
        } => reattach(incoming, &session_id, last_seen, confirmation_id.as_deref()).await,
        ValidRequest::Reply {
            session_id,
            reply,
            confirmation_id,
            decisions,
            answers,
            grant,
        } => {
            let reply = RawReply {
                message: &reply,
                confirmation_id: confirmation_id.as_deref(),
                payload: ReplyPayload {
                    decisions: decisions.as_deref(),
                    answers: answers.as_ref(),
                    grant: grant.as_ref(),
                },
            };
            decide(incoming, &session_id, reply).await
        }
        ValidRequest::Chat {
            session_id,
            message,
        } => start(incoming, session_id, message).await,
    }
}

/// A request on the chat endpoint, read and checked: who sent it, from
/// where, and its body as it came (a replica forwards it).
struct Incoming<'a> {
    req: &'a HttpRequest,
    state: &'a AppState,
    caller: Caller,
    forwarded: Option<Forwarded>,
    body: bytes::Bytes,
}

impl Incoming<'_> {
    /// Where the request's run is, for `session_id` (or the pause an
    /// approver's `confirmation_id` names), the session noted for the
    /// access log first.
    async fn route(
        &self,
        session_id: &str,
        confirmation_id: Option<&str>,
    ) -> Result<Route, Unrouted> {
        access_log::note_session(self.req, session_id);
        let (caller, forwarded) = (self.caller, self.forwarded);
        route(self.state, caller, session_id, confirmation_id, forwarded).await
    }
}

/// A reply's parts, as the request gave them.
struct RawReply<'a> {
    message: &'a crate::protocol::ReplyMessage,
    confirmation_id: Option<&'a str>,
    payload: ReplyPayload<'a>,
}

/// A re-attach (`Last-Event-ID`): the run's stream from there, here or at
/// its owner.
async fn reattach(
    incoming: Incoming<'_>,
    session_id: &str,
    last_seen: u64,
    confirmation_id: Option<&str>,
) -> Result<HttpResponse, Refusal> {
    let refused = |err: ChatError| Refusal::new(err, session_id);
    let routed = incoming.route(session_id, confirmation_id).await;
    let Incoming { req, state, .. } = incoming;
    let key = match routed {
        Ok(Route::Here(key)) => key,
        Ok(Route::Forward(key, peer)) => {
            return forward_to(state, &peer, &key, req, incoming.body, Forwarding::Read)
                .await
                .map_err(refused)
        }
        Err(Unrouted::NoRun) => return Err(refused(ReattachError::NoSuchRun.into())),
        Err(Unrouted::OutOfScope(why)) => return Err(refused(ChatError::ForbiddenScope(why))),
        Err(Unrouted::Refused(err)) => return Err(refused(err)),
    };
    let subscription = state
        .runs
        .reattach_or_outcome(key, last_seen)
        .await
        .map_err(|err| refused(err.into()))?;
    Ok(event_stream::stream_response(subscription))
}

/// A reply: the pause of the session's run decided, here or at its owner.
async fn decide(
    incoming: Incoming<'_>,
    session_id: &str,
    raw: RawReply<'_>,
) -> Result<HttpResponse, Refusal> {
    let refused = |err: ChatError| Refusal::new(err, session_id);
    let routed = incoming.route(session_id, raw.confirmation_id).await;
    let Incoming { req, state, .. } = incoming;
    let key = match routed {
        Ok(Route::Here(key)) => key,
        Ok(Route::Forward(key, peer)) => {
            return forward_to(state, &peer, &key, req, incoming.body, Forwarding::Change)
                .await
                .map_err(refused)
        }
        // The run's log is gone: its kept outcome may still say who
        // decided the pause the reply names.
        Err(Unrouted::NoRun) => {
            let id = raw.confirmation_id.unwrap_or_default();
            let told = match state.runs.kept().decided_by_pause(session_id, id).await {
                Some(note) => ReplyError::Decided(note),
                None => DecideError::NoPending.into(),
            };
            return Err(refused(ChatError::Reply(told)));
        }
        Err(Unrouted::OutOfScope(why)) => {
            let why = DecideError::ForbiddenScope(why);
            return Err(refused(ChatError::Reply(why.into())));
        }
        Err(Unrouted::Refused(err)) => return Err(refused(err)),
    };
    let client = forward::client_address(req, incoming.forwarded.is_some());
    let decider = state.access.decider(incoming.caller);
    let reply = Reply {
        message: raw.message,
        confirmation_id: raw.confirmation_id,
        payload: raw.payload,
        client: client.as_deref(),
        decider: &decider,
        not_after: incoming.forwarded.and_then(|f| f.not_after),
        via: crate::protocol::Via::Chat,
    };
    let decided = state
        .runs
        .decide(&key, reply)
        .await
        .map_err(|err| refused(err.into()))?;
    let ack = decided.acknowledgement(session_id);
    Ok(event_stream::single_chunk(StatusCode::OK, ack))
}

/// A chat message: a new run on the session (superseding a paused one),
/// here or at the replica that owns the session.
async fn start(
    incoming: Incoming<'_>,
    session_id: Option<String>,
    message: String,
) -> Result<HttpResponse, Refusal> {
    let Incoming { req, state, .. } = incoming;
    let session_id = session_id.unwrap_or_else(|| uuid::Uuid::new_v4().to_string());
    access_log::note_session(req, &session_id);
    let refused = |err: ChatError| Refusal::new(err, &session_id);
    let Caller::Owner(owner) = incoming.caller else {
        return Err(refused(ChatError::ForbiddenRole));
    };
    if state.runs.is_shutting_down() {
        return Err(refused(ChatError::ShuttingDown));
    }
    let key = SessionKey::new(owner, &session_id);
    let not_after = incoming.forwarded.and_then(|f| f.not_after);
    let started = state
        .runs
        .start(key.clone(), message, not_after)
        .await
        .map_err(|err| refused(err.into()))?;
    match started {
        Started::Here(subscription) => Ok(event_stream::stream_response(subscription)),
        // Forwarded here, yet another replica owns it now: no second hop.
        Started::Elsewhere(_) if incoming.forwarded.is_some() => {
            Err(refused(ChatError::owner_unavailable()))
        }
        Started::Elsewhere(peer) => {
            forward_to(state, &peer, &key, req, incoming.body, Forwarding::Change)
                .await
                .map_err(refused)
        }
    }
}

/// Where a request about a session's run (a re-attach, a reply) goes.
pub(super) enum Route {
    /// Answered here, about this session.
    Here(SessionKey),
    /// Forwarded to the live replica that holds the session's run.
    Forward(SessionKey, Peer),
}

/// Why such a request has nowhere to go (each request says it its way).
pub(super) enum Unrouted {
    /// An approver's `confirmation_id` names no run that holds it.
    NoRun,
    /// The caller's key may not see the run's namespace: why.
    OutOfScope(String),
    Refused(ChatError),
}

/// The one preamble of a request about a run: the session (the caller's
/// own, or for an approver the one its `confirmation_id` names), whether
/// the caller may see it, and where its run is answered.
pub(super) async fn route(
    state: &AppState,
    caller: Caller,
    session_id: &str,
    confirmation_id: Option<&str>,
    forwarded: Option<Forwarded>,
) -> Result<Route, Unrouted> {
    let key = match caller {
        Caller::Owner(owner) => SessionKey::new(owner, session_id),
        Caller::Approver(_) => approved(state, confirmation_id)
            .await
            .map_err(Unrouted::Refused)?
            .ok_or(Unrouted::NoRun)?,
    };
    if !state.access.may_see(caller, key.owner) {
        return Err(Unrouted::OutOfScope(out_of_scope(state, caller)));
    }
    match elsewhere(state, &key, forwarded).await {
        Ok(None) => Ok(Route::Here(key)),
        Ok(Some(peer)) => Ok(Route::Forward(key, peer)),
        Err(err) => Err(Unrouted::Refused(err)),
    }
}

/// The session of the pause an approver names (by `confirmation_id`,
/// required: session ids are per namespace); `None` when no run holds it.
async fn approved(
    state: &AppState,
    confirmation_id: Option<&str>,
) -> Result<Option<SessionKey>, ChatError> {
    let confirmation_id = confirmation_id.ok_or(ChatError::ApproverWithoutConfirmationId)?;
    state
        .runs
        .inbox()
        .locate(confirmation_id)
        .await
        .map_err(ChatError::store(None))
}

/// The owner when another replica owns `key`'s run; `None` when the
/// request is answered here. A forwarded request is answered here, its run
/// restored first if this replica owns it without holding it (a takeover of
/// its own that ran late); if another replica owns it by now, there is no
/// second hop: the forwarder is told to retry.
pub(super) async fn elsewhere(
    state: &AppState,
    key: &SessionKey,
    forwarded: Option<Forwarded>,
) -> Result<Option<Peer>, ChatError> {
    let place = state.runs.place(key).await;
    match place.map_err(ChatError::store(Some(RunTag::session(key))))? {
        Place::Here => Ok(None),
        Place::Replica(_) if forwarded.is_some() => Err(ChatError::owner_unavailable()),
        Place::Replica(peer) => Ok(Some(peer)),
        Place::Draining => Err(ChatError::ShuttingDown),
    }
}

/// The owner's answer to the client's request.
pub(super) async fn forward_to(
    state: &AppState,
    owner: &Peer,
    key: &SessionKey,
    req: &HttpRequest,
    body: bytes::Bytes,
    forwarding: Forwarding,
) -> Result<HttpResponse, ChatError> {
    let Some(cluster) = state.runs.cluster() else {
        return Err(ChatError::owner_unavailable());
    };
    state.runs.metrics().forwarded();
    forward::forward(cluster, owner, &RunTag::session(key), req, body, forwarding).await
}

/// Any other method on the chat endpoint: 405, `Allow: POST`, and the error
/// as the endpoint's one-chunk stream.
pub async fn method_not_allowed(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let err = ChatError::MethodNotAllowed(req.method().to_string());
    let mut response = state.refuse(Refusal::from(err));
    response
        .headers_mut()
        .insert(header::ALLOW, header::HeaderValue::from_static("POST"));
    response
}

/// Reads and decodes the body: JSON only, at most [`MAX_BODY_BYTES`].
/// Returns the request and the body as it came (a replica forwards it).
async fn read_request(
    req: &HttpRequest,
    payload: web::Payload,
) -> Result<(ChatRequest, bytes::Bytes), ChatError> {
    let body = read_json_body(req, payload, MAX_BODY_BYTES).await?;
    let request = serde_json::from_slice(&body).map_err(|err| {
        ChatError::InvalidRequest(format!("body is not a valid chat request: {err}"))
    })?;
    Ok((request, body))
}

/// Reads a JSON body (`Content-Type: application/json`) of at most
/// `limit` bytes (413 beyond it, told before reading when declared).
pub(super) async fn read_json_body(
    req: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<bytes::Bytes, ChatError> {
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
    if declared.is_some_and(|len| len > limit) {
        return Err(ChatError::PayloadTooLarge(limit));
    }
    let mut body = bytes::BytesMut::with_capacity(declared.unwrap_or(1024).min(limit));
    while let Some(piece) = payload.next().await {
        let piece =
            piece.map_err(|err| ChatError::InvalidRequest(format!("unreadable body: {err}")))?;
        if body.len() + piece.len() > limit {
            return Err(ChatError::PayloadTooLarge(limit));
        }
        body.extend_from_slice(&piece);
    }
    Ok(body.freeze())
}

/// Why `caller` may not see a namespace's pause.
pub(super) fn out_of_scope(state: &AppState, caller: Caller) -> String {
    format!(
        "this key ({}) decides only the pauses of the namespaces it names (namespaces=)",
        state.access.label(caller)
    )
}
