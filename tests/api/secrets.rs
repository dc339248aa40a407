//! Secrets a URL carries (a password, a `?token=`) never reach a log line
//! or a start error, against the real binary: a failing webhook, an MCP
//! server's `url`. (An http tool's URL and the client: `tools.rs`.)

use std::time::Duration;

use serde_json::json;

use crate::common::start_binary;
use crate::durable::{open_paused, reply};
use crate::helpers::{free_port, WAIT};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_url_s_password_and_token_never_reach_the_log() {
    let port = free_port();
    let hook = format!("http://user:pw-s3cret@127.0.0.1:{port}/hook?token=t0ken-s3cret");
    let server = start_binary(&[
        "--step-delay",
        "0",
        "--webhook",
        &hook,
        "--webhook-secret",
        "a-webhook-secret-of-some-length",
        "--webhook-retry-for",
        "1s",
    ]);
    let url = format!("{}/api/v1/chat/stream", server.url);
    let reading = open_paused(&url, json!({"message": "build", "session_id": "s"})).await;
    assert_eq!(reply(&url, "s", "CONFIRM_ACTION:confirm").await.0, 200);
    reading.finish().await;

    // Each event fails (cannot connect), is retried, and is dropped after
    // the 1 s window: both kinds of line are written.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let logs = server.logs.lock().unwrap().clone();
        if logs.iter().any(|l| l.contains("dropped after")) {
            let all = logs.join("\n");
            assert!(!all.contains("s3cret"), "{all}");
            assert!(
                all.contains(&format!("to http://127.0.0.1:{port}:")),
                "{all}"
            );
            assert!(all.to_lowercase().contains("refused"), "{all}");
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{logs:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[test]
fn an_mcp_server_url_s_secrets_are_not_in_its_start_error() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    for (url, says) in [
        (
            format!("http://user:pw-s3cret@127.0.0.1:{port}/mcp?token=t0ken-s3cret"),
            format!("http://127.0.0.1:{port}"),
        ),
        (
            "ftp://user:pw-s3cret@example.com/?token=t0ken-s3cret".to_owned(),
            "ftp://example.com is not an http(s) URL".to_owned(),
        ),
    ] {
        let path = dir.path().join("mcp.toml");
        std::fs::write(&path, format!("[[mcp]]\nname = \"far\"\nurl = \"{url}\"\n")).unwrap();
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
            .args(["--bind", "127.0.0.1:0", "--tools"])
            .arg(&path)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("mcp \"far\""), "{stderr}");
        assert!(!stderr.contains("s3cret"), "{stderr}");
        assert!(stderr.contains(&says), "{stderr}");
    }
}
