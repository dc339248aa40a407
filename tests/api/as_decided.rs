//! Tasks carried out as they are decided (#42), over real sockets: the
//! planner runs a task as soon as it and every task before it are decided
//! and waits on for the rest (the same pause); a cancel ends the run with
//! what ran; a modify once a task ran is refused; and a task that finished
//! before a restart is shown again from its execution journal, not run
//! again (#44).

use chatgate::protocol::{Chunk, ChunkType};
use serde_json::{json, Value};

use crate::helpers::{error_type, one_chunk, EventStream, TestApp};
use crate::tools::{app_with_tools, outputs, Workdir};

async fn decide(app: &TestApp, session: &str, decisions: Value) -> (u16, Chunk) {
    let body = json!({
        "message": "CONFIRM_ACTION:decide",
        "session_id": session,
        "decisions": decisions,
    });
    let (status, chunk) = one_chunk(app.post_json(&body).await).await;
    (status.as_u16(), chunk)
}

/// Reads until the run says it waits again for tasks still pending (a
/// `status` chunk naming them), and returns that chunk.
pub(crate) async fn waiting(stream: &mut EventStream) -> Chunk {
    loop {
        let chunk = stream.until(ChunkType::Status).await;
        if chunk.metadata.contains_key("pending") {
            return chunk;
        }
    }
}

/// The task indexes of the `tool_output` chunks read so far, in order.
fn ran(stream: &EventStream) -> Vec<u64> {
    outputs(stream)
        .iter()
        .map(|chunk| chunk.metadata["step"].as_u64().unwrap())
        .collect()
}

#[tokio::test]
async fn the_planner_runs_a_task_once_it_and_every_task_before_it_are_decided() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, request) = app.open_paused("order", "note a; note b; note c").await;
    let id = crate::helpers::confirmation_id(&request);

    // Task 2 alone: recorded, but task 1 before it is pending, so nothing
    // runs (the paused stream shows the decision and nothing else).
    let (status, ack) = decide(&app, "order", json!([{"index": 2, "decision": "approve"}])).await;
    assert_eq!((status, ack.chunk_type), (200, ChunkType::DecisionRecorded));
    assert_eq!(ack.metadata["pending"], json!([1, 3]));
    let shown = stream.until(ChunkType::DecisionRecorded).await;
    assert_eq!(shown.metadata["pending"], json!([1, 3]));

    // Task 1: it runs, and task 2 (decided) right after it; the run then
    // waits on the same pause for task 3.
    let (status, ack) = decide(&app, "order", json!([{"index": 1, "decision": "approve"}])).await;
    assert_eq!((status, ack.chunk_type), (200, ChunkType::DecisionRecorded));
    assert_eq!(ack.metadata["pending"], json!([3]));
    let again = waiting(&mut stream).await;
    assert_eq!(again.metadata["confirmation_id"], id.as_str());
    assert_eq!(again.metadata["pending"], json!([3]));
    assert!(!again.finished);
    assert_eq!(ran(&stream), [1, 2], "{:?}", stream.types());
    assert_eq!(dir.notes(), ["note a", "note b"]);
    let order: Vec<ChunkType> = stream
        .types()
        .into_iter()
        .filter(|t| matches!(t, ChunkType::DecisionRecorded | ChunkType::ToolOutput))
        .collect();
    assert_eq!(
        order,
        [
            ChunkType::DecisionRecorded,
            ChunkType::DecisionRecorded,
            ChunkType::ToolOutput,
            ChunkType::ToolOutput
        ],
        "nothing ran before task 1 was decided"
    );
    let listed = crate::tasks::listed_tasks(&app).await;
    let states: Vec<&str> = listed
        .iter()
        .map(|t| t["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["approved", "approved", "pending"]);

    // The last task: the pause is decided as today, and only task 3 runs.
    let (status, received) =
        decide(&app, "order", json!([{"index": 3, "decision": "approve"}])).await;
    assert_eq!(
        (status, received.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.metadata["tasks_completed"], 3);
    assert_eq!(ran(&stream), [1, 2, 3]);
    assert_eq!(dir.notes(), ["note a", "note b", "note c"]);
}

#[tokio::test]
async fn a_confirm_after_a_task_ran_runs_only_the_rest() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, _) = app.open_paused("rest", "note a; note b; note c").await;
    let decisions = json!([{"index": 1, "decision": "approve"}]);
    assert_eq!(decide(&app, "rest", decisions).await.0, 200);
    waiting(&mut stream).await;

    let body = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "rest",
                      "decisions": [{"index": 3, "decision": "reject", "reason": "not c"}]});
    let (status, received) = one_chunk(app.post_json(&body).await).await;
    assert_eq!(status, 200, "{received:?}");
    let verdicts: Vec<&str> = received.metadata["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["decision"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["approve", "approve", "reject"]);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(ran(&stream), [1, 2, 3], "task 3's rejection is its output");
    assert_eq!(dir.notes(), ["note a", "note b"], "task 1 ran once");
}

