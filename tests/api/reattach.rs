//! Re-attach after a dropped connection, detach grace, slow consumers.

use std::sync::Arc;

use chatgate::protocol::ChunkType;
use chatgate::run::{Completion, Engine, RunContext, RunError};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::helpers::{
    error_type, one_chunk, reason, spawn_app_with, spawn_app_with_engine, EventStream,
};

/// Keep-alive every second (how a vanished client is noticed), long grace.
fn detaching(s: &mut chatgate::config::Settings) {
    s.server.keep_alive = std::time::Duration::from_millis(200);
    s.pauses.detach_grace = std::time::Duration::from_secs(60);
}

#[tokio::test]
async fn a_detached_paused_run_can_be_confirmed_and_re_attached() {
    let app = spawn_app_with(detaching).await;
    let (stream, request) = app.open_paused("re", "first; second").await;
    drop(stream);
    app.eventually("the run is detached", |app| app.logs.detached() == 1)
        .await;
    // A pause a person could have sat through (the end of a client that
    // did is kept): this client re-attaches only once it has the answer,
    // so it did not, and its delivered end is forgotten, however late the
    // run gets to the decision.
    tokio::time::sleep(chatgate::run::replay::LONG_PAUSE + std::time::Duration::from_millis(50))
        .await;

    let (status, _) = app.reply("re", "CONFIRM_ACTION:confirm").await;
    let mut resumed =
        EventStream::resumed(app.reattach("re", request.sequence).await, request.sequence);
    let last = resumed.finish().await;

    assert_eq!(status, 200, "a detached pause is still decidable");
    assert_eq!(
        resumed.chunks[0].chunk_type,
        ChunkType::ConfirmationReceived
    );
    assert_eq!(resumed.chunks[0].sequence, request.sequence + 1);
    assert_eq!(last.chunk_type, ChunkType::Completion);
    app.registry_drains().await;
    app.eventually("the delivered log is forgotten", |app| app.logs.is_empty())
        .await;
}

#[tokio::test]
async fn a_re_attach_to_a_run_that_finished_meanwhile_replays_its_tail() {
    let app = spawn_app_with(detaching).await;
    let (stream, request) = app.open_paused("tail", "only step").await;
    drop(stream);
    app.eventually("the run is detached", |app| app.logs.detached() == 1)
        .await;
    app.reply("tail", "CONFIRM_ACTION:confirm").await;
    app.registry_drains().await;

    let mut resumed = EventStream::resumed(
        app.reattach("tail", request.sequence).await,
        request.sequence,
    );
    let last = resumed.finish().await;
    let (status, chunk) = one_chunk(app.reattach("tail", last.sequence).await).await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(
        resumed.chunks.len(),
        4,
        "received, status, tool_output, completion"
    );
    assert_eq!(status, 404, "delivered once, then forgotten");
    assert_eq!(error_type(&chunk), "no_such_run");
}

