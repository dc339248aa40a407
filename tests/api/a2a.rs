//! The A2A face (#45), over real sockets: JSON-RPC's own errors, tasks
//! that pause and are answered through the one decision path, refusals
//! with chatgate's `error_type`, paging, push config bounds, and one
//! winner across A2A, AG-UI and chat. (The A2A SDK's own client drives it
//! in tests/faces/test_a2a.py.)

use serde_json::{json, Value};

use crate::helpers::{one_chunk, spawn_app, TestApp};

async fn rpc(app: &TestApp, body: Value) -> (u16, Value) {
    let response = app
        .client
        .post(format!("{}/a2a", app.address))
        .header("A2A-Version", "1.0")
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn call(app: &TestApp, method: &str, params: Value) -> Value {
    let (status, body) = rpc(
        app,
        json!({"jsonrpc": "2.0", "id": 7, "method": method, "params": params}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["id"], 7, "{body}");
    body
}

fn text(text: &str) -> Value {
    json!({"message": {"messageId": "m", "role": "ROLE_USER", "parts": [{"text": text}]}})
}

fn to_task(task: &str, data: Value) -> Value {
    json!({"message": {"messageId": "m", "role": "ROLE_USER", "taskId": task,
                       "parts": [{"data": data}]}})
}

fn error_type(body: &Value) -> &str {
    body["error"]["data"][0]["metadata"]["error_type"]
        .as_str()
        .unwrap_or("")
}

/// A task that pauses on a 2-task plan: its JSON.
async fn paused(app: &TestApp) -> Value {
    let body = call(app, "SendMessage", text("create a report; email it")).await;
    let task = body["result"]["task"].clone();
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{body}"
    );
    task
}

fn card(task: &Value) -> Value {
    task["status"]["message"]["parts"][1]["data"].clone()
}

#[tokio::test]
async fn json_rpc_s_own_errors() {
    let app = spawn_app().await;
    let response = app
        .client
        .post(format!("{}/a2a", app.address))
        .header("content-type", "application/json")
        .body("{nope")
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32700);
    let (_, body) = rpc(
        &app,
        json!({"jsonrpc": "1.0", "id": 1, "method": "GetTask"}),
    )
    .await;
    assert_eq!(body["error"]["code"], -32600);
    let (_, body) = rpc(&app, json!({"jsonrpc": "2.0", "id": 1, "method": "Nope"})).await;
    assert_eq!(body["error"]["code"], -32601);
    let body = call(&app, "GetTask", json!({"id": "no-such-task"})).await;
    assert_eq!(body["error"]["code"], -32001);
    let body = call(&app, "SendMessage", json!({"message": 3})).await;
    assert_eq!(body["error"]["code"], -32602);
    let response = app
        .client
        .post(format!("{}/a2a", app.address))
        .header("A2A-Version", "0.3")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}))
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], -32009);
}

#[tokio::test]
async fn a_task_pauses_with_its_card_and_an_answer_completes_it() {
    let app = spawn_app().await;
    let task = paused(&app).await;
    let card = card(&task);
    assert_eq!(card["kind"], "approval");
    assert_eq!(card["tasks"].as_array().unwrap().len(), 2);
    assert!(card["tasks"][0]["response_schema"].is_object());
    // The session is the task's context: the inbox lists its pause.
    let (_, inbox) = app.get("/api/v1/interactions").await;
    let inbox: Value = serde_json::from_str(&inbox).unwrap();
    assert_eq!(inbox["interactions"][0]["session_id"], task["contextId"]);

    let id = task["id"].as_str().unwrap();
    let bad = call(
        &app,
        "SendMessage",
        to_task(
            id,
            json!({"decisions": [{"index": 9, "decision": "approve"}]}),
        ),
    )
    .await;
    assert_eq!(error_type(&bad), "invalid_decision", "{bad}");
    let answer = json!({"decisions": [{"index": 1.0, "decision": "approve"},
                                      {"index": 2, "decision": "reject", "reason": "no"}]});
    let body = call(&app, "SendMessage", to_task(id, answer)).await;
    let done = &body["result"]["task"];
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{body}");
    assert_eq!(done["artifacts"].as_array().unwrap().len(), 2);

    let again = call(
        &app,
        "SendMessage",
        to_task(id, json!({"action": "confirm"})),
    )
    .await;
    assert_eq!(again["error"]["code"], -32004);
    let fetched = call(&app, "GetTask", json!({"id": id, "historyLength": 1})).await;
    assert_eq!(fetched["result"]["status"]["state"], "TASK_STATE_COMPLETED");
    assert_eq!(fetched["result"]["history"].as_array().unwrap().len(), 1);
}

