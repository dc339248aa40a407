//! The AG-UI face (#45), over real sockets: a run ends at its pause with
//! one interrupt per task (or question), a `resume` decides through the
//! one decision path (scopes, quorum, self-approval, one winner across
//! faces) and the run goes on as the new AG-UI run; refusals are
//! `RUN_ERROR`s carrying chatgate's `error_type`.

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::approvers::KEYS;
use crate::four_eyes::{app as keyed_app, deploy};
use crate::helpers::{one_chunk, spawn_app, TestApp};
use crate::tools::{app_with_tools, Workdir};
use crate::webhooks::{hooked, Receiver};

const AGUI: &str = "/api/v1/agui";

/// POSTs `body` to the AG-UI endpoint (with `key` as the bearer): the
/// status and the events of the whole AG-UI run.
async fn agui(app: &TestApp, key: Option<&str>, body: &Value) -> (u16, Vec<Value>) {
    let mut request = app.client.post(format!("{}{AGUI}", app.address)).json(body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let content_type = response.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    let text = tokio::time::timeout(crate::helpers::WAIT, response.text())
        .await
        .expect("the AG-UI run ends")
        .unwrap();
    let events = text
        .lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .map(|data| serde_json::from_str(data).unwrap())
        .collect();
    (status, events)
}

fn input(thread: &str, run: &str, message: &str) -> Value {
    json!({
        "threadId": thread, "runId": run, "state": {}, "tools": [], "context": [],
        "forwardedProps": {},
        "messages": [
            {"id": "m0", "role": "assistant", "content": "hello"},
            {"id": "m1", "role": "user", "content": message},
        ],
    })
}

fn resume(thread: &str, run: &str, entries: Value) -> Value {
    json!({"threadId": thread, "runId": run, "messages": [], "resume": entries})
}

fn types(events: &[Value]) -> Vec<&str> {
    events.iter().map(|e| e["type"].as_str().unwrap()).collect()
}

/// The interrupts of the AG-UI run's `RUN_FINISHED`.
fn interrupts(events: &[Value]) -> Vec<Value> {
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED", "{events:?}");
    assert_eq!(last["outcome"]["type"], "interrupt", "{last}");
    last["outcome"]["interrupts"].as_array().unwrap().clone()
}

fn ids(interrupts: &[Value]) -> Vec<String> {
    interrupts
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect()
}

fn run_error(events: &[Value]) -> &str {
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_ERROR", "{events:?}");
    last["code"].as_str().unwrap()
}

#[tokio::test]
async fn a_pause_ends_the_agui_run_with_one_interrupt_per_task() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (status, events) = agui(&app, None, &input("ag-1", "r1", "note one; email it")).await;
    assert_eq!(status, 200);
    assert_eq!(
        events[0],
        json!({"type": "RUN_STARTED", "threadId": "ag-1", "runId": "r1"})
    );
    let interrupts = interrupts(&events);
    assert_eq!(interrupts.len(), 2);

    // The inbox lists the same pause: its tasks' ids are the interrupts'.
    let (_, inbox) = app.get("/api/v1/interactions").await;
    let inbox: Value = serde_json::from_str(&inbox).unwrap();
    let card = &inbox["interactions"][0]["confirmation_data"];
    let cid = card["confirmation_id"].as_str().unwrap();
    for (interrupt, task) in interrupts.iter().zip(card["tasks"].as_array().unwrap()) {
        assert_eq!(interrupt["id"], task["task_id"]);
        assert_eq!(interrupt["toolCallId"], task["task_id"]);
        assert_eq!(interrupt["reason"], "tool_approval");
        assert_eq!(interrupt["responseSchema"], task["response_schema"]);
        assert_eq!(interrupt["expiresAt"], task["expires_at"]);
        assert_eq!(interrupt["metadata"]["confirmation_id"], cid);
        assert_eq!(interrupt["metadata"]["tool"], task["tool"]);
        assert_eq!(interrupt["metadata"]["args"], task["args"]);
        assert_eq!(interrupt["metadata"]["risk_level"], task["risk_level"]);
        assert!(interrupt["message"]
            .as_str()
            .unwrap()
            .contains(task["tool"].as_str().unwrap()));
    }
    // Each proposed call was announced before the interrupt.
    assert_eq!(
        types(&events),
        [
            "RUN_STARTED",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "TOOL_CALL_START",
            "TOOL_CALL_ARGS",
            "TOOL_CALL_END",
            "RUN_FINISHED"
        ]
    );
    assert_eq!(events[1]["toolCallName"], "note");
    assert_eq!(events[2]["delta"], json!({"step": "note one"}).to_string());
    assert!(dir.notes().is_empty(), "nothing ran before a yes");
}

