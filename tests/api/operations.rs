//! Operations: readiness, metrics, limits.

use std::sync::Arc;
use std::time::Duration;

use chatgate::protocol::ChunkType;
use chatgate::run::{Completion, Engine, RunContext, RunError};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::helpers::{error_type, one_chunk, spawn_app, spawn_app_with, spawn_app_with_engine};

/// Streams one chunk, then works for two seconds without watching for
/// shutdown: it keeps the server draining long enough to be observed.
struct SlowToStopEngine;

impl Engine for SlowToStopEngine {
    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>> {
        async move {
            ctx.emit(ChunkType::Status, "working").await?;
            tokio::time::sleep(Duration::from_secs(2)).await;
            Ok(Completion::default())
        }
        .boxed()
    }
}

#[tokio::test]
async fn readyz_turns_503_at_once_on_shutdown_and_new_runs_are_refused() {
    let app = spawn_app_with_engine(|_| {}, Arc::new(SlowToStopEngine)).await;
    let mut draining = app.open("held", "keep me busy").await;
    draining.next_chunk().await.unwrap();
    assert_eq!(app.get("/readyz").await.0, 200);

    app.shutdown.cancel();
    let (ready, _) = app.get("/readyz").await;
    let (alive, _) = app.get("/healthz").await;
    let response = app.chat("late", "hello?").await;
    let retry_after = response.headers().get("retry-after").cloned();
    let (status, chunk) = one_chunk(response).await;

    assert_eq!(ready, 503);
    assert_eq!(alive, 200, "alive while draining");
    assert_eq!(status, 503);
    assert_eq!(error_type(&chunk), "shutting_down");
    assert!(retry_after.is_some());
    assert!(draining.finish().await.finished);
}

#[tokio::test]
async fn metrics_count_decisions_errors_and_runs_without_session_ids() {
    let app =
        spawn_app_with(|s| s.pauses.confirm_timeout = std::time::Duration::from_millis(500)).await;
    let (mut confirmed, _) = app.open_paused("secret-session-1", "do a").await;
    app.reply("secret-session-1", "CONFIRM_ACTION:nope").await;
    app.reply("secret-session-1", "CONFIRM_ACTION:confirm")
        .await;
    confirmed.finish().await;
    let (mut timed_out, _) = app.open_paused("secret-session-2", "do b").await;
    timed_out.finish().await;
    let (_held, _) = app.open_paused("secret-session-3", "do c").await;

    let (status, text) = app.get("/metrics").await;

    assert_eq!(status, 200);
    for line in [
        r#"chatgate_confirmation_decisions_total{action="confirm",outcome="accepted"} 1"#,
        r#"chatgate_confirmation_decisions_total{action="timeout",outcome="accepted"} 1"#,
        r#"chatgate_confirmation_decisions_total{action="reply",outcome="refused"} 1"#,
        r#"chatgate_errors_total{error_type="invalid_confirm_action"} 1"#,
        "chatgate_paused_runs 1",
        "chatgate_active_runs 1",
        "chatgate_open_streams 1",
        "chatgate_confirmation_wait_seconds_count 2",
        "chatgate_time_to_first_chunk_seconds_count 3",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in\n{text}"
        );
    }
    assert!(!text.contains("secret-session"), "no session id in metrics");
    assert_eq!(app.metric("chatgate_paused_runs").await, 1);
}

#[tokio::test]
async fn metrics_are_prometheus_text_unless_openmetrics_is_asked_for() {
    let app = spawn_app().await;
    app.reply("nobody", "CONFIRM_ACTION:confirm").await;

    let plain = app.get_with("/metrics", &[]).await;
    let plain_type = plain.headers()["content-type"].to_str().unwrap().to_owned();
    let text = plain.text().await.unwrap();
    let open = app
        .get_with(
            "/metrics",
            &[("accept", "application/openmetrics-text; version=1.0.0")],
        )
        .await;
    let open_type = open.headers()["content-type"].to_str().unwrap().to_owned();
    let openmetrics = open.text().await.unwrap();

    assert!(
        plain_type.starts_with("text/plain; version=0.0.4"),
        "{plain_type}"
    );
    assert!(text.contains("# HELP chatgate_errors_total "), "{text}");
    assert!(text.contains("# TYPE chatgate_confirmation_decisions_total counter"));
    assert!(!text.contains("# EOF"));
    assert!(
        open_type.starts_with("application/openmetrics-text"),
        "{open_type}"
    );
    assert!(openmetrics.ends_with("# EOF\n"));
}

