//! How runs end: timeout, max rounds, supersede, busy, client gone, shutdown.

use std::time::Duration;

use chatgate::protocol::ChunkType;

use crate::helpers::{error_type, reason, spawn_app, spawn_app_with, EventStream, WAIT};

#[tokio::test]
async fn silence_times_out_the_pause_and_later_replies_get_404() {
    let app =
        spawn_app_with(|s| s.pauses.confirm_timeout = std::time::Duration::from_millis(400)).await;
    let (mut stream, request) = app.open_paused("t", "wait for me").await;
    assert_eq!(request.approval().unwrap().timeout_seconds, 1);

    let last = stream.finish().await;
    let (status, chunk) = app.reply("t", "CONFIRM_ACTION:confirm").await;

    assert_eq!(reason(&last), "timeout");
    assert!(!stream.types().contains(&ChunkType::ToolOutput));
    assert_eq!(status, 404);
    assert_eq!(error_type(&chunk), "no_pending_confirmation");
    app.registry_drains().await;
}

#[tokio::test]
async fn the_last_round_offers_only_confirm_and_cancel_and_says_so() {
    let app = spawn_app_with(|s| s.pauses.max_rounds = 2).await;
    let (mut stream, first) = app.open_paused("r", "draft").await;

    app.reply("r", "CONFIRM_ACTION:modify:one").await;
    let second = stream.until(ChunkType::ConfirmationRequest).await;
    let (status, refused) = app.reply("r", "CONFIRM_ACTION:modify:two").await;
    let (confirmed, _) = app.reply("r", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    let data = |c: &chatgate::protocol::Chunk| c.approval().cloned().unwrap();
    assert_eq!(data(&first).options.len(), 3);
    assert!(!data(&first).last_round);
    assert_eq!(second.metadata["confirmation_round"], 2);
    assert_eq!(second.metadata["last_round"], true);
    assert!(data(&second).last_round);
    assert!(second.chunk.contains("last round"), "{}", second.chunk);
    let options: Vec<&str> = data(&second).options.iter().map(|a| a.as_str()).collect();
    assert_eq!(options, ["confirm", "cancel"]);
    assert_eq!(status, 422, "modify is not offered on the last round");
    assert_eq!(
        refused.metadata["options"],
        serde_json::json!(["confirm", "cancel"])
    );
    assert_eq!(confirmed, 200, "the pause stayed");
    assert_eq!(last.chunk_type, ChunkType::Completion);
    app.registry_drains().await;
}

#[tokio::test]
async fn a_new_message_supersedes_a_paused_run() {
    let app = spawn_app().await;
    let (mut old, _) = app.open_paused("sup", "old plan").await;

    let (mut new, request) = app.open_paused("sup", "new plan").await;
    let last = old.finish().await;

    assert_eq!(reason(&last), "superseded");
    assert!(!old.types().contains(&ChunkType::ToolOutput));
    assert_eq!(request.sequence, 2, "the new run numbers from 1");
    let (status, _) = app.reply("sup", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    let done = new.finish().await;
    assert_eq!(done.chunk_type, ChunkType::Completion);
    assert!(done.chunk.contains('1'), "the new plan ran: {done:?}");
    app.registry_drains().await;
}

#[tokio::test]
async fn a_new_message_while_a_run_streams_gets_409_session_busy() {
    let app =
        spawn_app_with(|s| s.engines.step_delay = std::time::Duration::from_millis(10_000)).await;
    let mut running = app.open("busy", "why?").await;
    running.next_chunk().await.unwrap();

    let (status, chunk) = crate::helpers::one_chunk(app.chat("busy", "another").await).await;

    assert_eq!(status, 409);
    assert_eq!(error_type(&chunk), "session_busy");
    assert_eq!(
        app.manager.active_runs(),
        1,
        "the streaming run is untouched"
    );
}

#[tokio::test]
async fn a_new_message_right_after_the_final_chunk_starts_a_new_run() {
    let app = spawn_app().await;
    for i in 0..20 {
        let mut stream = app.open("again", &format!("question {i}?")).await;
        assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    }
}

#[tokio::test]
async fn a_client_that_goes_away_during_a_pause_leaves_the_pause_to_its_decision() {
    let app = spawn_app_with(|s| {
        s.server.keep_alive = std::time::Duration::from_millis(200);
        s.pauses.detach_grace = std::time::Duration::from_secs(0);
    })
    .await;
    let (stream, request) = app.open_paused("gone", "wait").await;

    drop(stream);
    app.eventually("the run is detached", |app| app.logs.detached() == 1)
        .await;
    tokio::time::sleep(std::time::Duration::from_millis(300)).await; // past the grace (0)
    let still_paused = app.manager.paused_runs();
    let mut back = EventStream::resumed(
        app.reattach("gone", request.sequence).await,
        request.sequence,
    );
    let (status, _) = app.reply("gone", "CONFIRM_ACTION:confirm").await;
    let last = back.finish().await;

    assert_eq!(
        still_paused, 1,
        "a pause waits for its decision, not its client"
    );
    assert_eq!(status, 200);
    assert_eq!(
        last.chunk_type,
        ChunkType::Completion,
        "the decided work ran"
    );
    app.registry_drains().await;
}

#[tokio::test]
async fn shutdown_ends_every_open_stream_with_a_final_chunk() {
    let app =
        spawn_app_with(|s| s.engines.step_delay = std::time::Duration::from_millis(10_000)).await;
    let (mut paused, _) = app.open_paused("p", "wait here").await;
    let mut streaming = app.open("s", "tell me more?").await;
    streaming.next_chunk().await.unwrap();

    app.shutdown.cancel();
    let paused_last = paused.finish().await;
    let streaming_last = streaming.finish().await;

    assert_eq!(reason(&paused_last), "shutdown");
    assert_eq!(reason(&streaming_last), "shutdown");
    let served = tokio::time::timeout(WAIT, app.server)
        .await
        .expect("server stops");
    served.unwrap().unwrap();
    assert_eq!(app.manager.active_runs(), 0);
}

#[tokio::test]
async fn sigterm_to_the_binary_ends_streams_with_shutdown_and_exits() {
    let (mut child, address, _) = start_binary(&["--bind", "127.0.0.1:0"]);
    let client = reqwest::Client::new();
    let url = format!("http://{address}/api/v1/chat/stream");
    let response = client
        .post(&url)
        .json(&serde_json::json!({"message": "hold on", "session_id": "bin"}))
        .send()
        .await
        .unwrap();
    let mut stream = EventStream::new(response);
    stream.until(ChunkType::ConfirmationRequest).await;

    let killed = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let last = stream.finish().await;

    assert_eq!(reason(&last), "shutdown");
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "exits after SIGTERM");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(status.success(), "{status:?}");
}

#[tokio::test]
async fn binding_beyond_loopback_without_keys_logs_a_warning() {
    // Only binds; no traffic goes anywhere but the process itself.
    let (mut open, _, open_log) = start_binary(&["--bind", "0.0.0.0:0"]);
    let (mut keyed, _, keyed_log) = start_binary(&["--bind", "0.0.0.0:0", "--api-key", "k"]);
    let (mut local, _, local_log) = start_binary(&["--bind", "127.0.0.1:0"]);
    for child in [&mut open, &mut keyed, &mut local] {
        child.kill().ok();
        child.wait().ok();
    }

    let warned = |log: &[String]| {
        log.iter()
            .any(|l| l.contains("WARN") && l.contains("without API keys"))
    };
    assert!(warned(&open_log), "{open_log:#?}");
    assert!(!warned(&keyed_log), "{keyed_log:#?}");
    assert!(!warned(&local_log), "{local_log:#?}");
}

/// Starts the real `chatgate` binary with `args`; returns it, its address,
/// and the log lines up to the one that names the address.
fn start_binary(args: &[&str]) -> (std::process::Child, String, Vec<String>) {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
        .args(args)
        .args(["--workers", "1"])
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("binary starts");
    let stderr = child.stderr.take().unwrap();
    let mut lines = BufReader::new(stderr).lines();
    let mut seen = Vec::new();
    let address = loop {
        let line = lines.next().expect("the binary logs its address").unwrap();
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
        seen.push(line);
    };
    // Keep draining stderr so the child never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    (child, address, seen)
}