#[tokio::test]
async fn a_resume_decides_the_pause_and_the_run_goes_on_as_the_new_agui_run() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (_, events) = agui(&app, None, &input("ag-2", "r1", "note one; note two")).await;
    let open = ids(&interrupts(&events));

    let entries = json!([
        {"interruptId": open[0], "status": "resolved", "payload": {"decision": "approve"}},
        {"interruptId": open[1], "status": "resolved",
         "payload": {"approved": true, "editedArgs": {"step": "note 2, edited"}}},
    ]);
    let (status, events) = agui(&app, None, &resume("ag-2", "r2", entries)).await;
    assert_eq!(status, 200);
    assert_eq!(events[0]["runId"], "r2");
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED", "{events:?}");
    assert_eq!(last["outcome"], json!({"type": "success"}));
    assert_eq!(last["result"]["tasks_completed"], 2);
    // The resumed run sends the results against the interrupts' tool
    // calls, without announcing them again.
    let results: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "TOOL_CALL_RESULT")
        .collect();
    assert_eq!(results.len(), 2, "{events:?}");
    assert_eq!(results[0]["toolCallId"], open[0].as_str());
    assert_eq!(results[1]["toolCallId"], open[1].as_str());
    assert!(!types(&events).contains(&"TOOL_CALL_START"), "{events:?}");
    assert!(types(&events).contains(&"STEP_STARTED"));
    assert_eq!(dir.notes(), ["note one", "note 2, edited"]);

    // Decided through the one path: audited with via and who.
    let decided = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "decided")
        .unwrap();
    assert_eq!(decided["action"], "confirm");
}

#[tokio::test]
async fn a_partial_resume_ends_again_with_what_is_still_open() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (_, events) = agui(&app, None, &input("ag-3", "r1", "note a; note b; note c")).await;
    let open = ids(&interrupts(&events));

    let first = json!([{"interruptId": open[1], "status": "cancelled"}]);
    let (_, events) = agui(&app, None, &resume("ag-3", "r2", first)).await;
    assert_eq!(
        types(&events),
        ["RUN_STARTED", "RUN_FINISHED"],
        "{events:?}"
    );
    assert_eq!(
        ids(&interrupts(&events)),
        [open[0].clone(), open[2].clone()]
    );

    // The rejected task is decided: naming it again is already decided.
    let again = json!([{"interruptId": open[1], "status": "resolved",
                        "payload": {"approved": true}}]);
    let (status, events) = agui(&app, None, &resume("ag-3", "r3", again)).await;
    assert_eq!(status, 200);
    assert_eq!(run_error(&events), "already_decided");

    let rest = json!([
        {"interruptId": open[0], "status": "resolved", "payload": {"approved": true}},
        {"interruptId": open[2], "status": "resolved", "payload": {"approved": false, "reason": "no"}},
    ]);
    let (_, events) = agui(&app, None, &resume("ag-3", "r4", rest)).await;
    let last = events.last().unwrap();
    assert_eq!(last["outcome"]["type"], "success", "{events:?}");
    assert_eq!(dir.notes(), ["note a"]);
    assert_eq!(last["result"]["tasks_rejected"], 2);
}

#[tokio::test]
async fn every_interrupt_cancelled_cancels_the_run() {
    let app = spawn_app().await;
    let (_, events) = agui(
        &app,
        None,
        &input("ag-4", "r1", "create a report; email it"),
    )
    .await;
    let entries: Vec<Value> = ids(&interrupts(&events))
        .into_iter()
        .map(|id| json!({"interruptId": id, "status": "cancelled"}))
        .collect();
    let (_, events) = agui(&app, None, &resume("ag-4", "r2", json!(entries))).await;
    let last = events.last().unwrap();
    assert_eq!(last["type"], "RUN_FINISHED", "{events:?}");
    assert_eq!(last["outcome"], json!({"type": "cancelled"}));
    assert_eq!(last["metadata"]["reason"], "user");
}

