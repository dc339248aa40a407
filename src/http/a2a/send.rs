//! `SendMessage` and `SendStreamingMessage`: a message without `taskId`
//! starts a run (its task) on the session `contextId` names (or a new
//! one); a message to a task that waits on a pause decides the pause
//! through the one decision path, `via: a2a`.

use std::sync::Arc;

use serde_json::{json, Map, Value};

use super::rpc::{settled, Answer, Call};
use crate::confirmation::DecideError;
use crate::http::access::Caller;
use crate::http::error::ChatError;
use crate::protocol::a2a::{code, Message, SendMessage, TaskAddress};
use crate::protocol::{
    is_valid_session_id, parse_reply, ChatRequest, ReplyMessage, ReplyPayload, TaskDecisionRequest,
    ValidRequest,
};
use crate::run::a2a::A2aTask;
use crate::run::start::Started;
use crate::session::SessionKey;

pub async fn send(call: Call<'_>, params: Value, streaming: bool) -> Answer {
    let request: SendMessage = match call.params(params) {
        Ok(request) => request,
        Err(answer) => return answer,
    };
    let configuration = request.configuration.clone().unwrap_or_default();
    if let Some(id) = request.message.task_id.clone() {
        return answer(call, id, request.message, streaming).await;
    }
    // A push config is checked before the task starts: one refused
    // starts nothing.
    let push = configuration.task_push_notification_config;
    if let Some(Err(answer)) = push.as_ref().map(|p| super::rpc::checked_push(&call, p)) {
        return answer;
    }
    let task = match start(&call, &request.message).await {
        Ok(task) => task,
        Err(answer) => return answer,
    };
    if let Some(push) = push {
        call.state.a2a.add_push(&task, push);
    }
    if streaming {
        return call.stream(task);
    }
    if !configuration.return_immediately {
        settled(&task, None).await;
    }
    call.ok(json!({"task": task.to_json(None, true)}))
}

/// A new task: the message's text as a chat message on the session
/// `contextId` names (a new one without it).
async fn start(call: &Call<'_>, message: &Message) -> Result<Arc<A2aTask>, Answer> {
    let refused = |err: ChatError| call.refused(&err);
    let Caller::Owner(owner) = call.caller else {
        return Err(refused(ChatError::ForbiddenRole));
    };
    let Some(text) = message.text() else {
        let why = "a new task's message needs a text part (the task, in words)";
        return Err(call.fail(code::INVALID_PARAMS, why, Some("invalid_request")));
    };
    let session = match &message.context_id {
        Some(context) if is_valid_session_id(context) => context.clone(),
        Some(_) => {
            let why = "contextId must be 1-128 characters without control characters";
            return Err(call.fail(code::INVALID_PARAMS, why, Some("invalid_request")));
        }
        None => uuid::Uuid::new_v4().to_string(),
    };
    let chat = ChatRequest {
        message: Some(text),
        session_id: Some(session.clone()),
        ..ChatRequest::default()
    };
    let text = match chat.validate(None).map_err(ChatError::from) {
        Ok(ValidRequest::Chat { message, .. }) => message,
        Ok(_) => {
            let why =
                "a new task's text is not a CONFIRM_ACTION reply: send it to the task (taskId)";
            return Err(call.fail(code::INVALID_PARAMS, why, Some("invalid_request")));
        }
        Err(err) => return Err(refused(err)),
    };
    if call.state.runs.is_shutting_down() {
        return Err(refused(ChatError::ShuttingDown));
    }
    let key = SessionKey::new(owner, &session);
    let address = TaskAddress {
        run: uuid::Uuid::new_v4().to_string(),
        namespace: call.state.runs.settings().namespaces.name(owner),
        session_id: session.clone(),
    };
    let run = Some(Arc::from(address.run.as_str()));
    let not_after = call.forwarded.and_then(|f| f.not_after);
    let runs = &call.state.runs;
    let started = runs.start_named(key.clone(), text, not_after, run).await;
    let subscription = match started.map_err(|err| refused(err.into()))? {
        Started::Here(subscription) => subscription,
        // Claimed by another replica since it was routed: retry.
        Started::Elsewhere(_) => return Err(refused(ChatError::owner_unavailable())),
    };
    let first = user_message(message, None, &session);
    call.state
        .a2a
        .open(address.id(), key, first, subscription)
        .map_err(|full| call.fail(code::INTERNAL, &full.to_string(), Some("overloaded")))
}

