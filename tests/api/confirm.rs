//! The confirmation handshake: confirm, modify, cancel, and refused replies.

use chatgate::protocol::{Action, ChunkType, RiskLevel};
use serde_json::json;

use crate::helpers::{confirmation_id, error_type, one_chunk, reason, spawn_app};

#[tokio::test]
async fn confirm_resumes_the_original_stream_and_completes() {
    let app = spawn_app().await;
    let (mut stream, request) = app
        .open_paused("c", "1. create a report\n2. email it")
        .await;

    let (status, ack) = app.reply("c", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    assert_eq!(status, 200);
    assert_eq!(ack.chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(ack.sequence, 1);
    assert_eq!(ack.metadata["action"], "confirm");
    assert_eq!(
        ack.metadata["confirmation_id"],
        confirmation_id(&request).as_str()
    );
    assert_eq!(ack.metadata["confirmation_round"], 1);
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(
        stream.types(),
        [
            ChunkType::TaskInit,
            ChunkType::ConfirmationRequest,
            ChunkType::ConfirmationReceived,
            ChunkType::Status,
            ChunkType::ToolOutput,
            ChunkType::Status,
            ChunkType::ToolOutput,
            ChunkType::Completion,
        ]
    );
    app.registry_drains().await;
}

#[tokio::test]
async fn the_confirmation_request_carries_the_plan_and_the_simacode_metadata() {
    let app = spawn_app().await;

    let (_stream, request) = app
        .open_paused("plan", "back up the db; then drop old tables")
        .await;

    assert!(request.requires_response);
    assert!(request.stream_paused);
    assert!(!request.finished);
    let data = request.approval().cloned().unwrap();
    assert!(uuid::Uuid::parse_str(&data.confirmation_id).is_ok());
    assert_eq!(data.confirmation_round, 1);
    assert_eq!(data.options, Action::ALL);
    assert_eq!(data.timeout_seconds, 300);
    assert_eq!(data.risk_level, RiskLevel::High);
    let descriptions: Vec<_> = data.tasks.iter().map(|t| t.description.as_str()).collect();
    assert_eq!(descriptions, ["back up the db", "drop old tables"]);
    assert_eq!(data.tasks[1].index, 2);
    assert_eq!(data.tasks[1].tool, "drop");
    let expires = humantime::parse_rfc3339(&data.expires_at).expect("RFC 3339");
    assert!(data.expires_at.ends_with('Z'), "UTC: {}", data.expires_at);
    let left = expires
        .duration_since(std::time::SystemTime::now())
        .expect("in the future");
    assert!(left.as_secs() <= 300 && left.as_secs() >= 200, "{left:?}");
    assert_eq!(request.metadata["total_tasks"], 2);
    assert_eq!(request.metadata["risk_level"], "high");
    assert_eq!(request.metadata["timeout_seconds"], 300);
    assert_eq!(request.metadata["confirmation_round"], 1);
}

#[tokio::test]
async fn modify_starts_a_second_round_with_the_feedback_then_confirm_runs_it() {
    let app = spawn_app().await;
    let (mut stream, first) = app.open_paused("m", "write the summary").await;

    let (status, ack) = app.reply("m", "CONFIRM_ACTION:modify:add logging").await;
    let second = stream.until(ChunkType::ConfirmationRequest).await;
    let (status2, _) = app.reply("m", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    assert_eq!((status.as_u16(), status2.as_u16()), (200, 200));
    assert_eq!(ack.metadata["action"], "modify");
    let data = second.approval().cloned().unwrap();
    assert_eq!(data.confirmation_round, 2);
    assert_eq!(second.metadata["confirmation_round"], 2);
    assert_ne!(data.confirmation_id, confirmation_id(&first));
    let steps: Vec<_> = data.tasks.iter().map(|t| t.description.as_str()).collect();
    assert_eq!(steps, ["write the summary", "Apply feedback: add logging"]);
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.metadata["tasks_completed"], 2);
}

#[tokio::test]
async fn colons_and_newlines_in_the_modify_text_are_kept() {
    let app = spawn_app().await;
    let (mut stream, _) = app.open_paused("colon", "deploy").await;

    app.reply("colon", "CONFIRM_ACTION:modify:use host: a:b:c")
        .await;
    let second = stream.until(ChunkType::ConfirmationRequest).await;

    let tasks = second.approval().cloned().unwrap().tasks;
    assert_eq!(tasks[1].description, "Apply feedback: use host: a:b:c");
}

#[tokio::test]
async fn non_ascii_text_round_trips() {
    let app = spawn_app().await;
    let (mut stream, request) = app
        .open_paused("utf", "建立报告; envoyer le résumé 📨")
        .await;

    app.reply("utf", "CONFIRM_ACTION:modify:añadir registro — ✅")
        .await;
    let second = stream.until(ChunkType::ConfirmationRequest).await;

    let first_steps: Vec<_> = request
        .approval()
        .cloned()
        .unwrap()
        .tasks
        .into_iter()
        .map(|t| t.description)
        .collect();
    assert_eq!(first_steps, ["建立报告", "envoyer le résumé 📨"]);
    let tasks = second.approval().cloned().unwrap().tasks;
    assert_eq!(tasks[2].description, "Apply feedback: añadir registro — ✅");
}

#[tokio::test]
async fn cancel_ends_the_run_and_nothing_is_executed() {
    let app = spawn_app().await;
    let (mut stream, _) = app.open_paused("x", "format the disk").await;

    let (status, ack) = app.reply("x", "CONFIRM_ACTION: Cancel ").await;
    let last = stream.finish().await;

    assert_eq!(status, 200);
    assert_eq!(ack.metadata["action"], "cancel");
    assert_eq!(reason(&last), "user");
    assert!(!stream
        .types()
        .iter()
        .any(|t| matches!(t, ChunkType::Status | ChunkType::ToolOutput)));
    app.registry_drains().await;
}

#[tokio::test]
async fn a_reply_for_an_unknown_session_gets_404() {
    let app = spawn_app().await;

    let (status, chunk) = app.reply("nobody", "CONFIRM_ACTION:confirm").await;

    assert_eq!(status, 404);
    assert_eq!(error_type(&chunk), "no_pending_confirmation");
    assert_eq!(chunk.session_id, "nobody");
}

#[tokio::test]
async fn a_reply_for_a_streaming_run_that_never_paused_gets_404() {
    let app = spawn_app_with_slow_answers().await;
    let mut stream = app.open("busy-q", "why is the sky blue?").await;
    stream.next_chunk().await.unwrap();

    let (status, chunk) = app.reply("busy-q", "CONFIRM_ACTION:confirm").await;

    assert_eq!(status, 404);
    assert_eq!(error_type(&chunk), "no_pending_confirmation");
}

async fn spawn_app_with_slow_answers() -> crate::helpers::TestApp {
    // 10 s per step is 1 s per answer token: the answer streams for a while.
    crate::helpers::spawn_app_with(|s| {
        s.engines.step_delay = std::time::Duration::from_millis(10_000)
    })
    .await
}

#[tokio::test]
async fn a_second_confirm_for_the_same_pause_gets_409_already_decided() {
    let app = crate::helpers::spawn_app_with(|s| {
        s.engines.step_delay = std::time::Duration::from_millis(2_000)
    })
    .await;
    let (mut stream, _) = app.open_paused("dbl", "step one; step two").await;

    let (first, _) = app.reply("dbl", "CONFIRM_ACTION:confirm").await;
    let (second, chunk) = app.reply("dbl", "CONFIRM_ACTION:confirm").await;

    assert_eq!(first, 200);
    assert_eq!(second, 409);
    assert_eq!(error_type(&chunk), "already_decided");
    stream.until(ChunkType::Status).await;
    let received = stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::ConfirmationReceived)
        .count();
    assert_eq!(received, 1, "one decision reaches the stream");
}

#[tokio::test]
async fn a_stale_confirmation_id_gets_409_and_the_pause_goes_on() {
    let app = spawn_app().await;
    let (mut stream, request) = app.open_paused("stale", "ship it").await;

    let response = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:confirm",
            "session_id": "stale",
            "confirmation_id": "00000000-0000-4000-8000-000000000000",
        }))
        .await;
    let (status, chunk) = one_chunk(response).await;
    let matching = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:confirm",
            "session_id": "stale",
            "confirmation_id": confirmation_id(&request),
        }))
        .await;

    assert_eq!(status, 409);
    assert_eq!(error_type(&chunk), "stale_confirmation");
    assert_eq!(matching.status(), 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn refused_replies_get_422_with_the_options_and_leave_the_pause_untouched() {
    let app = spawn_app().await;
    let (mut stream, _) = app.open_paused("bad", "tidy up").await;
    let cases = [
        "CONFIRM_ACTION",
        "CONFIRM_ACTION:",
        "CONFIRM_ACTION: ",
        "CONFIRM_ACTIONconfirm",
        "CONFIRM_ACTION::text",
        "CONFIRM_ACTION:approve",
        "CONFIRM_ACTION:yes:please",
    ];

    for message in cases {
        let (status, chunk) = app.reply("bad", message).await;
        assert_eq!(status, 422, "{message:?}");
        assert_eq!(error_type(&chunk), "invalid_confirm_action", "{message:?}");
        assert_eq!(
            chunk.metadata["options"],
            json!(["confirm", "modify", "cancel"]),
            "{message:?}"
        );
    }
    let (status, _) = app.reply("bad", "CONFIRM_ACTION:CONFIRM").await;

    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn a_modify_without_text_puts_the_same_plan_again() {
    let app = spawn_app().await;
    let (mut stream, first) = app.open_paused("same", "tidy up; then rest").await;

    for message in ["CONFIRM_ACTION:modify", "CONFIRM_ACTION:modify:   "] {
        let (status, _) = app.reply("same", message).await;
        assert_eq!(status, 200, "{message:?}");
        let again = stream.until(ChunkType::ConfirmationRequest).await;
        let (before, after) = (first.approval().unwrap(), again.approval().unwrap());
        // The same steps; each a new decision of the new round (#42).
        let steps = |tasks: &[chatgate::protocol::TaskSpec]| {
            tasks
                .iter()
                .map(|t| {
                    (
                        t.index,
                        t.description.clone(),
                        t.tool.clone(),
                        t.args.clone(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(steps(&after.tasks), steps(&before.tasks), "no step added");
        assert_ne!(after.tasks[0].task_id, before.tasks[0].task_id);
        assert_ne!(after.confirmation_id, before.confirmation_id);
    }
    app.reply("same", "CONFIRM_ACTION:cancel").await;
    assert_eq!(reason(&stream.finish().await), "user");
}

#[tokio::test]
async fn a_reply_in_any_letter_case_is_a_reply_not_a_new_plan() {
    let app = spawn_app().await;
    let (mut stream, _) = app.open_paused("lower", "tidy up").await;

    let (status, chunk) = app.reply("lower", "confirm_action:confirm").await;

    assert_eq!(status, 200);
    assert_eq!(chunk.chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn a_reply_without_session_id_is_400_and_says_so() {
    let app = spawn_app().await;

    let (status, chunk) = one_chunk(
        app.post_json(&json!({ "message": "CONFIRM_ACTION:confirm" }))
            .await,
    )
    .await;

    assert_eq!(status, 400);
    assert_eq!(error_type(&chunk), "invalid_request");
    assert!(chunk.chunk.contains("session_id"), "{}", chunk.chunk);
}

#[tokio::test]
async fn an_unknown_action_names_the_options_in_its_text() {
    let app = spawn_app().await;
    let (mut stream, _) = app.open_paused("typo", "tidy up").await;

    let (status, chunk) = app.reply("typo", "CONFIRM_ACTION:approve").await;

    assert_eq!(status, 422);
    assert!(
        chunk.chunk.contains("confirm, modify, cancel"),
        "{}",
        chunk.chunk
    );
    app.reply("typo", "CONFIRM_ACTION:cancel").await;
    stream.finish().await;
}

#[tokio::test]
async fn a_malformed_reply_is_422_even_when_nothing_is_pending() {
    let app = spawn_app().await;

    let (status, chunk) = app.reply("none", "CONFIRM_ACTION").await;

    assert_eq!(status, 422);
    assert_eq!(error_type(&chunk), "invalid_confirm_action");
}

#[tokio::test]
async fn an_unknown_action_without_a_pause_is_404_first() {
    let app = spawn_app().await;

    let (status, chunk) = app.reply("none", "CONFIRM_ACTION:approve").await;

    assert_eq!(status, 404);
    assert_eq!(error_type(&chunk), "no_pending_confirmation");
}

#[tokio::test]
async fn a_reply_sent_again_is_told_what_was_decided_and_by_whom_while_the_run_s_end_is_kept() {
    let app =
        crate::helpers::spawn_app_with(|s| s.server.api_keys = vec!["k-secret-1".into()]).await;
    let reply = |id: &str| json!({"message": "CONFIRM_ACTION:confirm", "session_id": "again", "confirmation_id": id});
    let post = |body: serde_json::Value| {
        let url = format!("{}/api/v1/chat/stream", app.address);
        async move {
            let response = reqwest::Client::new()
                .post(url)
                .bearer_auth("k-secret-1")
                .json(&body)
                .send()
                .await
                .unwrap();
            one_chunk(response).await
        }
    };
    let opened = reqwest::Client::new()
        .post(format!("{}/api/v1/chat/stream", app.address))
        .bearer_auth("k-secret-1")
        .json(&json!({"message": "build; ship", "session_id": "again"}))
        .send()
        .await
        .unwrap();
    let mut stream = crate::helpers::EventStream::new(opened);
    let request = stream.until(ChunkType::ConfirmationRequest).await;
    let id = confirmation_id(&request);
    // A person's pace: the run's end is then kept for the grace.
    tokio::time::sleep(std::time::Duration::from_millis(150)).await;

    let (status, _) = post(reply(&id)).await;
    assert_eq!(status, 200);
    // Sent again while the run works on, and again after it ended.
    let (status, again) = post(reply(&id)).await;
    assert_eq!(status, 409, "{again:?}");
    assert_eq!(error_type(&again), "already_decided");
    assert_eq!(again.metadata["action"], "confirm");
    assert_eq!(again.metadata["decided_by"], "key-1");
    assert_eq!(again.metadata["confirmation_id"], id.as_str());
    assert!(again.metadata["decided_at"]
        .as_str()
        .unwrap()
        .ends_with('Z'));
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let (status, after) = post(reply(&id)).await;
    assert_eq!(status, 409, "{after:?}");
    assert_eq!(after.metadata["decided_by"], "key-1");
    assert!(after.chunk.contains("confirm by key-1"), "{after:?}");
    // A reply that names no pause, or another one, is answered as before.
    let (status, plain) =
        post(json!({"message": "CONFIRM_ACTION:confirm", "session_id": "again"})).await;
    assert_eq!(status, 404, "{plain:?}");
    let (status, other) = post(reply("not-that-one")).await;
    assert_eq!(status, 404, "{other:?}");
}
