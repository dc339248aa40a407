//! What a hostile client can make the server hold or do: each bound and
//! each timer's cause, over real sockets (the hardening issue).

use std::time::{Duration, Instant};

use chatgate::protocol::{ChunkType, MAX_MODIFY_TEXT_BYTES, MAX_PLAN_TASKS};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::helpers::{
    confirmation_id, error_type, one_chunk, reason, spawn_app_with, EventStream, TestApp,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

async fn connect(app: &TestApp) -> TcpStream {
    TcpStream::connect(app.address.trim_start_matches("http://"))
        .await
        .unwrap()
}

/// Reads until the server closes the connection (or `limit` passes: then
/// `None`); returns what was read.
async fn read_until_closed(socket: &mut TcpStream, limit: Duration) -> Option<Vec<u8>> {
    let mut seen = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match socket.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => seen.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    read.ok().map(|()| seen)
}

#[tokio::test]
async fn each_detach_grace_belongs_to_its_own_detach() {
    let app = spawn_app_with(|s| {
        s.server.keep_alive = ms(100);
        s.pauses.detach_grace = ms(3000);
    })
    .await;
    let (stream, request) = app.open_paused("grace", "one step").await;
    let started = Instant::now();

    drop(stream); // detach 1 at t=0: its grace would end at t=3
    app.eventually("detached", |app| app.logs.detached() == 1)
        .await;
    tokio::time::sleep(ms(500)).await;
    let back = EventStream::resumed(
        app.reattach("grace", request.sequence).await,
        request.sequence,
    );
    tokio::time::sleep(ms(1500)).await;
    drop(back); // detach 2 at t~2: its grace ends at t~5
    app.eventually("detached again", |app| app.logs.detached() == 1)
        .await;
    let until = started + ms(3600);
    tokio::time::sleep_until(until.into()).await;

    let (status, _) = app.reply("grace", "CONFIRM_ACTION:confirm").await;

    assert!(
        started.elapsed() < ms(4800),
        "checked before the second grace ends"
    );
    assert_eq!(status, 200, "the first detach's grace must not end the run");
    let mut tail = EventStream::resumed(
        app.reattach("grace", request.sequence).await,
        request.sequence,
    );
    assert_eq!(tail.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn a_reply_after_the_grace_still_decides_a_paused_run_whose_client_left() {
    let app = spawn_app_with(|s| {
        s.server.keep_alive = ms(100);
        s.pauses.detach_grace = ms(300);
    })
    .await;
    let (stream, _) = app.open_paused("late", "one step").await;
    drop(stream);
    app.eventually("the run is detached", |app| app.logs.detached() == 1)
        .await;
    tokio::time::sleep(ms(600)).await; // past the grace

    let (status, chunk) = app.reply("late", "CONFIRM_ACTION:confirm").await;

    assert_eq!(status, 200, "{chunk:?}");
    app.registry_drains().await;
}

#[tokio::test]
async fn a_second_request_head_dribbled_on_a_kept_alive_connection_is_cut() {
    let app = spawn_app_with(|s| s.server.request_timeout = ms(1000)).await;
    let mut socket = connect(&app).await;
    socket
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 256];
    let n = socket.read(&mut first).await.unwrap();
    assert!(first[..n].starts_with(b"HTTP/1.1 200"));
    let started = Instant::now();

    // One byte every 300 ms: each read resets no timer that matters.
    let dribble = async {
        for byte in b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1".iter() {
            if socket.write_all(&[*byte]).await.is_err() {
                return;
            }
            tokio::time::sleep(ms(300)).await;
        }
    };
    let _ = tokio::time::timeout(ms(6000), dribble).await;
    let closed = read_until_closed(&mut socket, ms(2000)).await;

    assert!(closed.is_some(), "the connection was closed");
    assert!(started.elapsed() < ms(8000));
}

#[tokio::test]
async fn a_body_answered_408_is_not_drained_the_connection_closes() {
    let app = spawn_app_with(|s| s.server.request_timeout = ms(800)).await;
    let mut socket = connect(&app).await;
    socket
        .write_all(
            b"POST /api/v1/chat/stream HTTP/1.1\r\nHost: 127.0.0.1\r\n\
              Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .await
        .unwrap();
    let started = Instant::now();

    // A chunk of one byte every 200 ms, for up to 8 s, while reading.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    let closed = loop {
        if started.elapsed() > ms(8000) {
            break false;
        }
        let _ = socket.write_all(b"1\r\n \r\n").await;
        match tokio::time::timeout(ms(200), socket.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => break true,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
            Err(_) => {}
        }
    };

    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "{text}"
    );
    assert!(
        closed,
        "the server closed the connection instead of draining"
    );
    assert!(started.elapsed() < ms(5000), "{:?}", started.elapsed());
}