#[tokio::test]
async fn beyond_max_runs_new_sessions_get_503_overloaded_and_existing_runs_go_on() {
    let app = spawn_app_with(|s| s.limits.max_runs = 2).await;
    let (mut a, _) = app.open_paused("a", "one").await;
    let (mut b, _) = app.open_paused("b", "two").await;

    let response = app.chat("c", "three").await;
    let retry_after = response.headers().get("retry-after").cloned();
    let (status, chunk) = one_chunk(response).await;

    assert_eq!(status, 503);
    assert_eq!(error_type(&chunk), "overloaded");
    assert!(
        retry_after.is_some(),
        "Retry-After tells clients when to come back"
    );
    for (session, stream) in [("a", &mut a), ("b", &mut b)] {
        let (status, _) = app.reply(session, "CONFIRM_ACTION:confirm").await;
        assert_eq!(status, 200);
        assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    }
    app.registry_drains().await;
    let (mut c, _) = app.open_paused("c", "three").await;
    app.reply("c", "CONFIRM_ACTION:cancel").await;
    assert_eq!(c.finish().await.chunk_type, ChunkType::Cancelled);
}

/// Never ends on its own and ignores shutdown.
struct StubbornEngine;

impl Engine for StubbornEngine {
    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>> {
        async move {
            ctx.emit(ChunkType::Status, "never stopping").await?;
            tokio::time::sleep(Duration::from_secs(3600)).await;
            Ok(Completion::default())
        }
        .boxed()
    }
}

#[tokio::test]
async fn shutdown_finishes_within_the_shutdown_timeout_even_if_a_run_does_not() {
    let app = spawn_app_with_engine(
        |s| s.server.shutdown_timeout = std::time::Duration::from_secs(1),
        Arc::new(StubbornEngine),
    )
    .await;
    let mut stuck = app.open("stuck", "forever").await;
    stuck.next_chunk().await.unwrap();

    let started = std::time::Instant::now();
    app.shutdown.cancel();
    let served = tokio::time::timeout(Duration::from_secs(10), app.server)
        .await
        .expect("the server stops by itself");

    served.unwrap().unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped after {:?}",
        started.elapsed()
    );
}

/// Runs the binary with `args` and `env`, expecting it to refuse to start.
fn refused_start(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, String) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    (output.status.code(), stderr)
}

/// Arguments, environment, the exit code expected, words the line must hold.
type StartCase<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)], i32, &'a [&'a str]);

#[test]
fn start_up_errors_are_one_line_naming_the_flag_or_variable_and_the_value() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let cases: [StartCase; 12] = [
        (
            &["--confirm-timout", "5s"],
            &[],
            2,
            &["--confirm-timout", "similar", "--confirm-timeout"],
        ),
        (
            &["--bind", "127.0.0.1"],
            &[],
            2,
            &["--bind", "127.0.0.1", "HOST:PORT"],
        ),
        (
            &["--engine", "gpt"],
            &[],
            2,
            &["--engine", "gpt", "planner", "openai"],
        ),
        (
            &[],
            &[("CHATGATE_CONFIRM_TIMEOUT", "soon")],
            2,
            &["CHATGATE_CONFIRM_TIMEOUT", "soon", "300s"],
        ),
        (
            &[],
            &[("CHATGATE_KEEP_ALIVE_SECS", "0")],
            2,
            &["CHATGATE_KEEP_ALIVE", "out of range"],
        ),
        (
            &["--bind", &taken],
            &[],
            1,
            &["cannot listen on", &taken, "--bind"],
        ),
        (&["--engine", "openai"], &[], 1, &["--llm-model"]),
        (
            &["--store", "redis://127.0.0.1:1/0"],
            &[],
            1,
            &["--store redis://", "--advertise-url"],
        ),
        (
            &[
                "--store",
                "redis://127.0.0.1:1/0",
                "--advertise-url",
                "http://127.0.0.1:1",
            ],
            &[],
            1,
            &["--cluster-secret", "the same on every replica"],
        ),
        (
            &[
                "--store",
                "redis://127.0.0.1:1/0",
                "--advertise-url",
                "http://127.0.0.1:1",
                "--cluster-secret",
                "short",
            ],
            &[],
            1,
            &["--cluster-secret", "at least 16"],
        ),
        (
            &["--advertise-url", "127.0.0.1:8080"],
            &[],
            2,
            &["--advertise-url", "127.0.0.1:8080"],
        ),
        (
            &["--replica-id", "a/b"],
            &[],
            2,
            &["--replica-id", "a/b", "letters, digits"],
        ),
    ];
    for (args, env, code, words) in cases {
        let (exit, stderr) = refused_start(args, env);
        assert_eq!(exit, Some(code), "{args:?} {env:?}: {stderr}");
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(lines[0].starts_with("chatgate: "), "{stderr}");
        for word in words {
            assert!(lines[0].contains(word), "{word:?} in {stderr}");
        }
        assert!(
            !stderr.contains("Custom {") && !stderr.contains("Os {"),
            "{stderr}"
        );
    }
}