#[tokio::test]
async fn a_cancel_after_a_task_ran_ends_the_run_and_runs_nothing_more() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, _) = app.open_paused("stop", "note a; note b").await;
    let decisions = json!([{"index": 1, "decision": "approve"}]);
    assert_eq!(decide(&app, "stop", decisions).await.0, 200);
    waiting(&mut stream).await;

    let (status, _) = app.reply("stop", "CONFIRM_ACTION:cancel").await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Cancelled);
    assert_eq!(dir.notes(), ["note a"]);
}

#[tokio::test]
async fn a_modify_once_a_task_ran_is_refused_and_keeps_nothing() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, _) = app.open_paused("edit", "note a; note b").await;
    let decisions = json!([{"index": 1, "decision": "approve"}]);
    assert_eq!(decide(&app, "edit", decisions).await.0, 200);
    waiting(&mut stream).await;

    let (status, chunk) = app.reply("edit", "CONFIRM_ACTION:modify:other").await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (422, "invalid_decision"),
        "{chunk:?}"
    );
    let (status, _) = app.reply("edit", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note a", "note b"]);
}

#[tokio::test]
async fn a_reject_or_a_respond_decided_first_goes_through_at_once() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, _) = app.open_paused("skip", "note a; note b; note c").await;
    let decisions = json!([
        {"index": 1, "decision": "reject", "reason": "not a"},
        {"index": 2, "decision": "respond", "result": "b is done"}
    ]);
    assert_eq!(decide(&app, "skip", decisions).await.0, 200);
    let again = waiting(&mut stream).await;
    assert_eq!(again.metadata["pending"], json!([3]));
    let shown = outputs(&stream);
    assert_eq!(shown.len(), 2);
    assert_eq!(shown[0].metadata["ok"], false);
    assert_eq!(shown[1].metadata["ok"], true);
    assert!(dir.notes().is_empty());

    let (status, _) = app.reply("skip", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.metadata["tasks_rejected"], 1);
    assert_eq!(dir.notes(), ["note c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_ran_before_a_restart_is_shown_again_not_run_again() {
    use crate::durable::{
        chunks, ended_trail, mark_tool, marks, open_paused, post, read_raw, reply, start,
        stream_url, terminate, Dir,
    };

    let dir = Dir::new();
    let tools = mark_tool(&dir, "0");
    let tools = tools.to_str().unwrap();
    let audit = dir.path("audit.jsonl").display().to_string();
    let args = ["--tools", tools, "--audit-log", audit.as_str()];
    let mut first = start(&dir, &args);
    let url = stream_url(&first);
    let mut reading = open_paused(
        &url,
        json!({"message": "mark one; mark two", "session_id": "again"}),
    )
    .await;
    let body = json!({"message": "CONFIRM_ACTION:decide", "session_id": "again",
                      "decisions": [{"index": 1, "decision": "approve"}]});
    let response = post(&url, body, None).await;
    assert_eq!(response.status(), 200);
    reading.until("Waiting for a decision").await;
    assert_eq!(marks(dir.0.path()), 1);
    terminate(&mut first);
    drop(reading);

    let second = start(&dir, &args);
    let url = stream_url(&second);
    // Restored a moment after the start: 503 until then.
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    let (status, received) = loop {
        let (status, received) = reply(&url, "again", "CONFIRM_ACTION:confirm").await;
        if status != 503 || tokio::time::Instant::now() > deadline {
            break (status, received);
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(status, 200, "{received:?}");
    let back = post(
        &url,
        json!({"session_id": "again"}),
        Some(received.sequence),
    )
    .await;
    let rest = chunks(&read_raw(back, None).await);
    let last = rest.last().unwrap();
    assert_eq!(last.chunk_type, ChunkType::Completion, "{rest:?}");
    let first_task = rest
        .iter()
        .find(|c| c.chunk_type == ChunkType::ToolOutput && c.metadata["step"] == 1)
        .expect("task 1's output");
    // Its execution journal says it finished (#44): its output is shown
    // again, not run again.
    assert_eq!(first_task.metadata["ok"], true, "{first_task:?}");
    assert_eq!(first_task.metadata["replayed"], true, "{first_task:?}");
    assert_eq!(marks(dir.0.path()), 2, "task 1 once, task 2 once");
    let (events, _) = ended_trail(&dir.path("audit.jsonl"), "again").await;
    let executed = events.iter().filter(|e| *e == "executed").count();
    assert_eq!(executed, 2, "{events:?}");
}

#[cfg(feature = "openai")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_engine_runs_each_call_of_a_turn_as_soon_as_it_is_decided() {
    use crate::model_server::{fake_model, tokens};
    use crate::openai::app_with_model;
    use crate::openai_tools::{answer, call, tool_messages, Tooling};

    let tooling = Tooling::new();
    let note = |id: &str, index: usize, step: &str| {
        let args = json!({ "step": step }).to_string();
        call(Some(index), Some(id), Some("note"), json!(args))
    };
    let three = answer(
        &[
            note("c1", 0, "one"),
            note("c2", 1, "two"),
            note("c3", 2, "three"),
        ],
        "tool_calls",
    );
    let model = fake_model(vec![three, tokens(&["All three done."])]).await;
    let app = app_with_model(&model.url, tooling.configure()).await;
    let (mut stream, request) = app.open_paused("calls", "three notes").await;
    assert_eq!(request.approval().unwrap().tasks.len(), 3);

    // The calls are independent: the third runs as soon as it is decided.
    let (status, _) = decide(&app, "calls", json!([{"index": 3, "decision": "approve"}])).await;
    assert_eq!(status, 200);
    let again = waiting(&mut stream).await;
    assert_eq!(again.metadata["pending"], json!([1, 2]));
    assert_eq!(tooling.notes(), ["three"]);
    assert_eq!(ran(&stream), [3]);

    let (status, _) = decide(
        &app,
        "calls",
        json!([{"index": 1, "decision": "reject", "reason": "not one"}]),
    )
    .await;
    assert_eq!(status, 200);
    waiting(&mut stream).await;
    assert_eq!(ran(&stream), [3, 1]);
    assert_eq!(
        model.requests().len(),
        1,
        "no next turn before all are done"
    );

    let (status, received) =
        decide(&app, "calls", json!([{"index": 2, "decision": "approve"}])).await;
    assert_eq!(
        (status, received.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(tooling.notes(), ["three", "two"]);
    assert_eq!(ran(&stream), [3, 1, 2]);
    // The model's next turn has every call's result, in the calls' order.
    let results = tool_messages(&model.requests()[1]);
    let ids: Vec<&str> = results
        .iter()
        .map(|m| m["tool_call_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["c1", "c2", "c3"]);
    assert!(results[0]["content"].as_str().unwrap().contains("not one"));
    assert!(results[2]["content"].as_str().unwrap().contains("three"));
}