#[tokio::test]
async fn every_task_rejected_is_rejected_and_a_text_reply_works_too() {
    let app = spawn_app().await;
    let task = paused(&app).await;
    let id = task["id"].as_str().unwrap();
    let answer = json!({"action": "confirm", "decisions": [
        {"index": 1, "decision": "reject"}, {"index": 2, "decision": "reject"}]});
    let body = call(&app, "SendMessage", to_task(id, answer)).await;
    assert_eq!(
        body["result"]["task"]["status"]["state"], "TASK_STATE_REJECTED",
        "{body}"
    );

    let task = paused(&app).await;
    let id = task["id"].as_str().unwrap();
    let reply = json!({"message": {"messageId": "m", "role": "ROLE_USER", "taskId": id,
                                   "parts": [{"text": "CONFIRM_ACTION:cancel"}]}});
    let body = call(&app, "SendMessage", reply).await;
    assert_eq!(
        body["result"]["task"]["status"]["state"], "TASK_STATE_CANCELED",
        "{body}"
    );
    let body = call(&app, "CancelTask", json!({"id": id})).await;
    assert_eq!(body["error"]["code"], -32002);
}

#[tokio::test]
async fn one_pause_one_winner_across_a2a_agui_and_chat() {
    let app = spawn_app().await;
    let task = paused(&app).await;
    let cid = card(&task)["confirmation_id"].as_str().unwrap().to_owned();
    let session = task["contextId"].as_str().unwrap().to_owned();
    // Decided by an AG-UI resume first.
    let resume = json!({"threadId": session, "runId": "r", "messages": [],
        "resume": [{"interruptId": format!("{cid}-t1"), "status": "resolved", "payload": {"approved": true}}]});
    let response = app
        .client
        .post(format!("{}/api/v1/agui", app.address))
        .json(&resume)
        .send()
        .await
        .unwrap();
    let events = response.text().await.unwrap();
    assert!(events.contains("\"type\":\"RUN_STARTED\""), "{events}");
    // Task 1 is decided: A2A and chat lose it.
    let id = task["id"].as_str().unwrap();
    let body = call(
        &app,
        "SendMessage",
        to_task(
            id,
            json!({"decisions": [{"index": 1, "decision": "reject"}]}),
        ),
    )
    .await;
    assert_eq!(error_type(&body), "already_decided", "{body}");
    let chat = json!({"message": "CONFIRM_ACTION:decide", "session_id": session,
                      "confirmation_id": cid, "decisions": [{"index": 1, "decision": "reject"}]});
    let (status, chunk) = one_chunk(app.post_json(&chat).await).await;
    assert_eq!(status, 409);
    assert_eq!(chunk.metadata["error_type"], "already_decided");
    // Task 2 on A2A completes the run.
    let body = call(
        &app,
        "SendMessage",
        to_task(
            id,
            json!({"decisions": [{"index": 2, "decision": "approve"}]}),
        ),
    )
    .await;
    assert_eq!(
        body["result"]["task"]["status"]["state"], "TASK_STATE_COMPLETED",
        "{body}"
    );
}

