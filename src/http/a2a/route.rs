//! Where an A2A call is answered: here, or at the replica that holds the
//! session it addresses (a task's id names its session, a new message's
//! `contextId` does), which answers it as its own (the body passed on as
//! it came; a stream comes back streamed).

use actix_web::HttpResponse;
use serde_json::Value;

use super::rpc::Call;
use crate::http::chat;
use crate::http::forward::Forwarding;
use crate::protocol::a2a::RpcRequest;
use crate::session::SessionKey;

/// The owner's answer when another replica holds the session `request`
/// addresses; `None` to answer here (the session is here or nowhere, or
/// the call addresses no session the caller may see: then it is refused
/// here as it would be anywhere). A parked run of the session is woken
/// here on the way (#46).
pub async fn elsewhere(call: &Call<'_>, request: &RpcRequest) -> Option<HttpResponse> {
    let key = addressed(call, request)?;
    let peer = match chat::elsewhere(call.state, &key, call.forwarded).await {
        Ok(None) => return None,
        Ok(Some(peer)) => peer,
        Err(err) => return Some(call.refused(&err).respond()),
    };
    let forwarding = match request.method.as_str() {
        "GetTask" | "ListTasks" | "SubscribeToTask" => Forwarding::Read,
        _ => Forwarding::Change,
    };
    let body = call.body.clone();
    match chat::forward_to(call.state, &peer, &key, call.req, body, forwarding).await {
        Ok(response) => Some(response),
        Err(err) => Some(call.refused(&err).respond()),
    }
}

/// The session a call addresses, when the caller may see it: a task's
/// (by its id), or a new message's or a listing's `contextId`.
fn addressed(call: &Call<'_>, request: &RpcRequest) -> Option<SessionKey> {
    let params = &request.params;
    let text = |value: &Value| value.as_str().map(str::to_owned);
    let task_id = match request.method.as_str() {
        "SendMessage" | "SendStreamingMessage" => params["message"].get("taskId").and_then(text),
        "GetTask" | "CancelTask" | "SubscribeToTask" => params.get("id").and_then(text),
        "CreateTaskPushNotificationConfig"
        | "GetTaskPushNotificationConfig"
        | "ListTaskPushNotificationConfigs"
        | "DeleteTaskPushNotificationConfig" => params.get("taskId").and_then(text),
        _ => None,
    };
    if let Some(id) = task_id {
        return call.task_key(&id);
    }
    let context = match request.method.as_str() {
        "SendMessage" | "SendStreamingMessage" => params["message"].get("contextId"),
        "ListTasks" => params.get("contextId"),
        _ => None,
    }?;
    let crate::http::access::Caller::Owner(owner) = call.caller else {
        return None;
    };
    let context = context
        .as_str()
        .filter(|c| crate::protocol::is_valid_session_id(c))?;
    Some(SessionKey::new(owner, context))
}