#[tokio::test]
async fn questions_are_interrupts_and_their_answers_the_payloads() {
    let app = spawn_app().await;
    let message = "ask region: which region? eu-west | us-east; deploy to {region}";
    let (_, events) = agui(&app, None, &input("ag-5", "r1", message)).await;
    let asked = interrupts(&events);
    assert_eq!(asked.len(), 1);
    let question = &asked[0];
    assert_eq!(question["reason"], "question");
    assert_eq!(question["message"], "which region?");
    assert_eq!(question["metadata"]["question_id"], "region");
    assert!(question["id"].as_str().unwrap().ends_with("-q-region"));

    let answer =
        json!([{"interruptId": question["id"], "status": "resolved", "payload": "eu-west"}]);
    let (_, events) = agui(&app, None, &resume("ag-5", "r2", answer)).await;
    // The answer goes on to the plan, which pauses for its approval.
    let plan = interrupts(&events);
    assert_eq!(plan.len(), 1, "{events:?}");
    assert_eq!(plan[0]["reason"], "tool_approval");
    assert_eq!(plan[0]["metadata"]["args"]["step"], "deploy to eu-west");

    let approve = json!([{"interruptId": plan[0]["id"], "status": "resolved",
                          "payload": {"decision": "approve"}}]);
    let (_, events) = agui(&app, None, &resume("ag-5", "r3", approve)).await;
    assert_eq!(
        events.last().unwrap()["outcome"]["type"],
        "success",
        "{events:?}"
    );
}

#[tokio::test]
async fn a_pause_has_one_winner_whichever_face_decides_it() {
    let app = spawn_app().await;
    // Opened on AG-UI, decided by a chat reply: the AG-UI resume loses.
    let (_, events) = agui(&app, None, &input("ag-6", "r1", "create a report")).await;
    let open = ids(&interrupts(&events));
    let (status, chunk) = app.reply("ag-6", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    let approve =
        json!([{"interruptId": open[0], "status": "resolved", "payload": {"approved": true}}]);
    let (status, events) = agui(&app, None, &resume("ag-6", "r2", approve)).await;
    assert_eq!(status, 200);
    assert_eq!(run_error(&events), "already_decided");

    // Opened on chat, decided on AG-UI: the chat stream goes on, and the
    // chat reply loses with 409.
    let (mut stream, request) = app.open_paused("ag-7", "create a report").await;
    let task_id = request.approval().unwrap().tasks[0]
        .task_id
        .clone()
        .unwrap();
    let approve =
        json!([{"interruptId": task_id, "status": "resolved", "payload": {"approved": true}}]);
    let (_, events) = agui(&app, None, &resume("ag-7", "r1", approve)).await;
    let last = events.last().unwrap();
    assert_eq!(last["outcome"]["type"], "success", "{events:?}");
    assert_eq!(last["result"]["decided"], true);
    let cid = request.approval().unwrap().confirmation_id.clone();
    let late = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "ag-7",
                      "confirmation_id": cid});
    let (status, chunk) = one_chunk(app.post_json(&late).await).await;
    assert_eq!(status, 409);
    assert_eq!(chunk.metadata["error_type"], "already_decided");
    let end = stream.finish().await;
    assert_eq!(end.chunk_type, ChunkType::Completion, "{}", end.chunk);
}