/// A reply that lost a race (a second replica's, forwarded once the run
/// had ended) and names its pause is told who decided it (409) while the
/// ended run's log is kept, and after; one naming no pause gets 404 once
/// the run has ended (docs/protocol.md, "A reply sent again").
#[tokio::test]
async fn a_reply_naming_its_pause_after_a_detached_run_ended_is_told_who_decided() {
    let app = spawn_app_with(detaching).await;
    let (stream, request) = app.open_paused("late", "only step").await;
    let id = crate::helpers::confirmation_id(&request);
    drop(stream);
    app.eventually("the run is detached", |app| app.logs.detached() == 1)
        .await;
    let (status, _) = app.reply("late", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    app.registry_drains().await;
    let late = || async {
        let body = serde_json::json!({
            "message": "CONFIRM_ACTION:cancel", "session_id": "late", "confirmation_id": id,
        });
        one_chunk(app.post_json(&body).await).await
    };

    let (status, told) = late().await;
    let (plain, unnamed) = app.reply("late", "CONFIRM_ACTION:cancel").await;

    assert_eq!(status, 409, "{told:?}");
    assert_eq!(error_type(&told), "already_decided");
    assert_eq!(told.metadata["action"], "confirm");
    assert_eq!(told.metadata["decided_by"], "anonymous");
    assert_eq!(told.metadata["confirmation_id"], id.as_str());
    assert_eq!(plain, 404, "{unnamed:?}");
    assert_eq!(error_type(&unnamed), "no_pending_confirmation");
    // Its end read, its log goes: what decided the pause is remembered.
    let mut resumed = EventStream::resumed(
        app.reattach("late", request.sequence).await,
        request.sequence,
    );
    assert_eq!(resumed.finish().await.chunk_type, ChunkType::Completion);
    app.eventually("the delivered log is forgotten", |app| app.logs.is_empty())
        .await;
    let (status, after) = late().await;
    assert_eq!(status, 409, "{after:?}");
    assert_eq!(after.metadata["decided_by"], "anonymous");
}

#[tokio::test]
async fn a_hole_in_the_replay_is_announced_with_gap() {
    let app = spawn_app_with(|s| {
        detaching(s);
        s.limits.replay_buffer = 2;
    })
    .await;
    let (stream, _) = app.open_paused("gap", "one; two; three").await;
    drop(stream);
    app.eventually("the run is detached", |app| app.logs.detached() == 1)
        .await;
    app.reply("gap", "CONFIRM_ACTION:confirm").await;
    // The session is freed just before the final chunk is logged: wait for
    // the chunk itself, or it may arrive live after the re-attach.
    app.registry_drains().await;
    app.eventually("the final chunk is logged", |app| app.logs.detached() == 0)
        .await;

    let mut resumed = EventStream::resumed(app.reattach("gap", 0).await, 0);
    let last = resumed.finish().await;

    assert_eq!(
        resumed.chunks.len(),
        2,
        "only the buffer's two chunks remain"
    );
    assert_eq!(resumed.chunks[0].metadata["gap"], true);
    assert!(resumed.chunks[0].sequence > 1);
    assert_eq!(last.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn a_re_attach_with_nothing_to_attach_to_gets_404_no_such_run() {
    let app = spawn_app_with(detaching).await;

    let (status, chunk) = one_chunk(app.reattach("nothing", 3).await).await;

    assert_eq!(status, 404);
    assert_eq!(error_type(&chunk), "no_such_run");
}

#[tokio::test]
async fn a_bad_last_event_id_is_400() {
    let app = spawn_app_with(detaching).await;
    let response = app
        .client
        .post(app.url())
        .header("Last-Event-ID", "abc")
        .json(&serde_json::json!({ "session_id": "x" }))
        .send()
        .await
        .unwrap();

    let (status, chunk) = one_chunk(response).await;

    assert_eq!(status, 400);
    assert_eq!(error_type(&chunk), "invalid_request");
}

#[tokio::test]
async fn after_the_grace_a_detached_run_at_work_is_cancelled_and_freed() {
    let app = spawn_app_with(|s| {
        s.server.keep_alive = std::time::Duration::from_millis(200);
        s.pauses.detach_grace = std::time::Duration::from_millis(300);
        s.engines.step_delay = std::time::Duration::from_secs(30);
    })
    .await;
    let (mut stream, _) = app.open_paused("late", "one slow step").await;
    app.reply("late", "CONFIRM_ACTION:confirm").await;
    stream.until(ChunkType::Status).await; // at work
    drop(stream);

    app.registry_drains().await;
    app.eventually("the log is forgotten", |app| app.logs.is_empty())
        .await;
    let (reattach, chunk) = one_chunk(app.reattach("late", 2).await).await;

    // Its outcome is kept (--keep-outcome): a re-attach reads how it ended.
    assert_eq!(reattach, 200);
    assert_eq!(reason(&chunk), "client_gone");
    assert_eq!(chunk.metadata["gap"], true);
}

#[tokio::test]
async fn a_paused_run_whose_client_left_outlives_the_grace_and_its_end_can_be_read() {
    let app = spawn_app_with(|s| {
        s.server.keep_alive = std::time::Duration::from_millis(200);
        s.pauses.detach_grace = std::time::Duration::from_millis(300);
    })
    .await;
    let (stream, request) = app.open_paused("away", "one; two").await;
    drop(stream);
    app.eventually("the run is detached", |app| app.logs.detached() == 1)
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(600)).await; // two graces

    let (status, _) = app.reply("away", "CONFIRM_ACTION:confirm").await;
    app.eventually("the run ended", |app| app.manager.active_runs() == 0)
        .await;
    let mut read_later = EventStream::resumed(
        app.reattach("away", request.sequence).await,
        request.sequence,
    );
    let last = read_later.finish().await;

    assert_eq!(status, 200, "the pause waited for its decision");
    assert_eq!(last.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn a_client_gone_unnoticed_during_a_pause_still_reads_the_end() {
    // The default keep-alive: nothing is written to the stream for 15 s,
    // so the server does not notice the client leave before the run ends.
    let app = spawn_app_with(|s| s.server.keep_alive = std::time::Duration::from_secs(15)).await;
    let (stream, request) = app.open_paused("unnoticed", "one; two").await;
    drop(stream);
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;

    let (status, _) = app.reply("unnoticed", "CONFIRM_ACTION:confirm").await;
    app.eventually("the run ended", |app| app.manager.active_runs() == 0)
        .await;
    // Whether or not the final chunk was written into the dead
    // connection, the end is there to be read.
    let back = app.reattach("unnoticed", request.sequence).await;
    let back_status = back.status();
    let mut read_later = EventStream::resumed(back, request.sequence);
    let last = read_later.finish().await;

    assert_eq!(status, 200);
    assert_eq!(back_status, 200);
    assert_eq!(
        read_later.chunks[0].chunk_type,
        ChunkType::ConfirmationReceived
    );
    assert_eq!(last.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn a_client_that_answers_at_once_leaves_no_ended_log_behind() {
    let app = spawn_app_with(|s| s.server.keep_alive = std::time::Duration::from_secs(15)).await;
    let (mut stream, _) = app.open_paused("quick", "one").await;
    let (status, _) = app.reply("quick", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;
    drop(stream);

    assert_eq!(status, 200);
    assert_eq!(last.chunk_type, ChunkType::Completion);
    app.eventually("the read end is forgotten", |app| app.logs.is_empty())
        .await;
}

#[tokio::test]
async fn a_second_client_re_attaching_takes_over_the_stream() {
    let app = spawn_app_with(detaching).await;
    let (mut first, request) = app.open_paused("two", "step").await;

    let mut second = EventStream::resumed(
        app.reattach("two", request.sequence).await,
        request.sequence,
    );
    app.reply("two", "CONFIRM_ACTION:confirm").await;
    let last = second.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(
        first.next_chunk().await,
        None,
        "the first stream ends without more chunks"
    );
}

/// Streams 1 KiB chunks as fast as it can, forever, until told to stop.
struct FirehoseEngine;

impl Engine for FirehoseEngine {
    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>> {
        async move {
            let block = "x".repeat(1024);
            loop {
                ctx.emit(ChunkType::Content, block.as_str()).await?;
                tokio::task::yield_now().await;
            }
        }
        .boxed()
    }
}

#[tokio::test]
async fn a_client_that_stops_reading_stops_the_run_as_slow_consumer() {
    let app =
        spawn_app_with_engine(|s| s.limits.replay_buffer = 64, Arc::new(FirehoseEngine)).await;

    // The headers arrive; the body is never read while the run floods it.
    let response = app.chat("slow", "flood me").await;
    app.registry_drains().await;
    let mut stream = EventStream::new(response);
    let last = stream.finish().await;

    assert_eq!(reason(&last), "slow_consumer");
    assert!(
        stream
            .chunks
            .iter()
            .any(|c| c.metadata.get("gap").is_some()),
        "the skipped chunks are announced"
    );
}

#[tokio::test]
async fn a_run_s_outcome_is_read_after_its_grace_by_re_attach_and_by_get() {
    // No grace at all: the run's log goes with its end; its outcome stays.
    let app = spawn_app_with(|s| {
        s.pauses.detach_grace = std::time::Duration::ZERO;
        s.server.api_keys = vec!["agent-key".into(), "other-key".into()];
    })
    .await;
    let post = |key: &'static str, body: serde_json::Value| {
        app.client
            .post(app.url())
            .bearer_auth(key)
            .json(&body)
            .send()
    };
    let opened = post(
        "agent-key",
        serde_json::json!({"message": "build; ship", "session_id": "later"}),
    )
    .await
    .unwrap();
    let mut stream = EventStream::new(opened);
    let request = stream.until(ChunkType::ConfirmationRequest).await;
    let id = crate::helpers::confirmation_id(&request);
    let decide = serde_json::json!({"message": "CONFIRM_ACTION:confirm", "session_id": "later",
                                    "confirmation_id": id, "decisions": [{"index": 2, "decision": "reject"}]});
    assert_eq!(post("agent-key", decide).await.unwrap().status(), 200);
    let last = stream.finish().await;

    let read = app
        .client
        .get(format!("{}/api/v1/runs/later", app.address))
        .bearer_auth("agent-key")
        .send()
        .await
        .unwrap();
    assert_eq!(read.status(), 200);
    let outcome: serde_json::Value = read.json().await.unwrap();
    assert_eq!(outcome["outcome"], "completion");
    assert_eq!(outcome["final_chunk"]["chunk"], last.chunk.as_str());
    assert_eq!(outcome["final_chunk"]["sequence"], last.sequence);
    assert_eq!(outcome["pauses"][0]["confirmation_id"], id.as_str());
    assert_eq!(outcome["pauses"][0]["action"], "confirm");
    assert_eq!(outcome["pauses"][0]["decided_by"], "key-1");
    assert_eq!(outcome["ran"][0]["ok"], true);
    assert_eq!(outcome["ran"][0]["simulated"], true);
    assert_eq!(outcome["ran"][1]["skipped"], true);
    assert!(outcome["ended_at"].as_str().unwrap().ends_with('Z'));

    // A re-attach gets the final chunk, under its own sequence.
    let again = app
        .client
        .post(app.url())
        .bearer_auth("agent-key")
        .header("Last-Event-ID", "1")
        .json(&serde_json::json!({"session_id": "later"}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200);
    let mut again = EventStream::resumed(again, 1);
    let end = again.finish().await;
    assert_eq!(end.chunk, last.chunk);
    assert_eq!(end.metadata["gap"], true);

    // Another key's namespace has no such run.
    let other = app
        .client
        .get(format!("{}/api/v1/runs/later", app.address))
        .bearer_auth("other-key")
        .send()
        .await
        .unwrap();
    assert_eq!(other.status(), 404);
    let body: serde_json::Value = other.json().await.unwrap();
    assert_eq!(body["error_type"], "no_such_run");
}

#[tokio::test]
async fn with_keep_outcome_zero_an_outcome_goes_with_the_grace() {
    let app = spawn_app_with(|s| {
        s.pauses.detach_grace = std::time::Duration::ZERO;
        s.pauses.keep_outcome = std::time::Duration::ZERO;
    })
    .await;
    let (mut stream, _) = app.open_paused("gone", "build").await;
    app.reply("gone", "CONFIRM_ACTION:confirm").await;
    stream.finish().await;

    let (status, _) = app.get("/api/v1/runs/gone").await;
    let (again, chunk) = one_chunk(app.reattach("gone", 1).await).await;

    assert_eq!(status, 404);
    assert_eq!(again, 404);
    assert_eq!(error_type(&chunk), "no_such_run");
}
