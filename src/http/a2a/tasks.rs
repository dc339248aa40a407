//! The task methods: `GetTask`, `CancelTask` (a cancel through the one
//! decision path), `ListTasks` (the caller's, paged), `SubscribeToTask`,
//! and the push configs (`Create`/`Get`/`List`/`DeleteTaskPushNotificationConfig`).

use std::sync::Arc;

use serde_json::{json, Value};

use super::rpc::{Answer, Call};
use crate::http::error::ChatError;
use crate::protocol::a2a::{
    code, ListTasks, PushConfig, PushRef, TaskRef, Update, DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE,
    MAX_PUSH_CONFIGS,
};
use crate::protocol::{parse_reply, ReplyPayload};
use crate::run::a2a::A2aTask;

pub async fn get(call: Call<'_>, params: Value) -> Answer {
    let (task, history) = match looked_up(&call, params) {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    settle(&call, &task).await;
    call.ok(task.to_json(history, true))
}

/// The task a `TaskRef` names, and how much history it asks for.
fn looked_up(call: &Call<'_>, params: Value) -> Result<(Arc<A2aTask>, Option<usize>), Answer> {
    let wanted: TaskRef = call.params(params)?;
    let history = wanted.history_length.map(|n| n.max(0) as usize);
    Ok((call.task(&wanted.id)?, history))
}

/// A task whose run's stream is no longer followed (another client took
/// it over) takes its end from the run's kept outcome.
async fn settle(call: &Call<'_>, task: &A2aTask) {
    if task.followed() || task.state().is_terminal() {
        return;
    }
    if let Ok(Some(outcome)) = call.state.runs.kept().outcome(&task.key).await {
        if task.ended_by(&outcome) {
            task.apply(Update::of(&outcome.final_chunk, &task.id));
        }
    }
}

/// A cancel of the pause the task waits on (the run ends `cancelled`);
/// a task at work or ended cannot be cancelled.
pub async fn cancel(call: Call<'_>, params: Value) -> Answer {
    let (task, _) = match looked_up(&call, params) {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    let Some(pause) = task.pause().filter(|_| task.state().is_interrupted()) else {
        let why = match task.state().is_terminal() {
            true => "the task has ended",
            false => "the task is at work: it can be cancelled once it waits on a pause",
        };
        return call.fail(code::TASK_NOT_CANCELABLE, why, None);
    };
    let reply = parse_reply("CONFIRM_ACTION:cancel").and_then(Result::ok);
    let Some(reply) = reply else {
        return call.fail(code::INTERNAL, "cancel", None);
    };
    let cancelled = call
        .decide(&task, &pause, &reply, ReplyPayload::default())
        .await;
    if let Err(err) = cancelled {
        return call.refused(&ChatError::Reply(err));
    }
    super::rpc::settled(&task, Some(&pause)).await;
    call.ok(task.to_json(None, true))
}

/// The caller's tasks, most recently updated first, a page at a time
/// (`pageToken`: the last task of the page before).
pub fn list(call: Call<'_>, params: Value) -> Answer {
    let params = if params.is_null() { json!({}) } else { params };
    let wanted: ListTasks = match call.params(params) {
        Ok(wanted) => wanted,
        Err(answer) => return answer,
    };
    let size = match wanted.page_size {
        None => DEFAULT_PAGE_SIZE,
        Some(n) if (1..=MAX_PAGE_SIZE as i64).contains(&n) => n as usize,
        Some(n) => {
            let why = format!("pageSize {n}: 1 to {MAX_PAGE_SIZE}");
            return call.fail(code::INVALID_PARAMS, &why, Some("invalid_request"));
        }
    };
    let tasks = call.state.a2a.list(|task| {
        call.state.access.may_see(call.caller, task.key.owner)
            && wanted
                .context_id
                .as_deref()
                .is_none_or(|context| task.context_id() == context)
            && wanted.status.is_none_or(|state| task.state() == state)
    });
    let start = match wanted.page_token.as_deref().filter(|t| !t.is_empty()) {
        Some(token) => tasks
            .iter()
            .position(|t| t.id == token)
            .map_or(0, |at| at + 1),
        None => 0,
    };
    let page: Vec<&Arc<A2aTask>> = tasks.iter().skip(start).take(size).collect();
    let more = start + page.len() < tasks.len();
    let next = match (more, page.last()) {
        (true, Some(last)) => last.id.clone(),
        _ => String::new(),
    };
    let artifacts = wanted.include_artifacts.unwrap_or(false);
    let listed: Vec<Value> = page.iter().map(|t| t.to_json(Some(0), artifacts)).collect();
    call.ok(json!({
        "tasks": listed,
        "nextPageToken": next,
        "pageSize": size,
        "totalSize": tasks.len(),
    }))
}

pub async fn subscribe(call: Call<'_>, params: Value) -> Answer {
    let (task, _) = match looked_up(&call, params) {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    settle(&call, &task).await;
    if task.state().is_terminal() {
        return call.fail(code::UNSUPPORTED_OPERATION, "the task has ended", None);
    }
    call.stream(task)
}

pub fn push_create(call: Call<'_>, params: Value) -> Answer {
    let config: PushConfig = match call.params(params) {
        Ok(config) => config,
        Err(answer) => return answer,
    };
    let task = match call.task(&config.task_id) {
        Ok(task) => task,
        Err(answer) => return answer,
    };
    if let Err(answer) = super::rpc::checked_push(&call, &config) {
        return answer;
    }
    let replaces = task.push_configs().iter().any(|c| c.id == config.id);
    if task.push_count() >= MAX_PUSH_CONFIGS && !replaces {
        let why = format!("a task has at most {MAX_PUSH_CONFIGS} push configs");
        return call.fail(code::INVALID_PARAMS, &why, Some("invalid_request"));
    }
    let kept = call.state.a2a.add_push(&task, config);
    call.ok(json!(kept))
}

fn push_ref(call: &Call<'_>, params: Value) -> Result<(Arc<A2aTask>, String), Answer> {
    let wanted: PushRef = call.params(params)?;
    Ok((call.task(&wanted.task_id)?, wanted.id))
}

pub fn push_get(call: Call<'_>, params: Value) -> Answer {
    let (task, id) = match push_ref(&call, params) {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    match task.push_configs().into_iter().find(|c| c.id == id) {
        Some(config) => call.ok(json!(config)),
        None => call.fail(code::INVALID_PARAMS, &format!("no push config {id}"), None),
    }
}

pub fn push_list(call: Call<'_>, params: Value) -> Answer {
    let (task, _) = match push_ref(&call, params) {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    call.ok(json!({"configs": task.push_configs(), "nextPageToken": ""}))
}

pub fn push_delete(call: Call<'_>, params: Value) -> Answer {
    let (task, id) = match push_ref(&call, params) {
        Ok(found) => found,
        Err(answer) => return answer,
    };
    match task.remove_push(&id) {
        true => call.ok(json!({})),
        false => call.fail(code::INVALID_PARAMS, &format!("no push config {id}"), None),
    }
}