#[tokio::test]
async fn an_unread_body_dribbled_after_a_response_is_cut_too() {
    let app = spawn_app_with(|s| s.server.request_timeout = ms(800)).await;
    let mut socket = connect(&app).await;
    socket
        .write_all(
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n\r\n",
        )
        .await
        .unwrap();
    let started = Instant::now();

    let dribble = async {
        loop {
            if socket.write_all(b"1\r\nx\r\n").await.is_err() {
                return;
            }
            tokio::time::sleep(ms(200)).await;
        }
    };
    let _ = tokio::time::timeout(ms(10_000), dribble).await;

    assert!(
        started.elapsed() < ms(9000),
        "cut after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn many_slow_connections_leave_health_answering_and_are_all_cut() {
    let app = spawn_app_with(|s| s.server.request_timeout = ms(500)).await;
    let mut slow = Vec::new();
    for _ in 0..100 {
        let mut socket = connect(&app).await;
        socket
            .write_all(b"GET /healthz HTTP/1.1\r\nHost: 127")
            .await
            .unwrap();
        slow.push(socket);
    }

    let health = tokio::time::timeout(
        ms(2000),
        app.client.get(format!("{}/healthz", app.address)).send(),
    )
    .await
    .expect("answered meanwhile")
    .unwrap();
    let cut = futures_util::future::join_all(
        slow.iter_mut()
            .map(|socket| read_until_closed(socket, ms(5000))),
    )
    .await;

    assert_eq!(health.status(), 200);
    assert!(
        cut.iter().all(Option::is_some),
        "every slow connection was closed"
    );
}

#[tokio::test]
async fn a_plan_with_too_many_tasks_ends_before_anything_is_asked() {
    let app = spawn_app_with(|_| {}).await;
    let message = vec!["a"; MAX_PLAN_TASKS + 1].join(";");

    let mut stream = app.open("big", &message).await;
    let last = stream.finish().await;

    assert_eq!(error_type(&last), "plan_too_large");
    assert!(!stream.types().contains(&ChunkType::ConfirmationRequest));
    assert_eq!(app.manager.paused_runs(), 0);
    let fits = vec!["a"; MAX_PLAN_TASKS].join(";");
    let (mut ok, _) = app.open_paused("fits", &fits).await;
    app.reply("fits", "CONFIRM_ACTION:cancel").await;
    assert_eq!(reason(&ok.finish().await), "user");
}

#[tokio::test]
async fn a_modify_text_over_its_bound_is_refused_and_the_pause_stays() {
    let app = spawn_app_with(|_| {}).await;
    let (mut stream, request) = app.open_paused("grow", "one step").await;
    let long = "x".repeat(MAX_MODIFY_TEXT_BYTES + 1);

    let (status, chunk) = app
        .reply("grow", &format!("CONFIRM_ACTION:modify:{long}"))
        .await;
    let (confirmed, _) = app.reply("grow", "CONFIRM_ACTION:confirm").await;

    assert_eq!(status, 422);
    assert_eq!(error_type(&chunk), "invalid_confirm_action");
    assert!(chunk.chunk.contains(&MAX_MODIFY_TEXT_BYTES.to_string()));
    assert_eq!(confirmed, 200, "the pause was untouched");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert!(confirmation_id(&request).len() > 10);
}

#[tokio::test]
async fn a_last_event_id_beyond_the_last_chunk_is_400_and_takes_nothing_over() {
    let app = spawn_app_with(|_| {}).await;
    let (mut stream, request) = app.open_paused("lei", "one step").await;

    for id in [u64::MAX, request.sequence + 1, 999] {
        let (status, chunk) = one_chunk(app.reattach("lei", id).await).await;
        assert_eq!(status, 400, "{id}");
        assert_eq!(error_type(&chunk), "invalid_request");
    }
    app.reply("lei", "CONFIRM_ACTION:confirm").await;

    let last = stream.finish().await;
    assert_eq!(
        last.chunk_type,
        ChunkType::Completion,
        "the real client kept its stream"
    );
}

#[tokio::test]
async fn one_api_key_cannot_lock_the_others_out() {
    let app = spawn_app_with(|s| {
        s.server.api_keys = vec!["a".into(), "b".into()];
        s.limits.max_runs = 8;
    })
    .await;
    let open = |key: &'static str, session: String| {
        let app = &app;
        async move {
            app.client
                .post(app.url())
                .bearer_auth(key)
                .json(&json!({ "message": "step", "session_id": session }))
                .send()
                .await
                .unwrap()
        }
    };
    let mut held = Vec::new();
    for i in 0..2 {
        let mut stream = EventStream::new(open("a", format!("a{i}")).await);
        stream.until(ChunkType::ConfirmationRequest).await;
        held.push(stream);
    }

    let refused = open("a", "a-more".into()).await;
    let retry_after = refused.headers().get("retry-after").cloned();
    let (status, chunk) = one_chunk(refused).await;
    let other = open("b", "b0".into()).await;

    assert_eq!(status, 503, "a quarter of --max-runs per key by default");
    assert_eq!(error_type(&chunk), "overloaded");
    assert!(
        chunk.chunk.contains("--max-runs-per-key"),
        "{}",
        chunk.chunk
    );
    assert!(retry_after.is_some());
    assert_eq!(other.status(), 200, "key b is not locked out");
}

