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
