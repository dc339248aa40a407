//! Plain streaming: answers, framing, keep-alive, the first chunk.

use std::time::Duration;

use chatgate::protocol::ChunkType;
use serde_json::json;

use crate::helpers::{error_type, spawn_app, spawn_app_with, Event, EventStream};

#[tokio::test]
async fn a_question_streams_content_then_completion_without_confirmation() {
    let app = spawn_app().await;

    let mut stream = app.open("q1", "What can you do?").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    let types = stream.types();
    assert!(types.len() > 2, "{types:?}");
    assert!(types[..types.len() - 1]
        .iter()
        .all(|t| *t == ChunkType::Content));
    let text: String = stream.chunks[..types.len() - 1]
        .iter()
        .map(|c| c.chunk.as_str())
        .collect();
    assert!(text.contains("What can you do?"), "{text}");
    assert!(stream.chunks.iter().all(|c| c.session_id == "q1"));
    app.registry_drains().await;
}

#[tokio::test]
async fn a_missing_session_id_is_made_by_the_server_and_carried_by_every_chunk() {
    let app = spawn_app().await;

    let response = app.post_json(&json!({ "message": "hello?" })).await;
    let mut stream = EventStream::new(response);
    stream.finish().await;

    let session = stream.chunks[0].session_id.clone();
    assert!(uuid::Uuid::parse_str(&session).is_ok(), "{session}");
    assert!(stream.chunks.iter().all(|c| c.session_id == session));
}

#[tokio::test]
async fn unknown_fields_are_ignored() {
    let app = spawn_app().await;

    let response = app
        .post_json(
            &json!({ "message": "hi?", "session_id": "u", "stream": true, "extra": {"a": 1} }),
        )
        .await;

    assert_eq!(response.status(), 200);
    assert_eq!(
        EventStream::new(response).finish().await.chunk_type,
        ChunkType::Completion
    );
}

#[tokio::test]
async fn the_first_chunk_is_written_before_the_engine_s_first_delay() {
    // Each planner step waits a minute; the first chunk must not.
    let app =
        spawn_app_with(|s| s.engines.step_delay = std::time::Duration::from_millis(60_000)).await;

    let mut stream = app.open("first", "build it").await;
    let first = tokio::time::timeout(Duration::from_secs(10), stream.next_chunk())
        .await
        .expect("first chunk at once")
        .unwrap();

    assert_eq!(first.chunk_type, ChunkType::TaskInit);
    assert_eq!(first.sequence, 1);
}

#[tokio::test]
async fn keep_alive_comments_appear_while_paused() {
    let app = spawn_app_with(|s| s.server.keep_alive = std::time::Duration::from_millis(200)).await;
    let (mut stream, _) = app.open_paused("ka", "do the thing").await;

    let event = stream.next_event().await.expect("stream still open");

    assert_eq!(event, Event::Comment("keep-alive".to_owned()));
    // And the paused run is still there to be confirmed after the comment.
    let (status, _) = app.reply("ka", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn sse_sequences_in_the_message_come_out_escaped_inside_one_event() {
    let app = spawn_app().await;
    let hostile = "a\n\ndata: {\"finished\":true}\r\n\r\nid: 99\n: x\u{0}\u{7}?";

    let mut stream = app.open("inj", hostile).await;
    let last = stream.finish().await;

    // The reader asserts two lines per event and consecutive ids; the text
    // survives intact inside a JSON string.
    assert_eq!(last.chunk_type, ChunkType::Completion);
    let text: String = stream.chunks.iter().map(|c| c.chunk.as_str()).collect();
    assert!(text.contains(hostile), "{text:?}");
}

#[tokio::test]
async fn a_step_with_the_word_fail_ends_the_run_with_task_failed() {
    let app = spawn_app().await;
    let (mut stream, _) = app
        .open_paused("f", "prepare; this step will fail; never reached")
        .await;

    app.reply("f", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    assert_eq!(error_type(&last), "task_failed");
    let outputs: Vec<_> = stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::ToolOutput)
        .collect();
    assert_eq!(outputs.len(), 2, "the third step never runs");
    assert_eq!(outputs[0].metadata["ok"], true);
    assert_eq!(outputs[1].metadata["ok"], false);
    app.registry_drains().await;
}

#[tokio::test]
async fn health_endpoints_answer_200() {
    let app = spawn_app().await;
    for path in [
        "/healthz",
        "/health",
        "/health/",
        "/health/live",
        "/health/ready",
        "/readyz",
    ] {
        let (status, _) = app.get(path).await;
        assert_eq!(status, 200, "{path}");
    }
}

#[tokio::test]
async fn another_method_on_the_endpoint_is_405_and_another_path_a_json_404() {
    let app = spawn_app().await;

    let get = app.get_with("/api/v1/chat/stream", &[]).await;
    let allow = get.headers().get("allow").cloned();
    let (status, chunk) = crate::helpers::one_chunk(get).await;
    let (missing, body) = app.get("/api/v1/chat").await;

    assert_eq!(status, 405);
    assert_eq!(allow.unwrap(), "POST");
    assert_eq!(crate::helpers::error_type(&chunk), "method_not_allowed");
    assert_eq!(missing, 404);
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(json["error_type"], "not_found");
    assert!(json["error"]
        .as_str()
        .unwrap()
        .contains("POST /api/v1/chat/stream"));
}

#[tokio::test]
async fn the_chat_page_and_its_client_module_are_served() {
    let app = spawn_app().await;

    let page = app
        .client
        .get(format!("{}/", app.address))
        .send()
        .await
        .unwrap();
    let page_type = page.headers()["content-type"].to_str().unwrap().to_owned();
    let html = page.text().await.unwrap();
    let module = app
        .client
        .get(format!("{}/chatgate-client.mjs", app.address))
        .send()
        .await
        .unwrap();
    let module_type = module.headers()["content-type"]
        .to_str()
        .unwrap()
        .to_owned();
    let js = module.text().await.unwrap();

    assert_eq!(page_type, "text/html; charset=utf-8");
    assert!(html.contains("./chatgate-client.mjs"));
    assert_eq!(module_type, "text/javascript; charset=utf-8");
    assert!(js.contains("export class ChatGateClient"));
}

/// Pinned for clients that tell the kinds of pause apart (#16): a
/// confirmation's data says `"kind": "approval"` on the wire.
#[tokio::test]
async fn a_confirmation_request_says_its_kind_is_approval() {
    use futures_util::StreamExt;
    let app = spawn_app().await;
    let response = app.chat("kind", "one; two").await;
    let mut body = response.bytes_stream();
    let mut text = String::new();
    let event = loop {
        let piece = body.next().await.expect("open").expect("readable");
        text.push_str(&String::from_utf8_lossy(&piece));
        if let Some(at) = text.find("\"chunk_type\":\"confirmation_request\"") {
            if let Some(end) = text[at..].find("\n\n") {
                let start = text[..at].rfind("data: ").expect("a data line") + 6;
                break text[start..at + end].to_owned();
            }
        }
    };
    let chunk: serde_json::Value = serde_json::from_str(&event).unwrap();

    assert_eq!(chunk["confirmation_data"]["kind"], "approval");
    let (status, _) = app.reply("kind", "CONFIRM_ACTION:cancel").await;
    assert_eq!(status, 200);
}
