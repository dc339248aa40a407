//! Each task's own expiry (#42), over real sockets: a task whose tool says
//! `on_timeout = "reject"` and whose `timeout` passes first is rejected
//! alone (`expired`), the run going on with the others pending; a task
//! whose tool cancels on timeout ends the whole run when its time is up.

use chatgate::protocol::ChunkType;
use serde_json::json;

use crate::as_decided::waiting;
use crate::tools::{app_with_tools, outputs, Workdir};

/// `nudge` waits one second and silence rejects it; `ping` waits one
/// second and silence cancels the run. `note` waits `--confirm-timeout`.
const TOOLS: &str = r#"
[[tool]]
name = "nudge"
description = "A nudge nobody has to answer"
risk = "low"
timeout = "1s"
on_timeout = "reject"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }

[[tool]]
name = "ping"
description = "A ping that waits one second"
risk = "low"
timeout = "1s"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

#[tokio::test]
async fn a_task_that_rejects_on_timeout_expires_alone_and_the_run_goes_on() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, TOOLS, |_| {}).await;
    let (mut stream, request) = app.open_paused("alone", "nudge a; note b").await;
    let data = request.approval().unwrap();
    let (nudge, note) = (&data.tasks[0], &data.tasks[1]);
    assert!(
        nudge.expires_at < note.expires_at,
        "each task its own expiry: {:?} {:?}",
        nudge.expires_at,
        note.expires_at
    );
    assert_eq!(data.expires_at, note.expires_at.clone().unwrap());

    // A second on: the nudge is rejected alone, the note still pending.
    let expired = stream.until(ChunkType::DecisionRecorded).await;
    assert_eq!(expired.metadata["decisions"][0]["index"], 1);
    assert_eq!(expired.metadata["decisions"][0]["decision"], "reject");
    assert_eq!(expired.metadata["pending"], json!([2]));
    let again = waiting(&mut stream).await;
    assert_eq!(again.metadata["pending"], json!([2]));
    let shown = outputs(&stream);
    assert_eq!(shown.len(), 1);
    assert!(shown[0].metadata["error"]
        .as_str()
        .unwrap()
        .contains("no answer in time"));
    let listed = crate::tasks::listed_tasks(&app).await;
    assert_eq!(listed[0]["state"], "expired");
    assert_eq!(listed[0]["decided_by"], "timeout");
    assert_eq!(listed[1]["state"], "pending");

    let (status, received) = app.reply("alone", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200, "{received:?}");
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.metadata["tasks_rejected"], 1);
    assert_eq!(dir.notes(), ["note b"]);
    app.registry_drains().await;
    let audit = dir.audit();
    let expired = audit
        .iter()
        .find(|r| r["event"] == "decided_task")
        .expect("the expiry on the record");
    assert_eq!(expired["key"], "timeout");
    assert_eq!(expired["index"], 1);
}

#[tokio::test]
async fn a_task_that_cancels_on_timeout_ends_the_whole_run() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, TOOLS, |_| {}).await;
    let (mut stream, request) = app.open_paused("whole", "note a; ping b").await;
    assert_eq!(request.approval().unwrap().timeout_seconds, 1);
    let note = &request.approval().unwrap().tasks[0];
    assert!(note.expires_at > request.approval().unwrap().tasks[1].expires_at);
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(last.metadata["reason"], "timeout");
    assert!(dir.notes().is_empty(), "nothing was decided");
}
