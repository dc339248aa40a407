//! The `openai` engine against a hostile model server: whatever it sends,
//! chatgate holds a bounded amount of it, ends the run with the documented
//! error, and `/healthz` stays responsive meanwhile. Every hostile body is
//! endless or huge on the server's side and stops when chatgate stops
//! reading, so each test is bounded in time and memory by chatgate's bounds.

use std::time::{Duration, Instant};

use chatgate::engine::openai::conversations::MAX_CONVERSATION_BYTES;
use chatgate::engine::openai::upstream::MAX_LINE_BYTES;
use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use futures_util::StreamExt;

use crate::helpers::{error_type, reason, TestApp, WAIT};
use crate::model_server::{content, endless, event, fake_model, plan_call, tokens, Answer};
use crate::openai::{app_with_engine_config, app_with_model};

fn rss_kib() -> u64 {
    crate::common::rss_kib("self")
}

/// The 99th percentile of `/healthz` latencies sampled until `done` ends.
async fn health_p99_while(app: &TestApp, done: impl std::future::Future<Output = ()>) -> Duration {
    let client = reqwest::Client::new();
    let url = format!("{}/healthz", app.address);
    tokio::pin!(done);
    let mut samples = Vec::new();
    let started = Instant::now();
    assert_eq!(client.get(&url).send().await.unwrap().status(), 200);
    samples.push(started.elapsed());
    loop {
        let started = Instant::now();
        tokio::select! {
            () = &mut done => break,
            response = client.get(&url).send() => {
                assert_eq!(response.unwrap().status(), 200);
                samples.push(started.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(!samples.is_empty(), "no /healthz sample");
    samples.sort();
    samples[(samples.len() * 99 / 100).min(samples.len() - 1)]
}

/// Runs one chat turn against the model and returns its final chunk, with
/// the `/healthz` p99 measured meanwhile.
async fn final_chunk_and_health(app: &TestApp, message: &str) -> (ChunkType, Value, Duration) {
    let mut stream = app.open("hostile", message).await;
    let mut last = None;
    let p99 = health_p99_while(app, async {
        last = Some(
            tokio::time::timeout(WAIT, stream.finish())
                .await
                .expect("the run ends"),
        );
    })
    .await;
    let last = last.unwrap();
    (last.chunk_type, Value::Object(last.metadata.clone()), p99)
}

const GENEROUS_P99: Duration = Duration::from_secs(1);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_tool_call_index_ends_the_run_with_engine_limit_and_allocates_nothing() {
    let call = json!({"choices": [{"delta": {"tool_calls": [
        {"index": 500_000, "id": "c", "function": {"name": "propose_plan", "arguments": "{}"}}]}}]});
    let model = fake_model(vec![format!("{}data: [DONE]\n\n", event(&call))]).await;
    let app = app_with_model(&model.url, |_| {}).await;
    let before = rss_kib();

    let (kind, metadata, p99) = final_chunk_and_health(&app, "go").await;

    assert_eq!(kind, ChunkType::Error);
    assert_eq!(metadata["error_type"], "engine_limit");
    assert!(rss_kib() < before + 50_000, "no index-sized allocation");
    assert!(p99 < GENEROUS_P99, "/healthz p99 {p99:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_error_body_is_read_only_a_few_kib() {
    let body = endless(
        "",
        b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        Duration::ZERO,
    );
    let model = fake_model(vec![Answer::Stream(500, body)]).await;
    let app = app_with_model(&model.url, |_| {}).await;
    let before = rss_kib();

    let (kind, metadata, p99) = final_chunk_and_health(&app, "go").await;

    assert_eq!(kind, ChunkType::Error);
    assert_eq!(metadata["error_type"], "engine_unavailable");
    assert!(rss_kib() < before + 50_000);
    assert!(p99 < GENEROUS_P99, "/healthz p99 {p99:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_line_is_cut_at_the_line_bound_and_health_stays_responsive() {
    let body = endless(
        "data: {\"choices\":[{\"delta\":{\"content\":\"",
        &[b'a'; 16 * 1024],
        Duration::ZERO,
    );
    let model = fake_model(vec![Answer::Stream(200, body)]).await;
    let app = app_with_model(&model.url, |_| {}).await;
    let before = rss_kib();

    let (kind, metadata, p99) = final_chunk_and_health(&app, "go").await;

    assert_eq!(kind, ChunkType::Error);
    assert_eq!(metadata["error_type"], "engine_limit");
    assert!(rss_kib() < before + 50_000);
    assert!(p99 < GENEROUS_P99, "/healthz p99 {p99:?}");
    println!("/healthz p99 while a {MAX_LINE_BYTES}-byte line was refused: {p99:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_of_large_events_is_parsed_off_the_http_workers() {
    // 200 KiB events (an ignored field), endless, as fast as chatgate reads:
    // the run keeps parsing until --llm-max-time, while /healthz is probed.
    static PIECE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let piece = PIECE.get_or_init(|| {
        event(&json!({"choices": [], "padding": "p".repeat(200 * 1024)})).into_bytes()
    });
    let model = fake_model(vec![Answer::Stream(
        200,
        endless("", piece, Duration::ZERO),
    )])
    .await;
    let (app, _) = app_with_engine_config(
        &model.url,
        |config| config.max_time = Duration::from_secs(2),
        |_| {},
    )
    .await;

    let (kind, metadata, p99) = final_chunk_and_health(&app, "go").await;

    assert_eq!(kind, ChunkType::Error);
    assert_eq!(metadata["error_type"], "engine_unavailable", "the deadline");
    assert!(p99 < GENEROUS_P99, "/healthz p99 {p99:?}");
    println!("/healthz p99 while parsing 200 KiB events for 2 s: {p99:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_utf8_ends_the_run_at_its_line() {
    // An invalid byte, then valid events for ever: the run must end at the
    // bad line, not buffer what follows.
    let invalid =
        futures_util::stream::iter([actix_web::web::Bytes::from_static(b"data: \xff\xfe\n\n")])
            .chain(endless("", b"data: {\"choices\":[]}\n\n", Duration::ZERO))
            .boxed();
    let model = fake_model(vec![Answer::Stream(200, invalid)]).await;
    let app = app_with_model(&model.url, |_| {}).await;

    let (kind, metadata, _) = final_chunk_and_health(&app, "go").await;

    assert_eq!(kind, ChunkType::Error);
    assert_eq!(metadata["error_type"], "engine_unavailable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endless_pings_end_at_the_model_call_deadline() {
    let pings = endless(
        &event(&content("hi")),
        b": ping\n\n",
        Duration::from_millis(50),
    );
    let model = fake_model(vec![Answer::Stream(200, pings)]).await;
    let (app, _) = app_with_engine_config(
        &model.url,
        |config| config.max_time = Duration::from_millis(1500),
        |_| {},
    )
    .await;
    let started = Instant::now();

    let mut stream = app.open("pings", "go").await;
    let last = stream.finish().await;

    assert_eq!(error_type(&last), "engine_unavailable");
    assert!(last.chunk.contains("--llm-max-time"), "{}", last.chunk);
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_longer_than_its_bound_ends_the_run_and_is_not_kept_whole() {
    let chunk = "w".repeat(8 * 1024);
    let long: String =
        (0..40).map(|_| event(&content(&chunk))).collect::<String>() + "data: [DONE]\n\n";
    let model = fake_model(vec![long, tokens(&["ok"])]).await;
    let app = app_with_model(&model.url, |_| {}).await;

    let first = app.open("long", "tell me everything").await.finish().await;
    let second = app.open("long", "and now?").await.finish().await;

    assert_eq!(error_type(&first), "engine_limit");
    assert_eq!(second.chunk_type, ChunkType::Completion);
    let next_request = model.requests()[1]["messages"].to_string();
    assert!(
        next_request.len() < MAX_CONVERSATION_BYTES + 16 * 1024,
        "history sent upstream is bounded: {} bytes",
        next_request.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_conversations_together_stay_within_their_memory() {
    let sessions = 40;
    let model = fake_model((0..sessions).map(|_| tokens(&["ok"])).collect::<Vec<_>>()).await;
    let (app, engine) = app_with_engine_config(
        &model.url,
        |config| config.conversation_memory = 512 * 1024,
        |_| {},
    )
    .await;
    let message = "m".repeat(30 * 1024);

    for i in 0..sessions {
        app.open(&format!("s{i}"), &message).await.finish().await;
    }

    let (kept, bytes) = engine.conversation_usage();
    assert!(bytes <= 512 * 1024, "{bytes} bytes kept");
    assert!(kept < sessions && kept > 0, "{kept} conversations kept");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_conversation_is_forgotten_after_its_ttl() {
    let model = fake_model(vec![tokens(&["Hi Ada."]), tokens(&["Who?"])]).await;
    let (app, _) = app_with_engine_config(
        &model.url,
        |config| config.conversation_ttl = Duration::from_millis(500),
        |_| {},
    )
    .await;

    app.open("ttl", "I am Ada").await.finish().await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    app.open("ttl", "what is my name?").await.finish().await;

    let messages = model.requests()[1]["messages"].as_array().unwrap().len();
    assert_eq!(messages, 2, "system and the new user message only");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_superseded_turn_and_its_successor_are_both_kept_in_order() {
    let plan = json!({"tasks": [{"description": "first plan"}]});
    let model = fake_model(vec![
        plan_call("call_a", &plan),
        tokens(&["answer B"]),
        tokens(&["answer C"]),
    ])
    .await;
    let app = app_with_model(&model.url, |_| {}).await;

    let (mut first, _) = app.open_paused("order", "message A").await;
    let second = app.open("order", "message B").await.finish().await;
    assert_eq!(reason(&first.finish().await), "superseded");
    assert_eq!(second.chunk_type, ChunkType::Completion);
    app.registry_drains().await;
    app.open("order", "message C").await.finish().await;

    let messages = model.requests()[2]["messages"].clone();
    let users: Vec<&str> = messages
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| m["content"].as_str().unwrap())
        .collect();
    assert_eq!(users, ["message A", "message B", "message C"]);
}

#[tokio::test]
async fn a_gap_is_announced_even_when_the_plan_is_nested_too_deep_to_re_parse() {
    // Deep enough that a chunk holding it cannot be parsed back (serde's
    // nesting limit), shallow enough for the engine to read the plan.
    let mut args = json!("leaf");
    for _ in 0..123 {
        args = json!([args]);
    }
    let plan = json!({"tasks": [{"description": "deep", "args": {"a": args}}]});
    // The plan comes after the client has gone: no reader can fall behind
    // the one-chunk buffer, and its text chunk is evicted by the request.
    let body = plan_call("deep", &plan);
    let late = futures_util::stream::once(async move {
        tokio::time::sleep(Duration::from_millis(500)).await;
        actix_web::web::Bytes::from(body)
    })
    .boxed();
    let model = fake_model(vec![Answer::Stream(200, late)]).await;
    let app = app_with_model(&model.url, |s| {
        s.limits.replay_buffer = 1;
        s.server.keep_alive = Duration::from_millis(100);
    })
    .await;
    drop(app.chat("deep", "do it").await);
    app.eventually("paused while detached", |app| {
        app.manager.paused_runs() == 1 && app.logs.detached() == 1
    })
    .await;

    let replay = app.reattach("deep", 0).await;
    let mut raw = Vec::new();
    let mut replayed = replay.bytes_stream();
    while !raw.windows(2).any(|w| w == b"\n\n") {
        let piece = tokio::time::timeout(WAIT, replayed.next())
            .await
            .expect("in time");
        raw.extend_from_slice(&piece.expect("more").expect("bytes"));
    }
    let first_event = String::from_utf8_lossy(&raw);

    assert!(first_event.contains("\"gap\":true"), "{:.300}", first_event);
    assert!(first_event.contains("confirmation_request"));
    let data = first_event
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap();
    assert!(
        serde_json::from_str::<chatgate::protocol::Chunk>(data).is_err(),
        "the case where re-parsing the frame would fail"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_server_that_accepts_but_never_answers_is_reported_as_a_timeout() {
    // Accepts connections and reads nothing, answers nothing.
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut sockets = Vec::new();
        while let Ok((socket, _)) = silent.accept().await {
            sockets.push(socket);
        }
    });
    let (app, _) = app_with_engine_config(
        &url,
        |config| config.timeout = Duration::from_millis(500),
        |_| {},
    )
    .await;

    let last = app.open("silent", "hello").await.finish().await;

    assert_eq!(error_type(&last), "engine_unavailable");
    assert!(
        last.chunk.contains("did not answer within"),
        "{}",
        last.chunk
    );
    assert!(!last.chunk.contains("cannot reach"), "{}", last.chunk);
    held.abort();
}
