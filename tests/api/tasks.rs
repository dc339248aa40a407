//! Each task of an approval pause a decision of its own (#42), over real
//! sockets: its `task_id`, `state`, `expires_at` and `response_schema` on
//! the card, and a reply naming a task by its `task_id`.

use std::collections::HashSet;

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::helpers::{error_type, one_chunk};
use crate::tools::{app_with_tools, confirm_with, outputs, Workdir};

/// The tasks of a `confirmation_request`, as sent.
fn tasks_of(request: &chatgate::protocol::Chunk) -> (Value, Vec<Value>) {
    let data = serde_json::to_value(request.confirmation_data.as_ref().unwrap()).unwrap();
    let tasks = data["tasks"].as_array().unwrap().clone();
    (data, tasks)
}

#[tokio::test]
async fn every_task_has_an_id_a_state_an_expiry_and_the_schema_of_its_decision() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut first, request) = app
        .open_paused("ids-1", "note one; just say it; note three")
        .await;
    let (data, tasks) = tasks_of(&request);
    let (_, second) = app.open_paused("ids-2", "note one").await;
    let (_, other) = tasks_of(&second);

    let ids: HashSet<&str> = tasks
        .iter()
        .chain(&other)
        .map(|task| task["task_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 4, "unique across pauses: {ids:?}");
    for task in &tasks {
        assert_eq!(task["state"], "pending", "{task}");
        assert_eq!(task["expires_at"], data["expires_at"], "{task}");
        assert!(task.get("required").is_none(), "one approval: {task}");
        let schema = &task["response_schema"];
        assert!(jsonschema::meta::is_valid(schema), "{schema}");
    }

    let fits = |task: &Value, decision: Value| {
        jsonschema::validator_for(&task["response_schema"])
            .unwrap()
            .is_valid(&decision)
    };
    let (note, said) = (&tasks[0], &tasks[1]);
    let id = note["task_id"].clone();
    assert!(fits(note, json!({"index": 1, "decision": "approve"})));
    assert!(fits(
        note,
        json!({"task_id": id, "decision": "reject", "reason": "no"})
    ));
    assert!(fits(
        note,
        json!({"index": 1, "decision": "edit", "args": {"step": "other"}})
    ));
    assert!(fits(
        note,
        json!({"index": 1, "decision": "respond", "result": "done"})
    ));
    // The tool's own input schema is the edit's: a step over 60 characters
    // does not fit; nor another task's index, nor an unknown decision.
    assert!(!fits(
        note,
        json!({"index": 1, "decision": "edit", "args": {"step": "x".repeat(61)}})
    ));
    assert!(!fits(note, json!({"index": 1, "decision": "edit"})));
    assert!(!fits(note, json!({"index": 2, "decision": "approve"})));
    assert!(!fits(note, json!({"index": 1, "decision": "maybe"})));
    assert!(!fits(
        note,
        json!({"index": 1, "decision": "approve", "extra": 1})
    ));
    // A step that calls no tool takes no edit.
    assert!(fits(said, json!({"index": 2, "decision": "approve"})));
    assert!(!fits(
        said,
        json!({"index": 2, "decision": "edit", "args": {"step": "x"}})
    ));

    let (ok, _) = app.reply("ids-1", "CONFIRM_ACTION:confirm").await;
    assert_eq!(ok, 200);
    assert_eq!(first.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn a_reply_names_a_task_by_its_task_id_and_a_bad_name_keeps_nothing() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, request) = app.open_paused("by-id", "note a; note b; note c").await;
    let (_, tasks) = tasks_of(&request);
    let id = |n: usize| tasks[n]["task_id"].as_str().unwrap().to_owned();

    let bad = [
        json!([{"task_id": "no-such-task", "decision": "reject"}]),
        json!([{"task_id": id(1), "index": 1, "decision": "reject"}]),
        json!([{"decision": "reject"}]),
        json!([{"task_id": id(0), "decision": "reject"}, {"index": 1, "decision": "approve"}]),
    ];
    for decisions in bad {
        let (status, chunk) = one_chunk(confirm_with(&app, "by-id", decisions.clone()).await).await;
        assert_eq!(
            (status.as_u16(), error_type(&chunk)),
            (422, "invalid_decision"),
            "{decisions}"
        );
    }
    assert!(dir.notes().is_empty(), "nothing of a refused reply is kept");

    let decisions = json!([
        {"task_id": id(1), "decision": "reject", "reason": "not b"},
        {"task_id": id(2), "index": 3, "decision": "edit", "args": {"step": "note c2"}},
    ]);
    let (status, ack) = one_chunk(confirm_with(&app, "by-id", decisions).await).await;
    assert_eq!(status, 200);
    assert_eq!(ack.chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note a", "note c2"]);
    let outputs = outputs(&stream);
    assert_eq!(outputs[1].metadata["skipped"], true);
    assert!(outputs[1].metadata["error"]
        .as_str()
        .unwrap()
        .contains("not b"));
}

/// POSTs a `decide` with `decisions`.
async fn decide(
    app: &crate::helpers::TestApp,
    session: &str,
    decisions: Value,
) -> reqwest::Response {
    app.post_json(&json!({
        "message": "CONFIRM_ACTION:decide",
        "session_id": session,
        "decisions": decisions,
    }))
    .await
}

/// The decision per task of a `confirmation_received`.
fn verdicts(received: &chatgate::protocol::Chunk) -> Vec<String> {
    let decisions = received.metadata["decisions"].as_array().unwrap();
    decisions
        .iter()
        .map(|d| d["decision"].as_str().unwrap().to_owned())
        .collect()
}

/// The state of each task of the one pause the inbox lists.
async fn states(app: &crate::helpers::TestApp) -> Vec<String> {
    let tasks = listed_tasks(app).await;
    tasks
        .iter()
        .map(|t| t["state"].as_str().unwrap().to_owned())
        .collect()
}

/// The tasks of the one pause the inbox lists (no API keys).
pub(crate) async fn listed_tasks(app: &crate::helpers::TestApp) -> Vec<Value> {
    let url = format!("{}/api/v1/interactions", app.address);
    let body: Value = app
        .client
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let items = body["interactions"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{body}");
    items[0]["confirmation_data"]["tasks"]
        .as_array()
        .unwrap()
        .clone()
}

#[tokio::test]
async fn a_decide_decides_only_the_tasks_it_names_and_the_rest_stay_pending() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, request) = app.open_paused("part", "note a; note b; note c").await;
    let id = crate::helpers::confirmation_id(&request);

    let decisions = json!([{"index": 2, "decision": "reject", "reason": "not b"}]);
    let (status, ack) = one_chunk(decide(&app, "part", decisions).await).await;
    assert_eq!(status, 200, "{ack:?}");
    assert_eq!(ack.chunk_type, ChunkType::DecisionRecorded);
    assert!(ack.finished);
    assert_eq!(ack.metadata["confirmation_id"], id.as_str());
    assert_eq!(ack.metadata["decisions"][0]["index"], 2);
    assert_eq!(ack.metadata["decisions"][0]["decision"], "reject");
    assert_eq!(ack.metadata["pending"], json!([1, 3]));
    let shown = stream.until(ChunkType::DecisionRecorded).await;
    assert!(!shown.finished, "the paused stream goes on");
    assert_eq!(shown.metadata["pending"], json!([1, 3]));
    assert_eq!(states(&app).await, ["pending", "rejected", "pending"]);
    assert!(
        dir.notes().is_empty(),
        "nothing runs before the pause is decided"
    );

    // Task 2 is decided: deciding it again is 409, and takes nothing of
    // that reply (task 1 stays pending too).
    let again = json!([{"index": 1, "decision": "approve"}, {"index": 2, "decision": "approve"}]);
    let (status, chunk) = one_chunk(decide(&app, "part", again).await).await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (409, "already_decided")
    );
    let bad = json!([{"index": 3, "decision": "edit", "args": {"step": 5}}]);
    let (status, chunk) = one_chunk(decide(&app, "part", bad).await).await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (422, "invalid_decision")
    );
    let (status, chunk) = one_chunk(decide(&app, "part", json!([])).await).await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (422, "invalid_decision")
    );
    assert_eq!(states(&app).await, ["pending", "rejected", "pending"]);

    // A confirm decides what is still pending (approved), task 2 as decided.
    let (status, received) = app.reply("part", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    assert_eq!(received.chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(verdicts(&received), ["approve", "reject", "approve"]);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note a", "note c"]);
    app.registry_drains().await;
    let audit = dir.audit();
    let decided_task = audit.iter().position(|r| r["event"] == "decided_task");
    let executed = audit.iter().position(|r| r["event"] == "executed");
    let at = decided_task.expect("a decided_task record");
    assert_eq!(audit[at]["index"], 2);
    assert_eq!(audit[at]["decision"], "reject");
    assert!(at < executed.unwrap(), "recorded before anything ran");
}

#[tokio::test]
async fn deciding_the_last_pending_task_confirms_the_plan() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, request) = app.open_paused("each", "note a; note b").await;
    let (_, tasks) = tasks_of(&request);

    let first =
        json!([{"task_id": tasks[1]["task_id"], "decision": "edit", "args": {"step": "note b2"}}]);
    let (status, ack) = one_chunk(decide(&app, "each", first).await).await;
    assert_eq!(
        (status.as_u16(), ack.chunk_type),
        (200, ChunkType::DecisionRecorded)
    );
    assert_eq!(ack.metadata["pending"], json!([1]));

    let last = json!([{"index": 1, "decision": "approve"}]);
    let (status, ack) = one_chunk(decide(&app, "each", last).await).await;
    assert_eq!(status, 200);
    assert_eq!(ack.chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(ack.metadata["action"], "confirm");
    assert_eq!(ack.metadata["decisions"][1]["decision"], "edit");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note a", "note b2"]);
    let outputs = outputs(&stream);
    assert_eq!(outputs.len(), 2);
}