#[tokio::test]
async fn tasks_are_listed_by_page_and_push_configs_are_bounded() {
    let app = spawn_app().await;
    for _ in 0..3 {
        paused(&app).await;
    }
    let first = call(&app, "ListTasks", json!({"pageSize": 2})).await;
    let page = &first["result"];
    assert_eq!(page["tasks"].as_array().unwrap().len(), 2, "{first}");
    assert_eq!(page["totalSize"], 3);
    assert!(page["tasks"][0].get("artifacts").is_none());
    let token = page["nextPageToken"].as_str().unwrap();
    assert!(!token.is_empty());
    let second = call(
        &app,
        "ListTasks",
        json!({"pageSize": 2, "pageToken": token}),
    )
    .await;
    assert_eq!(second["result"]["tasks"].as_array().unwrap().len(), 1);
    assert_eq!(second["result"]["nextPageToken"], "");
    let waiting = call(
        &app,
        "ListTasks",
        json!({"status": "TASK_STATE_INPUT_REQUIRED"}),
    )
    .await;
    assert_eq!(waiting["result"]["totalSize"], 3);
    let too_big = call(&app, "ListTasks", json!({"pageSize": 101})).await;
    assert_eq!(too_big["error"]["code"], -32602);

    let id = first["result"]["tasks"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let bad = call(
        &app,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "url": "file:///etc/passwd"}),
    )
    .await;
    assert_eq!(bad["error"]["code"], -32602);
    for n in 0..4 {
        let made = call(
            &app,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "url": format!("http://127.0.0.1:9/{n}"), "token": "t"}),
        )
        .await;
        assert!(made["result"]["id"].is_string(), "{made}");
    }
    let fifth = call(
        &app,
        "CreateTaskPushNotificationConfig",
        json!({"taskId": id, "url": "http://127.0.0.1:9/5"}),
    )
    .await;
    assert_eq!(fifth["error"]["code"], -32602);
    let listed = call(
        &app,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": id}),
    )
    .await;
    let configs = listed["result"]["configs"].as_array().unwrap().clone();
    assert_eq!(configs.len(), 4);
    let one = configs[0]["id"].as_str().unwrap();
    let got = call(
        &app,
        "GetTaskPushNotificationConfig",
        json!({"taskId": id, "id": one}),
    )
    .await;
    assert_eq!(got["result"]["url"], "http://127.0.0.1:9/0");
    let gone = call(
        &app,
        "DeleteTaskPushNotificationConfig",
        json!({"taskId": id, "id": one}),
    )
    .await;
    assert_eq!(gone["result"], json!({}));
    let again = call(
        &app,
        "GetTaskPushNotificationConfig",
        json!({"taskId": id, "id": one}),
    )
    .await;
    assert_eq!(again["error"]["code"], -32602);
}

#[tokio::test]
async fn the_agent_card_names_the_endpoint_the_tools_and_the_key_scheme() {
    let app = spawn_app().await;
    let (status, body) = app.get("/.well-known/agent-card.json").await;
    assert_eq!(status, 200);
    let card: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(card["supportedInterfaces"][0]["protocolBinding"], "JSONRPC");
    assert_eq!(card["supportedInterfaces"][0]["protocolVersion"], "1.0");
    assert_eq!(card["url"], card["supportedInterfaces"][0]["url"]);
    assert!(card["supportedInterfaces"][0]["url"]
        .as_str()
        .unwrap()
        .ends_with("/a2a"));
    assert_eq!(
        card["capabilities"],
        json!({"streaming": true, "pushNotifications": true})
    );
    assert_eq!(card["skills"][0]["id"], "chat");
    assert_eq!(
        card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"],
        "bearer"
    );
}

