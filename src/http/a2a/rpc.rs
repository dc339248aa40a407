//! What every A2A method shares: the call ([`Call`]: who, which request),
//! its answer ([`Answer`]: one JSON-RPC response, or a stream of them),
//! a task as the caller may see it, and refusals as JSON-RPC errors.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use actix_web::http::{header, StatusCode};
use actix_web::{HttpRequest, HttpResponse};
use bytes::Bytes;
use futures_util::stream::BoxStream;
use futures_util::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::http::access::Caller;
use crate::http::error::ChatError;
use crate::http::event_stream;
use crate::http::forward::Forwarded;
use crate::http::state::AppState;
use crate::protocol::a2a::{self, code, TaskAddress};
use crate::run::a2a::A2aTask;

/// How long a `SendMessage` (not streaming) waits for its task to pause
/// or end before it answers with the task as it is (`WORKING`).
pub const SEND_WAIT: Duration = Duration::from_secs(30);
/// The keep-alive comment's period on an A2A stream.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// One JSON-RPC call: the request, the server, who called, its id, and
/// its body as it came (a replica passes it on to the session's holder).
pub struct Call<'a> {
    pub req: &'a HttpRequest,
    pub state: &'a AppState,
    pub caller: Caller,
    pub id: Value,
    pub body: Bytes,
    /// Set when another replica passed the call on.
    pub forwarded: Option<Forwarded>,
}

/// A method's answer.
pub enum Answer {
    Json(Value),
    Stream(BoxStream<'static, Value>),
}

impl Answer {
    pub fn respond(self) -> HttpResponse {
        match self {
            Answer::Json(body) => HttpResponse::Ok()
                .insert_header((header::CACHE_CONTROL, "no-store"))
                .json(body),
            Answer::Stream(events) => {
                let frames = events.map(|event| {
                    let mut frame = b"data: ".to_vec();
                    frame.extend(event.to_string().into_bytes());
                    frame.extend_from_slice(b"\n\n");
                    Ok::<_, Infallible>(Bytes::from(frame))
                });
                event_stream::stream_response(with_keep_alive(frames))
            }
        }
    }
}

/// `frames`, with an SSE comment whenever nothing was written for
/// [`KEEP_ALIVE`] (a proxy does not close an idle stream).
fn with_keep_alive(
    frames: impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> {
    let frames = frames.boxed();
    futures_util::stream::unfold(Some(frames), |state| async move {
        let mut frames = state?;
        match tokio::time::timeout(KEEP_ALIVE, frames.next()).await {
            Ok(Some(frame)) => Some((frame, Some(frames))),
            Ok(None) => None,
            Err(_) => Some((
                Ok(Bytes::from_static(crate::sse::KEEP_ALIVE_COMMENT)),
                Some(frames),
            )),
        }
    })
}

impl<'a> Call<'a> {
    pub fn new(req: &'a HttpRequest, state: &'a AppState, caller: Caller, id: Value) -> Call<'a> {
        Call {
            req,
            state,
            caller,
            id,
            body: Bytes::new(),
            forwarded: None,
        }
    }

    pub fn ok(&self, result: Value) -> Answer {
        Answer::Json(a2a::result(&self.id, result))
    }

    pub fn fail(&self, code: i64, message: &str, error_type: Option<&str>) -> Answer {
        Answer::Json(a2a::error(&self.id, code, message, error_type))
    }

    /// A refusal of chatgate's, as a JSON-RPC error with its `error_type`.
    pub fn refused(&self, err: &ChatError) -> Answer {
        let (status, error_type) = err.wire();
        self.state.runs.metrics().error(error_type);
        let code = match status.as_u16() {
            401 | 403 => code::INVALID_REQUEST,
            404 | 409 => code::UNSUPPORTED_OPERATION,
            400..=499 => code::INVALID_PARAMS,
            _ => code::INTERNAL,
        };
        self.fail(code, &err.to_string(), Some(error_type.as_str()))
    }

    /// `params` as `T`, or the invalid-params error.
    pub fn params<T: DeserializeOwned>(&self, params: Value) -> Result<T, Answer> {
        serde_json::from_value(params)
            .map_err(|err| self.fail(code::INVALID_PARAMS, &format!("params: {err}"), None))
    }

    /// The task `id`, when the caller may see it (its own key's, or an
    /// approver's whose scope takes its namespace in): held here, or made
    /// again from its run when this process holds the run but not the
    /// task (a restart, a takeover) and the run waits on a pause.
    pub fn task(&self, id: &str) -> Result<Arc<A2aTask>, Answer> {
        let not_found = || self.fail(code::TASK_NOT_FOUND, &format!("no task {id}"), None);
        let Some(key) = self.task_key(id) else {
            return Err(not_found());
        };
        let runs = &self.state.runs;
        let found = || {
            let pause = runs.waiting_pause(&key)?;
            let run = TaskAddress::parse(id)?.run;
            if pause.run.as_deref() != Some(run.as_str()) {
                return None;
            }
            let mut request = pause.request;
            request.confirmation_data = Some(pause.data);
            let held = runs
                .replays()
                .find(&key)
                .is_some_and(|log| !log.is_detached());
            let stream = match held {
                true => None,
                false => runs.reattach(key.clone(), pause.sequence).ok(),
            };
            Some((request, stream))
        };
        match self.state.a2a.get_or_find(id, &key, found) {
            Ok(Some(task)) => Ok(task),
            Ok(None) => Err(not_found()),
            Err(full) => Err(self.fail(code::INTERNAL, &full.to_string(), Some("overloaded"))),
        }
    }

    /// The session of the task `id`, when it is a task id this server
    /// writes and the caller may see its session.
    pub fn task_key(&self, id: &str) -> Option<crate::session::SessionKey> {
        let address = TaskAddress::parse(id)?;
        let namespaces = &self.state.runs.settings().namespaces;
        let owner = namespaces.owner(address.namespace.as_deref())?;
        if !self.state.access.may_see(self.caller, owner) {
            return None;
        }
        Some(crate::session::SessionKey::new(owner, &address.session_id))
    }

    /// Decides `task`'s pause `pause` with `reply` on the one decision
    /// path, as this call's key, `via: a2a`.
    pub async fn decide(
        &self,
        task: &A2aTask,
        pause: &str,
        reply: &crate::protocol::ReplyMessage,
        payload: crate::protocol::ReplyPayload<'_>,
    ) -> Result<crate::run::decide::Decided, crate::run::decide::ReplyError> {
        let client = crate::http::forward::client_address(self.req, self.forwarded.is_some());
        let decider = self.state.access.decider(self.caller);
        let reply = crate::run::decide::Reply {
            message: reply,
            confirmation_id: Some(pause),
            payload,
            client: client.as_deref(),
            decider: &decider,
            not_after: self.forwarded.and_then(|f| f.not_after),
            via: crate::protocol::Via::A2a,
        };
        self.state.runs.decide(&task.key, reply).await
    }

    /// The task's events as JSON-RPC results: the task first, then its
    /// updates, until it ends.
    pub fn stream(&self, task: Arc<A2aTask>) -> Answer {
        let (snapshot, updates) = task.snapshot_and_subscribe();
        let id = self.id.clone();
        let first = a2a::result(&id, serde_json::json!({"task": snapshot}));
        let ended = task.state().is_terminal();
        let rest = futures_util::stream::unfold(
            (!ended).then_some((updates, task, id)),
            |state| async move {
                let (mut updates, task, id) = state?;
                // Fell behind (an error): the stream ends, and the client
                // subscribes again (the task comes first).
                let event = updates.recv().await.ok()?;
                let ends = event["statusUpdate"]["status"]["state"]
                    .as_str()
                    .is_some_and(is_terminal);
                let next = (!ends).then_some((updates, task, id.clone()));
                Some((a2a::result(&id, event), next))
            },
        );
        Answer::Stream(
            futures_util::stream::once(async move { first })
                .chain(rest)
                .boxed(),
        )
    }
}

fn is_terminal(state: &str) -> bool {
    matches!(
        state,
        "TASK_STATE_COMPLETED"
            | "TASK_STATE_CANCELED"
            | "TASK_STATE_FAILED"
            | "TASK_STATE_REJECTED"
    )
}

/// A request refused before it is read (its key, its body): the chat
/// endpoint's status, and the JSON-RPC error with the `error_type`.
pub fn http_refusal(state: &AppState, err: &ChatError) -> HttpResponse {
    let (status, error_type) = err.wire();
    state.runs.metrics().error(error_type);
    let code = match status {
        StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => code::INVALID_REQUEST,
        StatusCode::PAYLOAD_TOO_LARGE | StatusCode::UNSUPPORTED_MEDIA_TYPE => code::INVALID_REQUEST,
        _ => code::INTERNAL,
    };
    let body = a2a::error(
        &Value::Null,
        code,
        &err.to_string(),
        Some(error_type.as_str()),
    );
    let mut response = HttpResponse::build(status).json(body);
    if status == StatusCode::UNAUTHORIZED {
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer"),
        );
    }
    response
}

