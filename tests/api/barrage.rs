//! Hostile input: a bounded barrage of bad requests while a control client
//! runs confirm flows. Every bad request gets its documented refusal as one
//! well-formed error chunk; every control flow completes; nothing leaks.

use std::sync::atomic::{AtomicBool, Ordering};

use chatgate::protocol::ChunkType;
use futures_util::future::join_all;
use serde_json::json;

use crate::helpers::{one_chunk, spawn_app_with};

/// (what, content type, body, expected status, expected error_type)
fn cases() -> Vec<(&'static str, &'static str, Vec<u8>, u16, &'static str)> {
    let json = "application/json";
    let body = |v: serde_json::Value| v.to_string().into_bytes();
    let mut invalid_utf8 = b"{\"message\":\"".to_vec();
    invalid_utf8.extend_from_slice(&[0xc3, 0x28, 0xff]);
    invalid_utf8.extend_from_slice(b"\"}");
    let mut cases = vec![
        ("empty body", json, vec![], 400, "invalid_request"),
        (
            "truncated JSON",
            json,
            b"{\"message\": \"hi".to_vec(),
            400,
            "invalid_request",
        ),
        ("only a brace", json, b"{".to_vec(), 400, "invalid_request"),
        ("null", json, b"null".to_vec(), 400, "invalid_request"),
        (
            "a string",
            json,
            b"\"hello\"".to_vec(),
            400,
            "invalid_request",
        ),
        (
            "an array",
            json,
            b"[{\"message\":\"hi\"}]".to_vec(),
            400,
            "invalid_request",
        ),
        (
            "message is an array",
            json,
            body(json!({"message": ["a"]})),
            400,
            "invalid_request",
        ),
        (
            "message is an object",
            json,
            body(json!({"message": {"a": 1}})),
            400,
            "invalid_request",
        ),
        (
            "message is a bool",
            json,
            body(json!({"message": true})),
            400,
            "invalid_request",
        ),
        (
            "confirmation_id is a number",
            json,
            body(json!({"message": "CONFIRM_ACTION:confirm", "confirmation_id": 5})),
            400,
            "invalid_request",
        ),
        ("invalid UTF-8", json, invalid_utf8, 400, "invalid_request"),
        (
            "1 MiB body",
            json,
            body(json!({"message": "x".repeat(1 << 20)})),
            413,
            "payload_too_large",
        ),
        (
            "10k-character session id",
            json,
            body(json!({"message": "hi", "session_id": "s".repeat(10_000)})),
            400,
            "invalid_request",
        ),
        (
            "control characters in the session id",
            json,
            body(json!({"message": "hi", "session_id": "a\u{0}b\nc"})),
            400,
            "invalid_request",
        ),
        (
            "SSE framing in the session id",
            json,
            body(json!({"message": "hi", "session_id": "x\n\ndata: {}"})),
            400,
            "invalid_request",
        ),
        (
            "text/plain",
            "text/plain",
            body(json!({"message": "hi"})),
            415,
            "unsupported_media_type",
        ),
        (
            "form",
            "application/x-www-form-urlencoded",
            b"message=hi".to_vec(),
            415,
            "unsupported_media_type",
        ),
        (
            "multipart",
            "multipart/form-data; boundary=x",
            b"--x--".to_vec(),
            415,
            "unsupported_media_type",
        ),
    ];
    // Every CONFIRM_ACTION variant, on sessions that have no run.
    for (message, status, error_type) in [
        ("CONFIRM_ACTION", 422, "invalid_confirm_action"),
        ("CONFIRM_ACTION:", 422, "invalid_confirm_action"),
        ("CONFIRM_ACTION::", 422, "invalid_confirm_action"),
        ("CONFIRM_ACTION:\t\n", 422, "invalid_confirm_action"),
        ("CONFIRM_ACTION confirm", 422, "invalid_confirm_action"),
        ("CONFIRM_ACTION\u{0}:confirm", 422, "invalid_confirm_action"),
        ("CONFIRM_ACTION:confirm", 404, "no_pending_confirmation"),
        (
            "CONFIRM_ACTION:CONFIRM:extra:text",
            404,
            "no_pending_confirmation",
        ),
        (
            "CONFIRM_ACTION:modify:\n\ndata: {\"finished\":true}\n\n",
            404,
            "no_pending_confirmation",
        ),
        (
            "CONFIRM_ACTION:cancel:\u{2028}\u{0}\u{7f}",
            404,
            "no_pending_confirmation",
        ),
        ("CONFIRM_ACTION:rm -rf /", 404, "no_pending_confirmation"),
        ("CONFIRM_ACTION:💣", 404, "no_pending_confirmation"),
    ] {
        cases.push((
            "CONFIRM_ACTION variant",
            json,
            body(json!({"message": message, "session_id": "nobody"})),
            status,
            error_type,
        ));
    }
    cases
}

#[tokio::test]
async fn a_barrage_of_bad_input_is_refused_while_confirm_flows_complete() {
    let app = spawn_app_with(|_| {}).await;
    let done = AtomicBool::new(false);

    let control = async {
        let mut completed = 0;
        for i in 0..30 {
            let session = format!("control-{i}");
            let (mut stream, _) = app.open_paused(&session, "step one; step two").await;
            let (status, _) = app.reply(&session, "CONFIRM_ACTION:confirm").await;
            assert_eq!(status, 200);
            assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
            completed += 1;
        }
        done.store(true, Ordering::Relaxed);
        completed
    };
    let barrage = async {
        let cases = cases();
        let mut sent = 0;
        // Bounded: at most 20 passes over the cases, 8 at a time.
        for _ in 0..20 {
            for batch in cases.chunks(8) {
                let requests =
                    batch
                        .iter()
                        .map(|(what, content_type, body, status, error_type)| {
                            let request = app
                                .client
                                .post(app.url())
                                .header("Content-Type", *content_type)
                                .body(body.clone());
                            async move {
                                let (got, chunk) = one_chunk(request.send().await.unwrap()).await;
                                assert_eq!(got.as_u16(), *status, "{what}");
                                assert_eq!(chunk.metadata["error_type"], *error_type, "{what}");
                                assert_eq!(chunk.chunk_type, ChunkType::Error, "{what}");
                            }
                        });
                join_all(requests).await;
                sent += batch.len();
            }
            if done.load(Ordering::Relaxed) {
                break;
            }
        }
        sent
    };
    let (completed, sent) = tokio::join!(control, barrage);

    assert_eq!(completed, 30, "every control flow completed");
    assert!(sent >= cases().len(), "the barrage ran");
    app.registry_drains().await;
}