/// A task is found again by its id after a restart (a durable store):
/// its run waits on the same pause, an answer to the task decides it, and
/// a task id of a run the session no longer waits on is not found.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_outlives_a_restart_of_its_server() {
    use crate::durable::{start, terminate, Dir};
    async fn rpc_at(url: &str, method: &str, params: Value) -> Value {
        let body = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
        let response = reqwest::Client::new()
            .post(format!("{url}/a2a"))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        response.json().await.unwrap()
    }
    let dir = Dir::new();
    let mut first = start(&dir, &[]);
    let mut started = text("create a report; email it");
    started["message"]["contextId"] = json!("kept-ctx");
    let body = rpc_at(&first.url, "SendMessage", started.clone()).await;
    let task = body["result"]["task"].clone();
    assert_eq!(
        task["status"]["state"], "TASK_STATE_INPUT_REQUIRED",
        "{body}"
    );
    let id = task["id"].as_str().unwrap().to_owned();
    terminate(&mut first);

    let second = start(&dir, &[]);
    let found = rpc_at(&second.url, "GetTask", json!({"id": id})).await;
    let found = &found["result"];
    assert_eq!(found["id"], id.as_str(), "{found}");
    assert_eq!(found["contextId"], "kept-ctx");
    assert_eq!(found["status"]["state"], "TASK_STATE_INPUT_REQUIRED");
    assert_eq!(card(found), card(&task), "the same pause, the same card");
    let answer = to_task(&id, json!({"action": "confirm"}));
    let body = rpc_at(&second.url, "SendMessage", answer).await;
    let done = &body["result"]["task"];
    assert_eq!(done["status"]["state"], "TASK_STATE_COMPLETED", "{body}");
    assert_eq!(done["artifacts"].as_array().unwrap().len(), 2, "{body}");

    // Another task's id on the same session (a run the session no longer
    // waits on), and ids this server never wrote: not found.
    let mut other = id.clone();
    other.replace_range(0..8, "00000000");
    for wrong in [other.as_str(), "not-a-task", "x.-.a2VwdC1jdHg"] {
        let missing = rpc_at(&second.url, "GetTask", json!({"id": wrong})).await;
        assert_eq!(missing["error"]["code"], -32001, "{wrong}: {missing}");
    }
}

/// `--a2a-push-host`: a push config may name only the hosts listed, on
/// its own and with the first message; nothing is kept of one refused.
#[tokio::test]
async fn push_configs_name_only_the_hosts_the_operator_lists() {
    let app = crate::helpers::spawn_app_with(|settings| {
        settings.notify.a2a_push_hosts = vec!["hooks.example.com".into(), "*.agents.test".into()];
    })
    .await;
    let task = paused(&app).await;
    let id = task["id"].as_str().unwrap();
    for url in [
        "http://127.0.0.1:9/p",
        "http://169.254.169.254/latest",
        "https://agents.test/p",
        "https://hooks.example.com.evil.test/p",
    ] {
        let refused = call(
            &app,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "url": url}),
        )
        .await;
        assert_eq!(refused["error"]["code"], -32602, "{url}: {refused}");
        assert_eq!(error_type(&refused), "invalid_request");
    }
    for url in ["https://hooks.example.com/p", "http://a.agents.test:8080/p"] {
        let kept = call(
            &app,
            "CreateTaskPushNotificationConfig",
            json!({"taskId": id, "url": url}),
        )
        .await;
        assert_eq!(kept["result"]["url"], url, "{kept}");
    }
    let listed = call(
        &app,
        "ListTaskPushNotificationConfigs",
        json!({"taskId": id}),
    )
    .await;
    assert_eq!(listed["result"]["configs"].as_array().unwrap().len(), 2);
    // With the first message: refused, and no task is started.
    let mut first = text("create a report");
    first["configuration"] = json!({"taskPushNotificationConfig": {"url": "http://10.0.0.1/"}});
    let refused = call(&app, "SendMessage", first).await;
    assert_eq!(refused["error"]["code"], -32602, "{refused}");
    let all = call(&app, "ListTasks", json!({})).await;
    assert_eq!(all["result"]["totalSize"], 1, "{all}");
}
