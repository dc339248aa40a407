//! Access: API keys, ownership of runs, browser origins, slow clients.

use std::time::Duration;

use chatgate::protocol::ChunkType;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{error_type, one_chunk, spawn_app_with, EventStream, TestApp, WAIT};

pub(crate) async fn post_as(
    app: &TestApp,
    key: Option<&str>,
    session: &str,
    message: &str,
) -> reqwest::Response {
    let mut request = app
        .client
        .post(app.url())
        .json(&json!({ "message": message, "session_id": session }));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    request.send().await.unwrap()
}

#[tokio::test]
async fn with_keys_a_request_without_a_valid_key_gets_401() {
    let app = spawn_app_with(|s| s.server.api_keys = vec!["alpha".into()]).await;

    for key in [None, Some("wrong")] {
        let response = post_as(&app, key, "s", "hello?").await;
        let challenge = response.headers().get("www-authenticate").cloned();
        let (status, chunk) = one_chunk(response).await;
        assert_eq!(status, 401, "{key:?}");
        assert_eq!(error_type(&chunk), "unauthorized");
        assert_eq!(challenge.unwrap(), "Bearer");
    }
    let response = post_as(&app, Some("alpha"), "s", "hello?").await;
    assert_eq!(response.status(), 200);
    assert_eq!(
        EventStream::new(response).finish().await.chunk_type,
        ChunkType::Completion
    );
}

