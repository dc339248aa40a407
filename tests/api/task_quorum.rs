//! A quorum per task (#42), over real sockets: `approvals = N` counts the
//! approvals of that task, which is decided once it has them while the
//! other tasks go their own way; a reject of it is a veto of it alone; an
//! edit short of its quorum is refused with nothing kept.

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::approvers::{decide as reply_as, error_type, paused, KEYS};
use crate::helpers::TestApp;
use crate::tools::Workdir;

/// `deploy` (high risk, two approvals) writes its step to the notes, as
/// `note` (one yes) does (four_eyes.rs's).
async fn app(dir: &Workdir) -> TestApp {
    crate::four_eyes::app(dir, &crate::four_eyes::deploy(dir, KEYS)).await
}

/// The tasks of the one pause the inbox lists to lead-1.
async fn tasks_listed(app: &TestApp) -> Vec<Value> {
    let items = crate::approvers::inbox(app, LEAD_1).await;
    assert_eq!(items.len(), 1, "{items:?}");
    items[0]["confirmation_data"]["tasks"]
        .as_array()
        .unwrap()
        .clone()
}

fn decide_body(decisions: Value) -> Value {
    json!({"message": "CONFIRM_ACTION:decide", "decisions": decisions})
}

const LEAD_1: &str = "lead-key-000001";
const LEAD_2: &str = "lead-key-000002";

#[tokio::test]
async fn a_task_needing_two_approvals_completes_on_its_own_while_another_needed_one() {
    let dir = Workdir::new();
    let app = app(&dir).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "q", "note a; note b; deploy c").await;
    let request = stream.chunks.last().unwrap().clone();
    let tasks = &request.approval().unwrap().tasks;
    assert_eq!(tasks[2].required, Some(2));
    assert_eq!(tasks[2].approvals.as_deref(), Some(&[][..]));
    assert_eq!(tasks[0].required, None, "one approval: {:?}", tasks[0]);

    // Task 1 needs one approval: lead-1's decides it.
    let one = decide_body(json!([{"index": 1, "decision": "approve"}]));
    let (status, chunk) = reply_as(&app, LEAD_1, "q", &id, one).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::DecisionRecorded)
    );
    assert_eq!(chunk.metadata["pending"], json!([2, 3]));

    // Task 3 needs two: lead-1's is one, recorded and named.
    let three = decide_body(json!([{"index": 3, "decision": "approve"}]));
    let (status, chunk) = reply_as(&app, LEAD_1, "q", &id, three.clone()).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ApprovalRecorded)
    );
    assert_eq!(
        chunk.metadata["task_approvals"],
        json!([{"index": 3, "approvals": ["lead-1"], "required": 2}])
    );
    assert_eq!(chunk.metadata["approvals"], json!(["lead-1"]));
    assert_eq!(chunk.metadata["required"], 2);
    assert_eq!(chunk.metadata["pending"], json!([2, 3]));
    let (status, chunk) = reply_as(&app, LEAD_1, "q", &id, three.clone()).await;
    assert_eq!((status, error_type(&chunk)), (409, "already_approved"));
    let listed = tasks_listed(&app).await;
    assert_eq!(listed[2]["approvals"], json!(["lead-1"]));
    assert_eq!(listed[2]["state"], "pending");

    // lead-2's completes task 3 alone; task 2 is still pending.
    let (status, chunk) = reply_as(&app, LEAD_2, "q", &id, three).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::DecisionRecorded)
    );
    assert_eq!(chunk.metadata["decisions"][0]["index"], 3);
    assert_eq!(chunk.metadata["pending"], json!([2]));
    let listed = tasks_listed(&app).await;
    let states: Vec<&str> = listed
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["approved", "pending", "approved"]);

    // The last task: one approval decides the pause.
    let two = decide_body(json!([{"index": 2, "decision": "approve"}]));
    let (status, chunk) = reply_as(&app, LEAD_1, "q", &id, two).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    let approvers = chunk.metadata["approved_by"].as_array().unwrap();
    assert!(approvers.contains(&json!("lead-2")), "{approvers:?}");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note a", "note b", "deploy c"]);
    app.registry_drains().await;
    let approved: Vec<Value> = dir
        .audit()
        .into_iter()
        .filter(|r| r["event"] == "approved")
        .collect();
    assert_eq!(approved.len(), 1, "{approved:?}");
    assert_eq!(approved[0]["task"], 3);
    assert_eq!(approved[0]["key"], "lead-1");
}