/// Waits (at most [`SEND_WAIT`]) until the task ends, or waits on a pause
/// other than `answered`, or is no longer followed.
pub async fn settled(task: &A2aTask, answered: Option<&str>) {
    let mut changes = task.changes();
    let deadline = tokio::time::Instant::now() + SEND_WAIT;
    loop {
        let state = task.state();
        let paused_anew = state.is_interrupted() && task.pause().as_deref() != answered;
        if state.is_terminal() || paused_anew || !task.followed() {
            return;
        }
        match tokio::time::timeout_at(deadline, changes.changed()).await {
            Ok(Ok(())) => {}
            _ => return,
        }
    }
}

/// A push config as it may be kept: an `http` or `https` URL (no redirect
/// is ever followed), at most [`crate::protocol::a2a::MAX_PUSH_CONFIGS`] per task.
pub fn checked_push(
    call: &Call<'_>,
    config: &crate::protocol::a2a::PushConfig,
) -> Result<(), Answer> {
    let url = reqwest::Url::parse(&config.url).ok();
    let fits = url
        .as_ref()
        .is_some_and(|url| matches!(url.scheme(), "http" | "https") && url.has_host());
    if !fits || config.url.len() > 2048 {
        let why = "a push config's url is an http or https URL of at most 2048 bytes";
        return Err(call.fail(code::INVALID_PARAMS, why, Some("invalid_request")));
    }
    let host = url.as_ref().and_then(|url| url.host_str()).unwrap_or("");
    if !call.state.a2a.may_push_to(host) {
        let why =
            format!("this server pushes only to the hosts it names (--a2a-push-host); not {host}");
        return Err(call.fail(code::INVALID_PARAMS, &why, Some("invalid_request")));
    }
    Ok(())
}
