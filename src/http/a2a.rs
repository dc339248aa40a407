//! The A2A face (A2A 1.0, JSON-RPC binding): the agent card at
//! `GET /.well-known/agent-card.json` and JSON-RPC 2.0 at `POST /a2a`.
//! Another door into the same runs: a message starts a run (its task), a
//! message to a task that waits on a pause decides it through the one
//! decision path (`via: a2a`); tasks are followed by
//! [`crate::run::a2a`]. Refusals are JSON-RPC errors carrying chatgate's
//! `error_type` (docs/protocol.md, "The A2A face").

mod route;
mod rpc;
mod send;
mod tasks;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::Value;

use super::error::ChatError;
use super::state::AppState;
use crate::protocol::a2a::{self, code, RpcRequest, A2A_PATH, MAX_A2A_BODY_BYTES};
use rpc::{Answer, Call};

/// `GET /.well-known/agent-card.json`: who this agent is and how to call
/// it (public: it names no secret).
pub async fn card(req: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let base = match &state.public_url {
        Some(url) => url.trim_end_matches('/').to_owned(),
        None => {
            let info = req.connection_info();
            format!("{}://{}", info.scheme(), info.host())
        }
    };
    let tools: Vec<(String, String)> = state
        .runs
        .settings()
        .tools
        .iter()
        .map(|tool| (tool.name.clone(), tool.description.clone()))
        .collect();
    let body = a2a::agent_card(
        &format!("{base}{A2A_PATH}"),
        env!("CARGO_PKG_VERSION"),
        &tools,
    );
    HttpResponse::Ok()
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .json(body)
}

/// `POST /a2a`: one JSON-RPC 2.0 request.
pub async fn rpc(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<AppState>,
) -> HttpResponse {
    let headers = req.headers();
    let checked = state
        .access
        .check_host(headers)
        .and_then(|()| state.access.check_origin(headers))
        .and_then(|()| state.access.caller(headers));
    let caller = match checked {
        Ok(caller) => caller,
        Err(err) => return rpc::http_refusal(&state, &err),
    };
    let read = super::chat::read_json_body(&req, payload, MAX_A2A_BODY_BYTES);
    let body = match tokio::time::timeout(state.request_timeout, read).await {
        Ok(Ok(body)) => body,
        Ok(Err(err)) => return rpc::http_refusal(&state, &err),
        Err(_) => return rpc::http_refusal(&state, &ChatError::RequestTimeout),
    };
    let cluster = state.runs.cluster().map(|c| c.as_ref());
    let forwarded = match super::forward::forwarded(cluster, req.headers()) {
        Ok(forwarded) => forwarded,
        Err(err) => return rpc::http_refusal(&state, &err),
    };
    match parse(&req, &body) {
        Ok(request) => {
            let mut call = Call::new(&req, &state, caller, request.id.clone());
            call.forwarded = forwarded;
            call.body = body;
            if let Some(answered) = route::elsewhere(&call, &request).await {
                return answered;
            }
            dispatch(call, request).await.respond()
        }
        // Not a JSON-RPC request of this version at all: 400, with the
        // JSON-RPC error as its body.
        Err(error) => HttpResponse::BadRequest().json(error),
    }
}

/// The body as a JSON-RPC request of a version this face speaks.
fn parse(req: &HttpRequest, body: &[u8]) -> Result<RpcRequest, Value> {
    let request: RpcRequest = match serde_json::from_slice::<Value>(body) {
        Err(err) => {
            return Err(a2a::error(
                &Value::Null,
                code::PARSE_ERROR,
                &err.to_string(),
                None,
            ))
        }
        Ok(value) => serde_json::from_value(value).map_err(|err| {
            a2a::error(&Value::Null, code::INVALID_REQUEST, &err.to_string(), None)
        })?,
    };
    if request.jsonrpc != "2.0" {
        let why = "jsonrpc must be \"2.0\"";
        return Err(a2a::error(&request.id, code::INVALID_REQUEST, why, None));
    }
    let version = req
        .headers()
        .get("a2a-version")
        .and_then(|v| v.to_str().ok())
        .map(str::trim);
    if version.is_some_and(|v| v != a2a::A2A_VERSION && v != "1") {
        let why = format!("this agent speaks A2A {}", a2a::A2A_VERSION);
        return Err(a2a::error(
            &request.id,
            code::VERSION_NOT_SUPPORTED,
            &why,
            None,
        ));
    }
    Ok(request)
}

async fn dispatch(call: Call<'_>, request: RpcRequest) -> Answer {
    let params = request.params;
    match request.method.as_str() {
        "SendMessage" => send::send(call, params, false).await,
        "SendStreamingMessage" => send::send(call, params, true).await,
        "GetTask" => tasks::get(call, params).await,
        "CancelTask" => tasks::cancel(call, params).await,
        "ListTasks" => tasks::list(call, params),
        "SubscribeToTask" => tasks::subscribe(call, params).await,
        "CreateTaskPushNotificationConfig" => tasks::push_create(call, params),
        "GetTaskPushNotificationConfig" => tasks::push_get(call, params),
        "ListTaskPushNotificationConfigs" => tasks::push_list(call, params),
        "DeleteTaskPushNotificationConfig" => tasks::push_delete(call, params),
        other => call.fail(code::METHOD_NOT_FOUND, &format!("no method {other}"), None),
    }
}
