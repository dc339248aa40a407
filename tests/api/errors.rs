//! Bad input: every refusal is a one-chunk stream with status and error_type.

use chatgate::protocol::ChunkType;
use serde_json::json;

use crate::helpers::{error_type, one_chunk, spawn_app};

#[tokio::test]
async fn invalid_requests_get_400_invalid_request() {
    let app = spawn_app().await;
    let long_message = "x".repeat(32 * 1024 + 1);
    let cases: Vec<(&str, String)> = vec![
        ("malformed JSON", "{\"message\": ".to_owned()),
        ("not an object", "[1, 2]".to_owned()),
        ("missing message", json!({"session_id": "s"}).to_string()),
        ("null message", json!({"message": null}).to_string()),
        ("message is a number", json!({"message": 5}).to_string()),
        ("empty message", json!({"message": ""}).to_string()),
        ("blank message", json!({"message": " \n\t "}).to_string()),
        (
            "message over 32 KiB",
            json!({"message": long_message}).to_string(),
        ),
        (
            "empty session_id",
            json!({"message": "hi", "session_id": ""}).to_string(),
        ),
        (
            "session_id with a control character",
            json!({"message": "hi", "session_id": "a\nb"}).to_string(),
        ),
        (
            "session_id over 128",
            json!({"message": "hi", "session_id": "s".repeat(129)}).to_string(),
        ),
        (
            "session_id is a number",
            json!({"message": "hi", "session_id": 7}).to_string(),
        ),
    ];

    for (case, body) in cases {
        let response = app.post_raw(Some("application/json"), body).await;
        let (status, chunk) = one_chunk(response).await;
        assert_eq!(status, 400, "{case}");
        assert_eq!(error_type(&chunk), "invalid_request", "{case}");
        assert!(!chunk.chunk.is_empty(), "{case}: says why");
    }
    assert_eq!(
        app.manager.active_runs(),
        0,
        "no refused request started a run"
    );
}

#[tokio::test]
async fn any_text_is_a_session_id_and_comes_back_escaped() {
    let app = spawn_app().await;
    for session in [
        "user@example.com",
        "会话1",
        "my session",
        "quote\" and </script>",
    ] {
        let mut stream = app.open(session, "hello?").await;
        let last = stream.finish().await;
        assert_eq!(last.session_id, session);
        assert!(stream.chunks.iter().all(|c| c.session_id == session));
    }
}

#[tokio::test]
async fn invalid_utf8_is_400() {
    let app = spawn_app().await;
    let mut body = b"{\"message\": \"".to_vec();
    body.extend_from_slice(&[0xff, 0xfe]);
    body.extend_from_slice(b"\"}");

    let response = app.post_raw(Some("application/json"), body).await;
    let (status, chunk) = one_chunk(response).await;

    assert_eq!(status, 400);
    assert_eq!(error_type(&chunk), "invalid_request");
}

#[tokio::test]
async fn a_message_of_exactly_32_kib_is_accepted() {
    let app = spawn_app().await;

    let response = app.chat("big", &"y".repeat(32 * 1024)).await;

    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn a_body_over_64_kib_gets_413() {
    let app = spawn_app().await;
    let body = json!({ "message": "x".repeat(70 * 1024) }).to_string();

    let response = app.post_raw(Some("application/json"), body).await;
    let (status, chunk) = one_chunk(response).await;

    assert_eq!(status, 413);
    assert_eq!(error_type(&chunk), "payload_too_large");
}

#[tokio::test]
async fn a_chunked_body_over_64_kib_gets_413() {
    let app = spawn_app().await;
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        (0..20).map(|_| Ok(vec![b' '; 4096])).collect();

    let response = app
        .post_raw(
            Some("application/json"),
            reqwest::Body::wrap_stream(futures_util::stream::iter(pieces)),
        )
        .await;
    let (status, chunk) = one_chunk(response).await;

    assert_eq!(status, 413);
    assert_eq!(error_type(&chunk), "payload_too_large");
}

#[tokio::test]
async fn a_body_that_is_not_json_gets_415() {
    let app = spawn_app().await;
    let cases = [
        None,
        Some("text/plain"),
        Some("application/x-www-form-urlencoded"),
        Some("application/jsonx"),
    ];

    for content_type in cases {
        let response = app.post_raw(content_type, r#"{"message":"hi"}"#).await;
        let (status, chunk) = one_chunk(response).await;
        assert_eq!(status, 415, "{content_type:?}");
        assert_eq!(error_type(&chunk), "unsupported_media_type");
        let sent = content_type.map_or("none".to_owned(), |t| format!("`{t}`"));
        assert!(chunk.chunk.ends_with(&sent), "{}", chunk.chunk);
    }
}

#[tokio::test]
async fn json_with_a_charset_parameter_is_accepted() {
    let app = spawn_app().await;

    let response = app
        .post_raw(
            Some("Application/JSON; charset=utf-8"),
            r#"{"message":"hi?"}"#,
        )
        .await;

    assert_eq!(response.status(), 200);
    let mut stream = crate::helpers::EventStream::new(response);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}