#[tokio::test]
async fn a_stale_or_unknown_interrupt_is_a_run_error_and_decides_nothing() {
    let app = spawn_app().await;
    let (_, events) = agui(&app, None, &input("ag-8", "r1", "create a report")).await;
    let old = ids(&interrupts(&events));
    // A chat message supersedes that run; its new pause is another.
    let (mut stream, _) = app.open_paused("ag-8", "email it").await;
    let stale =
        json!([{"interruptId": old[0], "status": "resolved", "payload": {"approved": true}}]);
    let (_, events) = agui(&app, None, &resume("ag-8", "r2", stale)).await;
    assert_eq!(run_error(&events), "stale_confirmation");

    let (_, inbox) = app.get("/api/v1/interactions").await;
    let inbox: Value = serde_json::from_str(&inbox).unwrap();
    let cid = inbox["interactions"][0]["confirmation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let unknown = json!([{"interruptId": format!("{cid}-t9"), "status": "resolved",
                          "payload": {"approved": true}}]);
    let (_, events) = agui(&app, None, &resume("ag-8", "r3", unknown)).await;
    assert_eq!(run_error(&events), "invalid_decision");
    let bad = json!([{"interruptId": format!("{cid}-t1"), "status": "resolved",
                      "payload": {"decision": "maybe"}}]);
    let (_, events) = agui(&app, None, &resume("ag-8", "r4", bad)).await;
    assert_eq!(run_error(&events), "invalid_decision");
    let nothing = json!([{"interruptId": format!("{cid}-t1"), "status": "resolved"}]);
    let (_, events) = agui(&app, None, &resume("ag-8", "r5", nothing)).await;
    assert_eq!(run_error(&events), "invalid_decision");

    // A new message while the thread's interrupts are open is refused.
    let (_, events) = agui(&app, None, &input("ag-8", "r6", "something else")).await;
    assert_eq!(run_error(&events), "session_busy");

    // Nothing of that was taken: the pause still decides.
    let (status, _) = app.reply("ag-8", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);

    // A thread with nothing pending.
    let none = json!([{"interruptId": format!("{cid}-t1"), "status": "cancelled"}]);
    let (_, events) = agui(&app, None, &resume("ag-none", "r1", none)).await;
    assert_eq!(run_error(&events), "no_pending_confirmation");
}

#[tokio::test]
async fn who_may_decide_holds_on_agui_quorum_and_self_approval_included() {
    let dir = Workdir::new();
    let app = keyed_app(&dir, &deploy(&dir, KEYS)).await;
    let requester = Some("agent-key-000001");
    let (status, events) = agui(&app, None, &input("ag-9", "r1", "deploy web")).await;
    assert_eq!(status, 401);
    assert_eq!(run_error(&events), "unauthorized");

    let (_, events) = agui(&app, requester, &input("ag-9", "r1", "deploy web")).await;
    let open = ids(&interrupts(&events));
    let approve =
        json!([{"interruptId": open[0], "status": "resolved", "payload": {"approved": true}}]);
    let (_, events) = agui(&app, requester, &resume("ag-9", "r2", approve.clone())).await;
    assert_eq!(run_error(&events), "self_approval");
    // Out of scope: a key that may approve low risks only.
    let (_, events) = agui(
        &app,
        Some("low-key-0000003"),
        &resume("x", "r3", approve.clone()),
    )
    .await;
    assert_eq!(run_error(&events), "forbidden_scope");

    // One approval of two: the run ends again with the interrupt open.
    let (_, events) = agui(
        &app,
        Some("lead-key-000001"),
        &resume("x", "r4", approve.clone()),
    )
    .await;
    let still = interrupts(&events);
    assert_eq!(ids(&still), open);
    assert_eq!(still[0]["metadata"]["required"], 2);
    assert!(dir.notes().is_empty(), "nothing ran on one approval");
    let (_, events) = agui(
        &app,
        Some("lead-key-000001"),
        &resume("x", "r5", approve.clone()),
    )
    .await;
    assert_eq!(run_error(&events), "already_approved");

    let (_, events) = agui(&app, Some("lead-key-000002"), &resume("x", "r6", approve)).await;
    assert_eq!(
        events.last().unwrap()["outcome"]["type"],
        "success",
        "{events:?}"
    );
    assert_eq!(dir.notes(), ["deploy web"]);
    let decided = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "decided")
        .unwrap();
    assert_eq!(decided["key"], "lead-2");
}