#[tokio::test]
async fn a_reject_of_a_quorum_task_vetoes_that_task_alone() {
    let dir = Workdir::new();
    let app = app(&dir).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "v", "deploy x; note y").await;
    let approve = decide_body(json!([{"index": 1, "decision": "approve"}]));
    let (status, _) = reply_as(&app, LEAD_1, "v", &id, approve).await;
    assert_eq!(status, 200);
    let veto = decide_body(json!([{"index": 1, "decision": "reject", "reason": "not now"}]));
    let (status, chunk) = reply_as(&app, LEAD_2, "v", &id, veto).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::DecisionRecorded)
    );
    assert_eq!(chunk.metadata["pending"], json!([2]));

    // The note needs one yes, and junior (low risk only) may give it.
    let confirm = json!({"message": "CONFIRM_ACTION:confirm"});
    let (status, chunk) = reply_as(&app, "low-key-0000003", "v", &id, confirm).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived),
        "{chunk:?}"
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note y"], "the deploy never ran");
}

#[tokio::test]
async fn an_edit_short_of_a_task_s_quorum_is_refused_with_nothing_kept() {
    let dir = Workdir::new();
    let app = app(&dir).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "e", "deploy x; note y").await;
    let edit = decide_body(json!([
        {"index": 2, "decision": "approve"},
        {"index": 1, "decision": "edit", "args": {"step": "deploy z"}}
    ]));
    let (status, chunk) = reply_as(&app, LEAD_1, "e", &id, edit).await;
    assert_eq!((status, error_type(&chunk)), (422, "edit_needs_new_round"));
    let listed = tasks_listed(&app).await;
    assert_eq!(listed[1]["state"], "pending", "nothing of that reply kept");

    // Nothing decided task by task: a confirm is one approval of the
    // whole plan, as before per-task decisions; from then on the plan is
    // approved whole (a decide is refused, nothing kept).
    let confirm = json!({"message": "CONFIRM_ACTION:confirm"});
    let (status, chunk) = reply_as(&app, LEAD_1, "e", &id, confirm.clone()).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ApprovalRecorded)
    );
    assert_eq!(chunk.metadata["approvals"], json!(["lead-1"]));
    let one = decide_body(json!([{"index": 2, "decision": "approve"}]));
    let (status, chunk) = reply_as(&app, LEAD_2, "e", &id, one).await;
    assert_eq!((status, error_type(&chunk)), (422, "invalid_decision"));
    let (status, chunk) = reply_as(&app, LEAD_2, "e", &id, confirm).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["deploy x", "note y"]);
}

#[tokio::test]
async fn once_tasks_are_decided_one_by_one_a_confirm_is_one_approval_of_each_pending_task() {
    let dir = Workdir::new();
    let app = app(&dir).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "c", "deploy a; deploy b").await;
    let first = decide_body(json!([{"index": 1, "decision": "approve"}]));
    let (status, chunk) = reply_as(&app, LEAD_1, "c", &id, first).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ApprovalRecorded)
    );

    let confirm = json!({"message": "CONFIRM_ACTION:confirm"});
    let (status, chunk) = reply_as(&app, LEAD_2, "c", &id, confirm).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::DecisionRecorded),
        "{chunk:?}"
    );
    assert_eq!(chunk.metadata["decisions"][0]["index"], 1);
    assert_eq!(chunk.metadata["pending"], json!([2]));
    assert_eq!(
        chunk.metadata["task_approvals"],
        json!([{"index": 2, "approvals": ["lead-2"], "required": 2}])
    );
    // Task 1 has its two approvals and runs; task 2 waits for its second.
    crate::as_decided::waiting(&mut stream).await;
    assert_eq!(dir.notes(), ["deploy a"]);

    let second = decide_body(json!([{"index": 2, "decision": "approve"}]));
    let (status, chunk) = reply_as(&app, LEAD_1, "c", &id, second).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["deploy a", "deploy b"]);
}
