//! What faults leave behind, each answer telling the truth: tools that
//! outlive their call or their server, redirects with secrets, torn audit
//! records, an edit that would change nothing.

use std::path::Path;
use std::time::Duration;

use chatgate::protocol::ChunkType;
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::common::start_binary;
use crate::helpers::{error_type, one_chunk, spawn_app_with, WAIT};

/// Lines in `path` (0 if it does not exist).
fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |text| text.lines().count())
}

/// Waits until `check` holds.
async fn until(what: &str, check: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A tools file in `dir` with one tool, `name`, running `script` with sh.
fn tools_file(dir: &Path, name: &str, script: &str) -> std::path::PathBuf {
    let path = dir.join("tools.toml");
    let text = format!(
        "[[tool]]\nname = \"{name}\"\ndescription = \"test\"\nrisk = \"low\"\n\
         command = [\"sh\", \"-c\", {script:?}]\nparameters = {{ type = \"object\" }}\n"
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn post(url: &str, body: Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(format!("{url}/api/v1/chat/stream"))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// Reads `response` until `marker` has arrived; the rest is read in the
/// background.
async fn read_until(response: reqwest::Response, marker: &str) {
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while !text.contains(marker) {
        let piece = tokio::time::timeout(WAIT, body.next())
            .await
            .expect("more of the stream")
            .expect("the stream goes on")
            .unwrap();
        text.push_str(&String::from_utf8_lossy(&piece));
    }
    tokio::spawn(async move { while body.next().await.is_some() {} });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_and_its_daemon_die_with_a_server_killed_mid_call() {
    let dir = tempfile::tempdir().unwrap();
    let (written, daemon) = (dir.path().join("written"), dir.path().join("daemon"));
    let script = format!(
        "setsid sh -c 'sleep 1.5; touch {daemon}' & \
         for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do echo $i >> {written}; sleep 0.2; done",
        daemon = daemon.display(),
        written = written.display()
    );
    let tools = tools_file(dir.path(), "slow_write", &script);
    let mut server = start_binary(&["--step-delay", "0", "--tools", tools.to_str().unwrap()]);
    let opened = post(
        &server.url,
        json!({"message": "slow_write now", "session_id": "k9"}),
    )
    .await;
    read_until(opened, "\"confirmation_request\"").await;
    let confirmed = post(
        &server.url,
        json!({"message": "CONFIRM_ACTION:confirm", "session_id": "k9"}),
    )
    .await;
    assert_eq!(confirmed.status(), 200);
    until("the tool writing", || lines(&written) >= 1).await;

    server.child.kill().unwrap(); // SIGKILL
    server.child.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let at_death = lines(&written);
    tokio::time::sleep(Duration::from_millis(2000)).await;

    assert!(at_death < 15, "the tool was still at work when killed");
    assert_eq!(lines(&written), at_death, "nothing more was written");
    assert!(!daemon.exists(), "the daemon the tool started died too");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_that_leaves_a_daemon_is_done_at_its_exit_and_the_daemon_goes() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = dir.path().join("daemon");
    let script = format!(
        "setsid sh -c 'sleep 1.5; touch {}' & echo started",
        daemon.display()
    );
    let tools = tools_file(dir.path(), "launch", &script);
    let app = spawn_app_with(|s| s.tooling.tools = Some(tools)).await;

    let (mut stream, _) = app.open_paused("daemon", "launch it").await;
    let started = std::time::Instant::now();
    app.reply("daemon", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_millis(2000)).await;

    let output = stream
        .chunks
        .iter()
        .find(|c| c.chunk_type == ChunkType::ToolOutput)
        .unwrap();
    assert_eq!(output.metadata["ok"], true, "{output:?}");
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert!(
        took < Duration::from_millis(1400),
        "not held by the daemon: {took:?}"
    );
    assert!(!daemon.exists(), "nothing the call started outlives it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_tool_follows_no_redirect_and_sends_its_secret_nowhere_else() {
    use actix_web::{web, App, HttpResponse, HttpServer};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    // Another origin that would collect what a redirect sends it.
    let stolen = Arc::new(AtomicUsize::new(0));
    let counter = stolen.clone();
    let thief = HttpServer::new(move || {
        let counter = counter.clone();
        App::new().default_service(web::to(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            async { HttpResponse::Ok().body("thanks") }
        }))
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let thief_url = format!("http://{}/steal", thief.addrs()[0]);
    tokio::spawn(thief.run());
    // The declared endpoint answers with a redirect there.
    let hits = Arc::new(AtomicUsize::new(0));
    let counter = hits.clone();
    let location = thief_url.clone();
    let endpoint = HttpServer::new(move || {
        let (counter, location) = (counter.clone(), location.clone());
        App::new().default_service(web::to(move || {
            counter.fetch_add(1, Ordering::SeqCst);
            let location = location.clone();
            async move {
                HttpResponse::TemporaryRedirect()
                    .insert_header(("Location", location))
                    .finish()
            }
        }))
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let url = format!("http://{}/hook", endpoint.addrs()[0]);
    tokio::spawn(endpoint.run());
    let dir = tempfile::tempdir().unwrap();
    let tools = dir.path().join("tools.toml");
    std::fs::write(
        &tools,
        format!(
            "[[tool]]\nname = \"hook\"\ndescription = \"test\"\nrisk = \"high\"\n\
             http = \"{url}\"\nheaders = {{ X-Api-Key = \"sk-secret\" }}\n\
             parameters = {{ type = \"object\" }}\n"
        ),
    )
    .unwrap();
    let app = spawn_app_with(|s| s.tooling.tools = Some(tools)).await;

    let (mut stream, _) = app.open_paused("redirect", "hook it").await;
    app.reply("redirect", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    let output = stream
        .chunks
        .iter()
        .find(|c| c.chunk_type == ChunkType::ToolOutput)
        .unwrap();
    let error = output.metadata["error"].as_str().unwrap();
    assert_eq!(output.metadata["ok"], false);
    assert!(
        error.contains("307") && error.contains(&thief_url),
        "{error}"
    );
    assert_eq!(hits.load(Ordering::SeqCst), 1, "POSTed once");
    assert_eq!(
        stolen.load(Ordering::SeqCst),
        0,
        "nothing reached the other origin"
    );
    assert_eq!(error_type(&last), "task_failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_audit_record_is_cut_off_and_every_line_stays_one_record() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    // The server runs under a file-size limit it can be given at run time.
    let mut server = crate::common::start_binary_with_prefix(
        &["prlimit", "--fsize=1000000:", "--"],
        &["--step-delay", "0", "--audit-log", audit.to_str().unwrap()],
    );
    let pid = server.child.id().to_string();
    let opened = post(
        &server.url,
        json!({"message": "one; two", "session_id": "torn"}),
    )
    .await;
    read_until(opened, "\"confirmation_request\"").await;
    let proposed = std::fs::metadata(&audit).unwrap().len();
    // Room for 40 more bytes: the `decided` record is cut mid-line.
    let limit = format!("--fsize={}:", proposed + 40);
    prlimit(&pid, &limit);

    let refused = post(
        &server.url,
        json!({"message": "CONFIRM_ACTION:confirm", "session_id": "torn"}),
    )
    .await;
    let (status, chunk) = one_chunk(refused).await;
    // The refused run's other records (its end) fail the same way while
    // the limit holds, each cut off in turn: the file comes back to where
    // it was once none is being written.
    until("the torn records cut off", || {
        std::fs::metadata(&audit).is_ok_and(|m| m.len() == proposed)
    })
    .await;
    let after_refusal = std::fs::metadata(&audit).unwrap().len();
    prlimit(&pid, "--fsize=unlimited:");
    let again = post(
        &server.url,
        json!({"message": "three", "session_id": "whole"}),
    )
    .await;
    read_until(again, "\"confirmation_request\"").await;
    let done = post(
        &server.url,
        json!({"message": "CONFIRM_ACTION:confirm", "session_id": "whole"}),
    )
    .await;
    assert_eq!(done.status(), 200);
    until("the run's end on the record", || {
        std::fs::read_to_string(&audit).is_ok_and(|text| {
            text.lines()
                .any(|l| l.contains("\"ended\"") && l.contains("\"whole\""))
        })
    })
    .await;
    server.child.kill().unwrap();

    assert_eq!(status, 503);
    assert_eq!(error_type(&chunk), "audit_unavailable");
    assert_eq!(after_refusal, proposed, "the torn record was cut off");
    let text = std::fs::read_to_string(&audit).unwrap();
    for line in text.lines() {
        serde_json::from_str::<Value>(line)
            .unwrap_or_else(|err| panic!("not one whole record ({err}): {line}"));
    }
    assert!(
        text.contains("\"decided\""),
        "the later decision is on the record"
    );
}

/// Sets `pid`'s soft limit (`N:`): raising it again needs no privilege.
fn prlimit(pid: &str, limit: &str) {
    let status = std::process::Command::new("prlimit")
        .args(["--pid", pid, limit])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn an_edit_of_a_step_that_calls_no_tool_is_refused_and_the_pause_stays() {
    let app = spawn_app_with(|_| {}).await;
    let (mut stream, _) = app.open_paused("edit", "alpha; beta").await;

    let refused = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:confirm",
            "session_id": "edit",
            "decisions": [{"index": 1, "decision": "edit", "args": {"step": "changed"}}]
        }))
        .await;
    let (status, chunk) = one_chunk(refused).await;
    let (confirmed, _) = app.reply("edit", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    assert_eq!(status, 422);
    assert_eq!(error_type(&chunk), "invalid_decision");
    assert!(
        chunk.chunk.contains("calls no declared tool"),
        "{}",
        chunk.chunk
    );
    assert_eq!(confirmed, 200, "the pause was untouched");
    assert_eq!(last.chunk_type, ChunkType::Completion);
    let statuses: Vec<&str> = stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::Status)
        .map(|c| c.chunk.as_str())
        .collect();
    assert!(
        statuses.iter().any(|s| s.ends_with("alpha")),
        "{statuses:?}"
    );
}