#[tokio::test]
async fn bad_requests_are_refused_with_the_chat_endpoint_s_status_and_a_run_error() {
    let app = spawn_app().await;
    let url = format!("{}{AGUI}", app.address);
    let raw = |body: String| {
        app.client
            .post(&url)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };

    let response = raw("{not json".to_owned()).await.unwrap();
    assert_eq!(response.status(), 400);
    let text = response.text().await.unwrap();
    assert!(text.contains("\"code\":\"invalid_request\""), "{text}");

    let (status, events) = agui(
        &app,
        None,
        &json!({"threadId": "t", "runId": "r", "messages": []}),
    )
    .await;
    assert_eq!((status, run_error(&events)), (400, "invalid_request"));
    let (status, events) = agui(&app, None, &input("", "r", "hi")).await;
    assert_eq!((status, run_error(&events)), (400, "invalid_request"));
    let (status, events) = agui(&app, None, &input("t", "r", "CONFIRM_ACTION:confirm")).await;
    assert_eq!((status, run_error(&events)), (400, "invalid_request"));
    let (status, events) = agui(&app, None, &input("t", "r", &"x".repeat(33 * 1024))).await;
    assert_eq!((status, run_error(&events)), (400, "invalid_request"));
    let many: Vec<Value> = (0..65)
        .map(|i| json!({"interruptId": format!("i{i}"), "status": "cancelled"}))
        .collect();
    let (status, events) = agui(&app, None, &resume("t", "r", json!(many))).await;
    assert_eq!((status, run_error(&events)), (400, "invalid_request"));

    // The body's bound: a long history is fine, past 1 MiB is 413.
    let history: Vec<Value> = (0..100)
        .map(|i| json!({"id": format!("h{i}"), "role": "assistant", "content": "y".repeat(9000)}))
        .collect();
    let mut long = input("t-long", "r", "create a report");
    long["messages"]
        .as_array_mut()
        .unwrap()
        .splice(0..0, history.clone());
    let (status, events) = agui(&app, None, &long).await;
    assert_eq!(status, 200);
    assert_eq!(interrupts(&events).len(), 1);
    let mut too_long = input("t", "r", "hi");
    too_long["messages"]
        .as_array_mut()
        .unwrap()
        .splice(0..0, history.iter().cloned().cycle().take(120));
    let (status, events) = agui(&app, None, &too_long).await;
    assert_eq!((status, run_error(&events)), (413, "payload_too_large"));

    let response = app.client.get(&url).send().await.unwrap();
    assert_eq!(response.status(), 405);
}

#[tokio::test]
async fn the_capabilities_say_interrupts_approvals_and_edits() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (status, body) = app.get("/api/v1/agui/capabilities").await;
    assert_eq!(status, 200);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        body["humanInTheLoop"],
        json!({"supported": true, "approvals": true, "interventions": false,
               "interrupts": true, "approveWithEdits": true})
    );
    assert_eq!(body["tools"]["items"][0]["name"], "note");
    assert_eq!(body["transport"]["streaming"], true);
    // The chat reply of a pause AG-UI opened works as ever: one chunk.
    let (_, events) = agui(&app, None, &input("cap", "r1", "note x")).await;
    assert_eq!(interrupts(&events).len(), 1);
    let (status, chunk) = one_chunk(app.chat("cap", "CONFIRM_ACTION:cancel").await).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_says_the_decision_came_through_agui() {
    let receiver = Receiver::start().await;
    let app = crate::helpers::spawn_app_with(hooked(&receiver)).await;
    let (_, events) = agui(&app, None, &input("hook-1", "r1", "create a report")).await;
    let open = ids(&interrupts(&events));
    let approve =
        json!([{"interruptId": open[0], "status": "resolved", "payload": {"approved": true}}]);
    let (_, events) = agui(&app, None, &resume("hook-1", "r2", approve)).await;
    assert_eq!(
        events.last().unwrap()["outcome"]["type"],
        "success",
        "{events:?}"
    );
    let seen = receiver.wait_for(3).await;
    let decided = seen
        .iter()
        .find(|d| d.event == "interaction.decided")
        .unwrap();
    assert_eq!(decided.body["data"]["via"], "agui");
    assert_eq!(decided.body["data"]["action"], "confirm");
    assert_eq!(decided.body["session_id"], "hook-1");
}