#[tokio::test]
async fn a_cancel_after_a_decide_of_a_later_task_runs_nothing() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, _) = app.open_paused("gone", "note a; note b").await;
    let (status, _) =
        one_chunk(decide(&app, "gone", json!([{"index": 2, "decision": "approve"}])).await).await;
    assert_eq!(status, 200);
    let (status, _) = app.reply("gone", "CONFIRM_ACTION:cancel").await;
    assert_eq!(status, 200);
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert!(dir.notes().is_empty(), "task 1 was never decided");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_decided_on_its_own_survives_a_restart() {
    use crate::durable::{
        chunks, open_paused, post, read_raw, reply, start, stream_url, terminate, Dir,
    };

    let dir = Dir::new();
    let mut first = start(&dir, &[]);
    let url = stream_url(&first);
    let reading = open_paused(
        &url,
        json!({"message": "one; two; three", "session_id": "kept"}),
    )
    .await;
    let body = json!({"message": "CONFIRM_ACTION:decide", "session_id": "kept",
                      "decisions": [{"index": 2, "decision": "reject", "reason": "no"}]});
    let response = post(&url, body, None).await;
    assert_eq!(response.status(), 200);
    let ack = chunks(&read_raw(response, None).await).remove(0);
    assert_eq!(ack.chunk_type, ChunkType::DecisionRecorded);
    terminate(&mut first);
    drop(reading);

    let second = start(&dir, &[]);
    let url = stream_url(&second);
    // Task 2 is decided for good: deciding it again is refused, and a
    // confirm approves what is left.
    let again = json!({"message": "CONFIRM_ACTION:decide", "session_id": "kept",
                       "decisions": [{"index": 2, "decision": "approve"}]});
    // Restored a moment after the start: 503 until then.
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    let status = loop {
        let status = post(&url, again.clone(), None).await.status().as_u16();
        if status != 503 || tokio::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(status, 409);
    let (status, received) = reply(&url, "kept", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200, "{received:?}");
    assert_eq!(verdicts(&received), ["approve", "reject", "approve"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decide_is_announced_with_its_tasks_and_what_is_pending() {
    use crate::webhooks::{hooked, Receiver};

    let receiver = Receiver::start().await;
    let app = crate::helpers::spawn_app_with(hooked(&receiver)).await;
    let (mut stream, _) = app.open_paused("hooked", "one; two; three").await;
    receiver.wait_for(1).await;
    let decisions = json!([{"index": 3, "decision": "reject", "reason": "later"}]);
    let (status, _) = one_chunk(decide(&app, "hooked", decisions).await).await;
    assert_eq!(status, 200);
    let seen = receiver.wait_for(2).await;
    let progress = seen
        .iter()
        .find(|d| d.event == "interaction.progress")
        .expect("interaction.progress");
    assert!(progress.signed);
    let data = &progress.body["data"];
    assert_eq!(
        data["decisions"],
        json!([{"index": 3, "decision": "reject", "reason": "later"}])
    );
    assert_eq!(data["decided_by"], "anonymous");
    assert_eq!(data["pending"], json!([1, 2]));
    assert_eq!(data["via"], "chat");
    let (status, _) = app.reply("hooked", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

/// `ship` is high risk; `note` (the workdir's) low.
const SHIP: &str = r#"
[[tool]]
name = "ship"
description = "Ship it"
risk = "high"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

#[tokio::test]
async fn an_approver_decides_the_tasks_in_its_scope_and_is_refused_the_others() {
    use crate::approvers::{decide as reply_as, error_type as error_of, paused, KEYS};

    let dir = Workdir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    let app = app_with_tools(&dir, SHIP, move |s| s.server.api_keys_file = Some(keys)).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "scope", "note a; ship b").await;
    let decide_body =
        |decisions: Value| json!({"message": "CONFIRM_ACTION:decide", "decisions": decisions});
    let junior = "low-key-0000003";

    // junior (max_risk low) may decide the low-risk note, not the ship:
    // a reply naming both is refused whole.
    let both = decide_body(
        json!([{"index": 1, "decision": "approve"}, {"index": 2, "decision": "reject"}]),
    );
    let (status, chunk) = reply_as(&app, junior, "scope", &id, both).await;
    assert_eq!((status, error_of(&chunk)), (403, "forbidden_scope"));
    let high = decide_body(json!([{"index": 2, "decision": "approve"}]));
    let (status, chunk) = reply_as(&app, junior, "scope", &id, high).await;
    assert_eq!((status, error_of(&chunk)), (403, "forbidden_scope"));
    let low = decide_body(json!([{"index": 1, "decision": "approve"}]));
    let (status, chunk) = reply_as(&app, junior, "scope", &id, low).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::DecisionRecorded)
    );
    // A confirm decides what is left, the ship: not junior's either.
    let confirm = json!({"message": "CONFIRM_ACTION:confirm"});
    let (status, chunk) = reply_as(&app, junior, "scope", &id, confirm.clone()).await;
    assert_eq!((status, error_of(&chunk)), (403, "forbidden_scope"));
    // The note, decided, ran at once (the first task); the run waits for
    // the ship.
    let waiting = crate::as_decided::waiting(&mut stream).await;
    assert_eq!(waiting.metadata["pending"], json!([2]));
    assert_eq!(dir.notes(), ["note a"]);

    let (status, chunk) = reply_as(&app, "lead-key-000001", "scope", &id, confirm).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    assert_eq!(verdicts(&chunk), ["approve", "approve"]);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note a"]);
}

#[tokio::test]
async fn the_inbox_lists_a_pause_to_an_approver_who_may_decide_one_of_its_tasks_and_says_which() {
    use crate::approvers::{decide as reply_as, inbox, paused, KEYS};

    let dir = Workdir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    let app = app_with_tools(&dir, SHIP, move |s| s.server.api_keys_file = Some(keys)).await;
    let (_stream, id) = paused(&app, "agent-key-000001", "which", "note a; ship b").await;
    let junior = "low-key-0000003";

    // junior (max_risk low) may decide the note, not the ship: listed, with
    // the one task it may decide, and no Confirm of the whole plan.
    let listed = inbox(&app, junior).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["may_decide_tasks"], json!([1]));
    assert_eq!(listed[0]["may_approve"], false);
    let lead = inbox(&app, "lead-key-000001").await;
    assert_eq!(lead[0]["may_decide_tasks"], json!([1, 2]));
    assert_eq!(lead[0]["may_approve"], true);

    // Once the note is decided, nothing pending is junior's: not listed.
    let low = json!({"message": "CONFIRM_ACTION:decide",
                     "decisions": [{"index": 1, "decision": "approve"}]});
    let (status, _) = reply_as(&app, junior, "which", &id, low).await;
    assert_eq!(status, 200);
    assert!(inbox(&app, junior).await.is_empty());
    let lead = inbox(&app, "lead-key-000001").await;
    assert_eq!(lead[0]["may_decide_tasks"], json!([2]));
}