#[tokio::test]
async fn another_key_cannot_see_decide_or_supersede_a_run() {
    let app = spawn_app_with(|s| s.server.api_keys = vec!["alice".into(), "bob".into()]).await;
    let mut alice_run =
        EventStream::new(post_as(&app, Some("alice"), "shared", "pay the bill").await);
    alice_run.until(ChunkType::ConfirmationRequest).await;

    let (bob_reply, bob_chunk) =
        one_chunk(post_as(&app, Some("bob"), "shared", "CONFIRM_ACTION:confirm").await).await;
    let (unknown_reply, unknown_chunk) =
        one_chunk(post_as(&app, Some("bob"), "never-used", "CONFIRM_ACTION:confirm").await).await;
    let mut bob_run = EventStream::new(post_as(&app, Some("bob"), "shared", "my own task").await);
    bob_run.until(ChunkType::ConfirmationRequest).await;

    assert_eq!((bob_reply.as_u16(), unknown_reply.as_u16()), (404, 404));
    assert_eq!(
        bob_chunk.chunk, unknown_chunk.chunk,
        "the same answer: no oracle"
    );
    assert_eq!(error_type(&bob_chunk), error_type(&unknown_chunk));
    assert_eq!(
        app.manager.paused_runs(),
        2,
        "bob's run lives beside alice's"
    );
    let (status, _) =
        one_chunk(post_as(&app, Some("alice"), "shared", "CONFIRM_ACTION:confirm").await).await;
    assert_eq!(status, 200);
    assert_eq!(alice_run.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn another_key_cannot_re_attach_to_a_run() {
    let app = spawn_app_with(|s| s.server.api_keys = vec!["alice".into(), "bob".into()]).await;
    let mut alice_run =
        EventStream::new(post_as(&app, Some("alice"), "mine", "pay the bill").await);
    alice_run.until(ChunkType::ConfirmationRequest).await;

    let reattach_as = |key: &'static str, session: &'static str| {
        app.client
            .post(app.url())
            .bearer_auth(key)
            .header("Last-Event-ID", "0")
            .json(&json!({ "session_id": session }))
            .send()
    };
    let (theirs, their_chunk) = one_chunk(reattach_as("bob", "mine").await.unwrap()).await;
    let (unknown, unknown_chunk) = one_chunk(reattach_as("bob", "nobody").await.unwrap()).await;

    assert_eq!((theirs.as_u16(), unknown.as_u16()), (404, 404));
    assert_eq!(error_type(&their_chunk), "no_such_run");
    assert_eq!(their_chunk.chunk, unknown_chunk.chunk, "no oracle");
    assert_eq!(app.manager.paused_runs(), 1, "alice's run is untouched");
    let (status, _) =
        one_chunk(post_as(&app, Some("alice"), "mine", "CONFIRM_ACTION:confirm").await).await;
    assert_eq!(status, 200);
    assert_eq!(alice_run.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn keys_can_come_from_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, "# team keys\n\nfrom-file\n").unwrap();
    let app = spawn_app_with(|s| s.server.api_keys_file = Some(path.clone())).await;

    let denied = post_as(&app, None, "s", "hi?").await.status();
    let allowed = post_as(&app, Some("from-file"), "s", "hi?").await.status();

    assert_eq!((denied.as_u16(), allowed.as_u16()), (401, 200));
}

async fn browser_post(app: &TestApp, origin: &str) -> reqwest::Response {
    app.client
        .post(app.url())
        .header("Origin", origin)
        .header("Sec-Fetch-Site", "cross-site")
        .json(&json!({ "message": "hi?" }))
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn cross_site_browser_requests_need_an_allowed_origin() {
    let app = spawn_app_with(|s| s.server.cors_origins = vec!["https://app.example".into()]).await;

    let allowed = browser_post(&app, "https://app.example").await;
    let allow_origin = allowed
        .headers()
        .get("access-control-allow-origin")
        .cloned();
    let refused = browser_post(&app, "https://evil.example").await;
    let refused_allow = refused
        .headers()
        .get("access-control-allow-origin")
        .cloned();
    let (status, chunk) = one_chunk(refused).await;

    assert_eq!(allowed.status(), 200);
    assert_eq!(allow_origin.unwrap(), "https://app.example");
    assert_eq!(status, 403);
    assert_eq!(error_type(&chunk), "forbidden_origin");
    assert!(refused_allow.is_none());
}

#[tokio::test]
async fn preflight_is_answered_for_allowed_origins_only() {
    let app = spawn_app_with(|s| s.server.cors_origins = vec!["https://app.example".into()]).await;
    let preflight = |origin: &'static str| {
        app.client
            .request(reqwest::Method::OPTIONS, app.url())
            .header("Origin", origin)
            .header("Access-Control-Request-Method", "POST")
            .send()
    };

    let allowed = preflight("https://app.example").await.unwrap();
    let refused = preflight("https://evil.example").await.unwrap();

    assert_eq!(allowed.status(), 204);
    assert_eq!(
        allowed.headers()["access-control-allow-origin"],
        "https://app.example"
    );
    assert!(allowed.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .contains("Authorization"));
    assert_eq!(refused.status(), 403);
    assert!(refused
        .headers()
        .get("access-control-allow-origin")
        .is_none());
}

#[tokio::test]
async fn a_slow_partial_request_head_is_cut() {
    let app =
        spawn_app_with(|s| s.server.request_timeout = std::time::Duration::from_millis(400)).await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    socket
        .write_all(b"POST /api/v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        .await
        .unwrap();

    let mut answer = Vec::new();
    let read = tokio::time::timeout(WAIT, socket.read_to_end(&mut answer)).await;

    assert!(read.is_ok(), "the server closes the connection by itself");
    let text = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
}

#[tokio::test]
async fn a_body_that_trickles_in_too_slowly_gets_408() {
    let app =
        spawn_app_with(|s| s.server.request_timeout = std::time::Duration::from_millis(400)).await;
    let address = app.address.trim_start_matches("http://").to_owned();
    let mut socket = tokio::net::TcpStream::connect(&address).await.unwrap();
    socket
        .write_all(b"POST /api/v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"message\":")
        .await
        .unwrap();

    let mut answer = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 4096];
        loop {
            let n = socket.read(&mut buf).await.unwrap_or(0);
            answer.extend_from_slice(&buf[..n]);
            if n == 0 || answer.windows(4).any(|w| w == b"}\n\n\n" || w == b"}\n\n") {
                break;
            }
        }
    })
    .await;

    assert!(read.is_ok(), "answered within the wait");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        text.contains("\"error_type\":\"request_timeout\""),
        "{text}"
    );
}

#[tokio::test]
async fn a_client_posing_as_a_replica_is_refused_by_a_server_that_is_not_one() {
    let app = spawn_app_with(|_| {}).await;

    let response = app
        .client
        .post(app.url())
        .header("X-Chatgate-Cluster-Secret", "any secret at all, 16+")
        .json(&json!({ "message": "hello?", "session_id": "posing" }))
        .send()
        .await
        .unwrap();
    let (status, chunk) = one_chunk(response).await;

    assert_eq!(status, 403);
    assert_eq!(error_type(&chunk), "forbidden_replica");
    assert_eq!(app.manager.active_runs(), 0, "nothing started");
}