/// A message to the task `id`: an answer to the pause it waits on.
async fn answer(call: Call<'_>, id: String, message: Message, streaming: bool) -> Answer {
    let task = match call.task(&id) {
        Ok(task) => task,
        Err(answer) => return answer,
    };
    if task.state().is_terminal() {
        let why = "the task has ended: it takes no more messages";
        return call.fail(code::UNSUPPORTED_OPERATION, why, None);
    }
    let Some(pause) = task.pause() else {
        let err = ChatError::Reply(DecideError::NoPending.into());
        return call.refused(&err);
    };
    let (reply, decisions, answers) = match reply_of(&message) {
        Ok(parts) => parts,
        Err(why) => return call.fail(code::INVALID_PARAMS, &why, Some("invalid_request")),
    };
    let payload = ReplyPayload {
        decisions: decisions.as_deref(),
        answers: answers.as_ref(),
        grant: None,
    };
    let decided = call.decide(&task, &pause, &reply, payload).await;
    let decided = match decided {
        Ok(decided) => decided,
        Err(err) => return call.refused(&ChatError::Reply(err)),
    };
    task.heard(user_message(&message, Some(&task.id), task.context_id()));
    if streaming {
        return call.stream(task);
    }
    if decided.partial.is_none() && decided.progress.is_none() {
        settled(&task, Some(&pause)).await;
    }
    call.ok(json!({"task": task.to_json(None, true)}))
}

/// The reply a message makes: a data part's `decisions` (the tasks it
/// names, `decide`; `action` may say `confirm`), `answers` (`answer`) or
/// `action` alone (`cancel`, `skip`, `run_again`, `confirm`), else a text
/// part `CONFIRM_ACTION:...`.
type ReplyParts = (
    ReplyMessage,
    Option<Vec<TaskDecisionRequest>>,
    Option<Map<String, Value>>,
);

fn reply_of(message: &Message) -> Result<ReplyParts, String> {
    if let Some(data) = message.data() {
        // A data part is a protobuf Struct to most A2A clients, whose
        // numbers are all doubles: an index of 1 comes as 1.0.
        let Value::Object(data) = integral(Value::Object(data.clone())) else {
            return Err("the data part is not an object".to_owned());
        };
        let data = &data;
        let decisions: Option<Vec<TaskDecisionRequest>> = match data.get("decisions") {
            Some(list) => Some(
                serde_json::from_value(list.clone()).map_err(|err| format!("decisions: {err}"))?,
            ),
            None => None,
        };
        let answers = match data.get("answers") {
            Some(Value::Object(answers)) => Some(answers.clone()),
            Some(_) => return Err("answers must be an object".to_owned()),
            None => None,
        };
        let action = match (
            data.get("action").and_then(Value::as_str),
            &decisions,
            &answers,
        ) {
            (Some(action), _, _) => action.to_owned(),
            (None, Some(_), _) => "decide".to_owned(),
            (None, None, Some(_)) => "answer".to_owned(),
            (None, None, None) => {
                return Err("the data part has no decisions, answers or action".to_owned())
            }
        };
        let reply = parse_reply(&format!("CONFIRM_ACTION:{action}"))
            .and_then(Result::ok)
            .ok_or_else(|| format!("{action:?} is no action"))?;
        return Ok((reply, decisions, answers));
    }
    match message.text().as_deref().and_then(parse_reply) {
        Some(Ok(reply)) => Ok((reply, None, None)),
        Some(Err(err)) => Err(err.to_string()),
        None => Err(
            "answer the task's pause with a data part ({\"decisions\": [...]}, {\"answers\": \
             {...}}, {\"action\": \"cancel\"}) or a text part CONFIRM_ACTION:<action>"
                .to_owned(),
        ),
    }
}

/// The client's message, as the task's history keeps it.
fn user_message(message: &Message, task_id: Option<&str>, context_id: &str) -> Value {
    let parts: Vec<Value> = message
        .parts
        .iter()
        .map(|part| match (&part.text, &part.data) {
            (Some(text), _) => json!({"text": text}),
            (None, Some(data)) => json!({"data": data}),
            (None, None) => json!({"text": ""}),
        })
        .collect();
    let mut out = json!({
        "messageId": if message.message_id.is_empty() { uuid::Uuid::new_v4().to_string() } else { message.message_id.clone() },
        "contextId": context_id,
        "role": "ROLE_USER",
        "parts": parts,
    });
    if let Some(task_id) = task_id {
        out["taskId"] = Value::from(task_id);
    }
    out
}

/// `value` with every whole number written as an integer (`1.0` is `1`).
fn integral(value: Value) -> Value {
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() == 0.0 && f.abs() < 9.0e15 {
                Value::from(f as i64)
            } else {
                Value::Number(n)
            }
        }
        Value::Array(items) => Value::Array(items.into_iter().map(integral).collect()),
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, integral(v))).collect())
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_doubles_are_integers_and_the_rest_stay() {
        let given = serde_json::json!({"index": 1.0, "x": [2.0, 2.5, "3.0"], "y": {"z": -4.0}});
        assert_eq!(
            integral(given),
            serde_json::json!({"index": 1, "x": [2, 2.5, "3.0"], "y": {"z": -4}})
        );
    }
}