#[tokio::test]
async fn a_foreign_host_name_is_refused_without_keys() {
    let app = spawn_app_with(|s| s.server.allowed_hosts = vec!["chat.example.com".into()]).await;
    let post = |host: &'static str| {
        let app = &app;
        async move {
            app.client
                .post(app.url())
                .header("host", host)
                .header("origin", format!("http://{host}"))
                .header("sec-fetch-site", "same-origin")
                .json(&json!({ "message": "rm -rf /; then confirm", "session_id": "rebind" }))
                .send()
                .await
                .unwrap()
        }
    };

    let (status, chunk) = one_chunk(post("rebind.attacker.example:8080").await).await;
    assert_eq!(status, 421);
    assert_eq!(error_type(&chunk), "forbidden_host");
    assert_eq!(app.manager.active_runs(), 0, "nothing started");
    for host in ["localhost:8080", "127.0.0.1", "chat.example.com"] {
        let response = post(host).await;
        assert_eq!(response.status(), 200, "{host}");
        let mut stream = EventStream::new(response);
        stream.until(ChunkType::ConfirmationRequest).await;
        app.reply("rebind", "CONFIRM_ACTION:cancel").await;
        stream.finish().await;
    }
}

#[tokio::test]
async fn with_keys_the_host_is_not_checked_and_the_scheme_is_case_insensitive() {
    let app = spawn_app_with(|s| s.server.api_keys = vec!["secret".into()]).await;

    let response = app
        .client
        .post(app.url())
        .header("host", "chat.internal.example")
        .header("authorization", "bearer secret")
        .json(&json!({ "message": "hello?", "session_id": "k" }))
        .send()
        .await
        .unwrap();

    assert_eq!(response.status(), 200);
    EventStream::new(response).finish().await;
}

#[test]
fn out_of_range_timing_flags_are_refused_at_start_with_a_clear_message() {
    for args in [
        ["--confirm-timeout-secs", "253402300800"],
        ["--confirm-timeout-secs", "18446744073709551615"],
        ["--confirm-timeout", "0s"],
        ["--keep-alive", "forever"],
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
            .args(["--bind", "127.0.0.1:0"])
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.contains(args[0].trim_end_matches("-secs")),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