/// The access log names each request's session (quoted), so a request can
/// be matched to its run; the message text is never in it.
#[tokio::test]
async fn the_access_log_names_the_session_and_never_the_message() {
    let server = crate::common::start_binary(&["--step-delay", "0"]);
    let url = format!("{}/api/v1/chat/stream", server.url);
    let client = reqwest::Client::new();
    let stream = client
        .post(&url)
        .json(&serde_json::json!({"message": "secret plan; two", "session_id": "log \"me\""}))
        .send()
        .await
        .unwrap();
    let mut body = stream.bytes_stream();
    use futures_util::StreamExt;
    let mut seen = String::new();
    while !seen.contains("confirmation_request") {
        let piece = body.next().await.unwrap().unwrap();
        seen.push_str(&String::from_utf8_lossy(&piece));
    }
    let reply = client
        .post(&url)
        .json(&serde_json::json!({"message": "CONFIRM_ACTION:confirm", "session_id": "log \"me\""}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    let bad = client
        .post(&url)
        .body("{")
        .header("content-type", "application/json");
    assert_eq!(bad.send().await.unwrap().status(), 400);

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lines = loop {
        let lines: Vec<String> = server
            .logs
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains("POST /api/v1/chat/stream"))
            .cloned()
            .collect();
        if lines.len() >= 3 || std::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lines.len(), 3, "{lines:?}");
    assert!(
        lines[0].contains(r#" 200 "#) && lines[0].ends_with(r#"session="log \"me\"""#),
        "{lines:?}"
    );
    assert!(lines[1].ends_with(r#"session="log \"me\"""#), "{lines:?}");
    assert!(
        lines[2].contains(" 400 ") && lines[2].ends_with("session=-"),
        "{lines:?}"
    );
    assert!(!lines.iter().any(|l| l.contains("secret plan")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_line_about_a_run_names_its_session_run_and_key() {
    // A model server that is not there: the run's warning is logged.
    let port = crate::helpers::free_port();
    let model = format!("http://127.0.0.1:{port}/v1");
    let server = crate::common::start_binary(&[
        "--engine",
        "openai",
        "--llm-url",
        &model,
        "--llm-model",
        "m",
        "--api-key",
        "tag-key-1234",
    ]);
    let response = reqwest::Client::new()
        .post(format!("{}/api/v1/chat/stream", server.url))
        .bearer_auth("tag-key-1234")
        .json(&serde_json::json!({"message": "hello", "session_id": "tagged \"one\""}))
        .send()
        .await
        .unwrap();
    let body = response.text().await.unwrap();
    assert!(body.contains("engine_unavailable"), "{body}");

    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    loop {
        let logs = server.logs.lock().unwrap().join("\n");
        let tagged = logs
            .lines()
            .find(|l| l.contains("cannot be reached:") && l.contains("run="));
        if let Some(line) = tagged {
            assert!(line.contains(r#"session="tagged \"one\"" run="#), "{line}");
            assert!(
                line.contains(&format!("key=key-1: model server http://127.0.0.1:{port}:")),
                "{line}"
            );
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{logs}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
