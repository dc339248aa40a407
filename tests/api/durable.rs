//! Paused runs that outlive their process (`--store sqlite:PATH`), against
//! the real binary: graceful restarts, `kill -9`, a pause that expires while
//! the process is down, and a decision cut short by a crash (the run goes
//! on where its journal says: `exactly_once.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use chatgate::protocol::{Chunk, ChunkType};
use futures_util::StreamExt;
use serde_json::json;

use crate::common::{start_binary, start_binary_on, Binary};
use crate::helpers::WAIT;

/// A directory for one test's store (and marks), removed at the end.
pub(crate) struct Dir(pub(crate) tempfile::TempDir);

impl Dir {
    pub(crate) fn new() -> Dir {
        Dir(tempfile::tempdir().unwrap())
    }

    pub(crate) fn store(&self) -> String {
        format!("sqlite:{}", self.path("runs.db").display())
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

pub(crate) fn start(dir: &Dir, extra: &[&str]) -> Binary {
    let store = dir.store();
    let mut args = vec!["--store", store.as_str(), "--step-delay", "0"];
    args.extend_from_slice(extra);
    start_binary(&args)
}

pub(crate) fn stream_url(server: &Binary) -> String {
    format!("{}/api/v1/chat/stream", server.url)
}

/// Sends SIGTERM and waits for the process to exit.
pub(crate) fn terminate(server: &mut Binary) {
    let pid = nix::unistd::Pid::from_raw(server.child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    server.child.wait().unwrap();
}

/// Reads a stream's raw text until it closes (or `until` appears).
pub(crate) async fn read_raw(response: reqwest::Response, until: Option<&str>) -> String {
    let mut body = response.bytes_stream();
    let mut text = String::new();
    while let Ok(Some(piece)) = tokio::time::timeout(WAIT, body.next()).await {
        match piece {
            Ok(bytes) => text.push_str(&String::from_utf8_lossy(&bytes)),
            Err(_) => break,
        }
        if until.is_some_and(|marker| text.contains(marker)) {
            break;
        }
    }
    text
}

/// A stream read in the background: what has arrived so far can be waited
/// on, and [`Reading::finish`] yields the whole text once it closes.
pub(crate) struct Reading {
    text: tokio::sync::watch::Receiver<String>,
    done: tokio::task::JoinHandle<String>,
}

impl Reading {
    fn start(response: reqwest::Response) -> Reading {
        let (text_tx, text) = tokio::sync::watch::channel(String::new());
        let done = tokio::spawn(async move {
            let mut body = response.bytes_stream();
            while let Ok(Some(Ok(bytes))) = tokio::time::timeout(WAIT, body.next()).await {
                text_tx.send_modify(|text| text.push_str(&String::from_utf8_lossy(&bytes)));
            }
            text_tx.borrow().clone()
        });
        Reading { text, done }
    }

    /// Waits until `marker` has arrived.
    pub(crate) async fn until(&mut self, marker: &str) {
        tokio::time::timeout(WAIT, self.text.wait_for(|text| text.contains(marker)))
            .await
            .unwrap_or_else(|_| panic!("{marker} never arrived"))
            .ok();
    }

    pub(crate) async fn finish(self) -> String {
        self.done.await.unwrap()
    }
}

/// Opens a run with `body` and reads its stream until its pause; the rest
/// is read in the background.
pub(crate) async fn open_paused(url: &str, body: serde_json::Value) -> Reading {
    let mut reading = Reading::start(post(url, body, None).await);
    reading
        .until("\"chunk_type\":\"confirmation_request\"")
        .await;
    reading
}

/// Waits until the gauge `name` of `/metrics` at `server` reads `value`.
pub(crate) async fn wait_for_gauge(server: &str, name: &str, value: i64) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = reqwest::get(format!("{server}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let now = text
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .and_then(|v| v.parse::<i64>().ok());
        if now == Some(value) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{name} never read {value} at {server}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub(crate) fn chunks(raw: &str) -> Vec<Chunk> {
    raw.split("\n\n")
        .filter_map(|event| event.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|json| serde_json::from_str(json).unwrap())
        .collect()
}

pub(crate) async fn post(
    url: &str,
    body: serde_json::Value,
    last_event_id: Option<u64>,
) -> reqwest::Response {
    post_with(url, None, body, last_event_id).await
}

/// POSTs `body`, with the API key `key` if given.
pub(crate) async fn post_with(
    url: &str,
    key: Option<&str>,
    body: serde_json::Value,
    last_event_id: Option<u64>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new().post(url).json(&body);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(id) = last_event_id {
        request = request.header("Last-Event-ID", id.to_string());
    }
    request.send().await.unwrap()
}

pub(crate) async fn reply(url: &str, session: &str, message: &str) -> (u16, Chunk) {
    reply_with(url, None, session, message).await
}

/// A reply's status and its one chunk.
async fn reply_with(url: &str, key: Option<&str>, session: &str, message: &str) -> (u16, Chunk) {
    let body = json!({"message": message, "session_id": session});
    let response = post_with(url, key, body, None).await;
    let status = response.status().as_u16();
    (status, chunks(&read_raw(response, None).await).remove(0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_restart_keeps_a_paused_run_and_a_reply_decides_it_afterwards() {
    let dir = Dir::new();
    let mut first = start(&dir, &[]);
    let reading = open_paused(
        &stream_url(&first),
        json!({"message": "one; two", "session_id": "keep"}),
    )
    .await;

    terminate(&mut first);
    let before = reading.finish().await;
    let seen = chunks(&before);

    assert_eq!(
        seen.last().unwrap().chunk_type,
        ChunkType::ConfirmationRequest
    );
    assert!(
        seen.iter().all(|c| !c.finished),
        "no final chunk: the run is not over"
    );
    assert!(before.ends_with("retry: 1000\n\n"), "{before:?}");

    let second = start(&dir, &[]);
    let last_seen = seen.last().unwrap().sequence;
    let back = post(
        &stream_url(&second),
        json!({"session_id": "keep"}),
        Some(last_seen),
    )
    .await;
    assert_eq!(back.status(), 200);
    let rest = tokio::spawn(read_raw(back, None));
    let (status, ack) = reply(&stream_url(&second), "keep", "CONFIRM_ACTION:confirm").await;
    let after = chunks(&rest.await.unwrap());

    assert_eq!(status, 200, "{ack:?}");
    assert_eq!(
        ack.metadata["confirmation_id"],
        seen.last().unwrap().metadata["confirmation_id"]
    );
    assert_eq!(after[0].sequence, last_seen + 1, "the numbering goes on");
    assert_eq!(after[0].chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(after.last().unwrap().chunk_type, ChunkType::Completion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_run_stays_in_its_api_keys_namespace_when_the_keys_change() {
    let dir = Dir::new();
    let keys = |list: &[&str]| {
        let path = dir.path("keys");
        std::fs::write(&path, list.join("\n")).unwrap();
        path.display().to_string()
    };
    let file = keys(&["alpha-key-000000", "beta-key-0000000"]);
    let mut first = start(&dir, &["--api-keys-file", &file]);
    let url = stream_url(&first);
    for (key, session) in [("alpha-key-000000", "shared"), ("beta-key-0000000", "beta")] {
        let opened = post_with(
            &url,
            Some(key),
            json!({"message": "one", "session_id": session}),
            None,
        )
        .await;
        read_raw(opened, Some("confirmation_request")).await;
    }
    terminate(&mut first);

    // alpha first, then beta, became: a new key first, then beta; alpha gone.
    let file = keys(&["gamma-key-000000", "beta-key-0000000"]);
    let second = start(&dir, &["--api-keys-file", &file]);
    let url = stream_url(&second);
    let (gamma, gamma_chunk) = reply_with(
        &url,
        Some("gamma-key-000000"),
        "shared",
        "CONFIRM_ACTION:confirm",
    )
    .await;
    let gamma_attach = post_with(
        &url,
        Some("gamma-key-000000"),
        json!({"session_id": "shared"}),
        Some(0),
    )
    .await;
    let gamma_attach = gamma_attach.status().as_u16();
    let beta_attach = post_with(
        &url,
        Some("beta-key-0000000"),
        json!({"session_id": "beta"}),
        Some(0),
    )
    .await;
    assert_eq!(beta_attach.status(), 200);
    let rest = tokio::spawn(read_raw(beta_attach, None));
    let (beta, beta_chunk) = reply_with(
        &url,
        Some("beta-key-0000000"),
        "beta",
        "CONFIRM_ACTION:confirm",
    )
    .await;
    let after = chunks(&rest.await.unwrap());

    // The key now in alpha's place in the list sees nothing of alpha's run.
    assert_eq!(gamma, 404, "{gamma_chunk:?}");
    assert_eq!(gamma_attach, 404);
    // beta moved in the list, and its run is still its own.
    assert_eq!(beta, 200, "{beta_chunk:?}");
    assert_eq!(after.last().unwrap().chunk_type, ChunkType::Completion);
}

/// A tools file whose `mark` tool appends to `marks`, after `delay`.
pub(crate) fn mark_tool(dir: &Dir, delay: &str) -> PathBuf {
    let path = dir.path("tools.toml");
    std::fs::write(
        &path,
        format!(
            "[[tool]]\nname = \"mark\"\ndescription = \"marks\"\nrisk = \"low\"\n\
             command = [\"sh\", \"-c\", \"sleep {delay}; echo x >> {marks}\"]\n\
             parameters = {{ type = \"object\" }}\n",
            marks = dir.path("marks").display()
        ),
    )
    .unwrap();
    path
}

pub(crate) fn marks(dir: &Path) -> usize {
    std::fs::read_to_string(dir.join("marks"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_kill_9_the_paused_run_is_there_and_runs_its_tool_once() {
    let dir = Dir::new();
    let tools = mark_tool(&dir, "0");
    let tools = tools.to_str().unwrap();
    let audit = dir.path("audit.jsonl").display().to_string();
    let mut first = start(&dir, &["--tools", tools, "--audit-log", &audit]);
    let opened = post(
        &stream_url(&first),
        json!({"message": "mark it", "session_id": "k9"}),
        None,
    )
    .await;
    let raw = read_raw(opened, Some("confirmation_request")).await;
    let request = chunks(&raw).pop().unwrap();

    first.child.kill().unwrap(); // SIGKILL: no shutdown at all
    first.child.wait().unwrap();
    let second = start(&dir, &["--tools", tools, "--audit-log", &audit]);
    let back = post(
        &stream_url(&second),
        json!({"session_id": "k9"}),
        Some(request.sequence),
    )
    .await;
    let rest = tokio::spawn(read_raw(back, None));
    let (status, _) = reply(&stream_url(&second), "k9", "CONFIRM_ACTION:confirm").await;
    let after = chunks(&rest.await.unwrap());
    let (again, _) = reply(&stream_url(&second), "k9", "CONFIRM_ACTION:confirm").await;

    assert_eq!(status, 200);
    assert_eq!(after.last().unwrap().chunk_type, ChunkType::Completion);
    assert_eq!(marks(dir.0.path()), 1);
    assert_eq!(again, 404, "decided once; the run is over");
    // One trail across both processes, tied by the run's stored id.
    let (events, stored) = ended_trail(&dir.path("audit.jsonl"), "k9").await;
    assert_eq!(events, ["proposed", "decided", "executed", "ended"]);
    assert_eq!(stored.len(), 1, "{stored:?}");
}

/// [`audit_trail`] once its run's `ended` record is written (it follows the
/// final chunk: a client may read the end before it is on the record).
pub(crate) async fn ended_trail(path: &Path, session: &str) -> (Vec<String>, Vec<String>) {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let trail = audit_trail(path, session);
        if trail.0.last().is_some_and(|e| e == "ended") || tokio::time::Instant::now() > deadline {
            return trail;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The events recorded for `session` in an audit log, and the distinct
/// `stored_run_id`s they carry.
pub(crate) fn audit_trail(path: &Path, session: &str) -> (Vec<String>, Vec<String>) {
    let text = std::fs::read_to_string(path).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .filter(|r: &serde_json::Value| r["session_id"] == session)
        .collect();
    let events = records
        .iter()
        .map(|r| r["event"].as_str().unwrap().to_owned())
        .collect();
    let mut stored: Vec<String> = records
        .iter()
        .map(|r| r["stored_run_id"].as_str().unwrap_or("none").to_owned())
        .collect();
    stored.dedup();
    (events, stored)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_expired_while_the_process_was_down_shows_its_timeout() {
    let dir = Dir::new();
    let audit = dir.path("audit.jsonl").display().to_string();
    let mut first = start(&dir, &["--confirm-timeout", "1s", "--audit-log", &audit]);
    let opened = post(
        &stream_url(&first),
        json!({"message": "late", "session_id": "exp"}),
        None,
    )
    .await;
    read_raw(opened, Some("confirmation_request")).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    tokio::time::sleep(Duration::from_millis(1300)).await;

    let second = start(&dir, &["--confirm-timeout", "1s", "--audit-log", &audit]);
    let replay = post(&stream_url(&second), json!({"session_id": "exp"}), Some(0)).await;
    let seen = chunks(&read_raw(replay, None).await);
    let (status, _) = reply(&stream_url(&second), "exp", "CONFIRM_ACTION:confirm").await;

    let last = seen.last().unwrap();
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(last.metadata["reason"], "timeout");
    assert_eq!(status, 404, "nothing is pending any more");
    // Its end is on the record too, with the reason, under the same run.
    let (events, stored) = audit_trail(&dir.path("audit.jsonl"), "exp");
    assert_eq!(events, ["proposed", "ended"]);
    assert_eq!(stored.len(), 1, "{stored:?}");
    let text = std::fs::read_to_string(dir.path("audit.jsonl")).unwrap();
    let ended: serde_json::Value = serde_json::from_str(text.lines().last().unwrap()).unwrap();
    assert_eq!(ended["outcome"], "cancelled");
    assert_eq!(ended["reason"], "timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decision_the_store_cannot_record_is_refused_and_the_pause_waits_on() {
    let dir = Dir::new();
    let server = start(&dir, &[]);
    let reading = open_paused(
        &stream_url(&server),
        json!({"message": "one; two", "session_id": "locked"}),
    )
    .await;
    // Another process holds the database's write lock past chatgate's
    // busy timeout (5 s): the decision cannot be recorded.
    let blocker = rusqlite::Connection::open(dir.path("runs.db")).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();

    let (refused, refusal) = reply(&stream_url(&server), "locked", "CONFIRM_ACTION:confirm").await;
    blocker.execute_batch("COMMIT").unwrap();
    let (accepted, _) = reply(&stream_url(&server), "locked", "CONFIRM_ACTION:confirm").await;
    let seen = chunks(&reading.finish().await);

    assert_eq!(refused, 503);
    assert_eq!(refusal.metadata["error_type"], "store_unavailable");
    assert_eq!(accepted, 200, "the pause waited on for the retry");
    let kinds: Vec<ChunkType> = seen.iter().map(|c| c.chunk_type).collect();
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == ChunkType::ConfirmationReceived)
            .count(),
        1
    );
    assert_eq!(kinds.last(), Some(&ChunkType::Completion));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_memory_store_a_shutdown_still_cancels_paused_runs() {
    let mut server = start_binary(&["--step-delay", "0"]);
    let reading = open_paused(
        &stream_url(&server),
        json!({"message": "gone", "session_id": "mem"}),
    )
    .await;

    terminate(&mut server);
    let seen = chunks(&reading.finish().await);

    let last = seen.last().unwrap();
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(last.metadata["reason"], "shutdown");
}

#[test]
fn a_bad_store_stops_the_start_with_one_line() {
    for (store, words) in [
        ("redis-like:x", "is not a store"),
        ("sqlite:/no/such/dir/runs.db", "/no/such/dir/runs.db"),
    ] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
            .args(["--bind", "127.0.0.1:0", "--store", store])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(words), "{stderr}");
    }
}

#[test]
fn a_second_process_on_one_sqlite_file_refuses_to_start() {
    let dir = Dir::new();
    let first = start(&dir, &[]);
    let store = dir.store();

    let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
        .args(["--bind", "127.0.0.1:0", "--store", &store])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);

    // It would restore the first one's paused runs and could act twice.
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("another chatgate process"), "{stderr}");
    assert!(stderr.contains("runs.db"), "{stderr}");
    drop(first);
}

/// Both sample CLIs ride through a restart: their stream ends with `retry:`,
/// they re-attach to the restarted server on the same address, and the run
/// completes once confirmed there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sample_clients_re_attach_across_a_restart() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let clis: [(&str, PathBuf); 2] = [
        ("python3", root.join("clients/python/chatgate_client.py")),
        ("node", root.join("clients/js/cli.mjs")),
    ];
    for (i, (program, cli)) in clis.into_iter().enumerate() {
        let dir = Dir::new();
        let port = crate::helpers::free_port();
        let bind = format!("127.0.0.1:{port}");
        let store = dir.store();
        let args = ["--store", store.as_str(), "--step-delay", "0"];
        let mut first = start_binary_on(&bind, &args);
        let session = format!("ride-{i}");
        let url = first.url.clone();
        let cli_run = tokio::task::spawn_blocking(move || {
            std::process::Command::new(program)
                .arg(&cli)
                .args(["--url", &url, "--session", &session, "--wait", "one; two"])
                .stdin(std::process::Stdio::null())
                .output()
                .unwrap()
        });
        wait_for_gauge(&first.url, "chatgate_paused_runs", 1).await;

        terminate(&mut first);
        let second = start_binary_on(&bind, &args);
        wait_for_gauge(&second.url, "chatgate_open_streams", 1).await; // the client is back
        let (status, _) = reply(
            &stream_url(&second),
            &format!("ride-{i}"),
            "CONFIRM_ACTION:confirm",
        )
        .await;
        let done = tokio::time::timeout(WAIT, cli_run).await.unwrap().unwrap();

        let stdout = String::from_utf8_lossy(&done.stdout);
        assert_eq!(status, 200, "{program}");
        assert_eq!(
            done.status.code(),
            Some(0),
            "{program}: {stdout}\n{}",
            String::from_utf8_lossy(&done.stderr)
        );
        assert!(stdout.contains("[completion]"), "{program}: {stdout}");
    }
}

/// The `openai` engine's paused runs are stored too: its conversation and
/// the calls awaiting the decision. A restart in the middle of a plan: the
/// reply decides it in the next process, and the model is told so there.
#[cfg(feature = "openai")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_run_paused_on_its_plan_goes_on_after_a_restart() {
    use crate::model_server::{fake_model, plan_call, tokens};
    let model = fake_model(vec![
        plan_call(
            "call_plan",
            &json!({"summary": "Two steps", "tasks": [{"description": "a"}, {"description": "b"}]}),
        ),
        tokens(&["Did ", "both."]),
    ])
    .await;
    let dir = Dir::new();
    let args = [
        "--engine",
        "openai",
        "--llm-url",
        &model.url,
        "--llm-model",
        "m",
    ];
    let mut first = start(&dir, &args);
    let opened = post(
        &stream_url(&first),
        json!({"message": "do two things", "session_id": "llm"}),
        None,
    )
    .await;
    let raw = read_raw(opened, Some("confirmation_request")).await;
    let request = chunks(&raw).pop().unwrap();

    terminate(&mut first);
    let second = start(&dir, &args);
    let back = post(
        &stream_url(&second),
        json!({"session_id": "llm"}),
        Some(request.sequence),
    )
    .await;
    let rest = tokio::spawn(read_raw(back, None));
    let (status, _) = reply(&stream_url(&second), "llm", "CONFIRM_ACTION:confirm").await;
    let after = chunks(&rest.await.unwrap());

    assert_eq!(request.chunk_type, ChunkType::ConfirmationRequest);
    assert_eq!(status, 200);
    let text: String = after
        .iter()
        .filter(|c| c.chunk_type == ChunkType::Content)
        .map(|c| c.chunk.as_str())
        .collect();
    assert_eq!(text, "Did both.");
    assert_eq!(after.last().unwrap().chunk_type, ChunkType::Completion);
    let requests = model.requests();
    assert_eq!(
        requests.len(),
        2,
        "the plan, then the report after the restart"
    );
    let messages = requests[1]["messages"].as_array().unwrap();
    assert_eq!(
        messages[1]["content"], "do two things",
        "the conversation went on"
    );
    let result = messages.last().unwrap();
    assert_eq!(result["role"], "tool");
    assert_eq!(result["tool_call_id"], "call_plan");
    assert!(result["content"]
        .as_str()
        .unwrap()
        .starts_with("The user confirmed the plan."));
}

/// The pending tool calls of a paused `openai` run survive `kill -9`: after
/// the restart the confirmed call runs once, and its result reaches the model.
#[cfg(feature = "openai")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_run_paused_on_tool_calls_runs_them_once_after_kill_9() {
    use crate::model_server::{event, fake_model, tokens};
    let call = json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_mark",
        "type": "function", "function": {"name": "mark", "arguments": "{}"}}]}}]});
    let end = json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]});
    let model = fake_model(vec![
        format!("{}{}data: [DONE]\n\n", event(&call), event(&end)),
        tokens(&["Marked."]),
    ])
    .await;
    let dir = Dir::new();
    let tools = mark_tool(&dir, "0");
    let tools = tools.to_str().unwrap();
    let args = [
        "--engine",
        "openai",
        "--llm-url",
        &model.url,
        "--llm-model",
        "m",
        "--tools",
        tools,
    ];
    let mut first = start(&dir, &args);
    let opened = post(
        &stream_url(&first),
        json!({"message": "mark it", "session_id": "llm-k9"}),
        None,
    )
    .await;
    read_raw(opened, Some("confirmation_request")).await;

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let second = start(&dir, &args);
    let (status, _) = reply(&stream_url(&second), "llm-k9", "CONFIRM_ACTION:confirm").await;
    let back = post(
        &stream_url(&second),
        json!({"session_id": "llm-k9"}),
        Some(0),
    )
    .await;
    let after = chunks(&read_raw(back, None).await);

    assert_eq!(status, 200);
    assert_eq!(after.last().unwrap().chunk_type, ChunkType::Completion);
    assert_eq!(marks(dir.0.path()), 1, "the confirmed call ran once");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let result = requests[1]["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(result["tool_call_id"], "call_mark");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_a_re_attach_with_any_id_the_client_saw_is_sent_what_follows() {
    let dir = Dir::new();
    let tools = mark_tool(&dir, "5");
    let tools = tools.to_str().unwrap();
    let mut first = start(&dir, &["--tools", tools]);
    let mut reading = open_paused(
        &stream_url(&first),
        json!({"message": "mark slowly", "session_id": "seen"}),
    )
    .await;
    reply(&stream_url(&first), "seen", "CONFIRM_ACTION:confirm").await;
    // The client reads past what the store kept: the decision, the status.
    reading.until("\"chunk_type\":\"status\"").await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let seen = chunks(&reading.finish().await);
    let last_seen = seen.last().unwrap().sequence;

    let second = start(&dir, &["--tools", tools]);
    let replay = post(
        &stream_url(&second),
        json!({"session_id": "seen"}),
        Some(last_seen),
    )
    .await;
    let status = replay.status();
    // The run goes on (#44): its call, cut short, is put to a person
    // (`reconcile`), or run if it had not begun.
    let shown = chunks(&read_raw(replay, Some("\"chunk_type\":\"input_request\"")).await);

    assert_eq!(status, 200, "never 400 for an id the client saw");
    assert_eq!(shown[0].metadata["gap"], true, "the gap is announced");
    assert!(shown[0].sequence > last_seen, "numbered past what it saw");
    let last = shown.last().unwrap();
    assert!(
        last.chunk_type == ChunkType::InputRequest || last.chunk_type == ChunkType::Completion,
        "{shown:?}"
    );
    assert!(
        shown.windows(2).all(|w| w[1].sequence == w[0].sequence + 1),
        "numbered on without a hole: {shown:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_message_the_store_cannot_record_supersedes_nothing() {
    let dir = Dir::new();
    let server = start(&dir, &[]);
    let reading = open_paused(
        &stream_url(&server),
        json!({"message": "one; two", "session_id": "sup"}),
    )
    .await;
    // Another process holds the database's write lock past chatgate's
    // busy timeout: the supersede cannot be recorded.
    let blocker = rusqlite::Connection::open(dir.path("runs.db")).unwrap();
    blocker.execute_batch("BEGIN EXCLUSIVE").unwrap();

    let refused = post(
        &stream_url(&server),
        json!({"message": "something else", "session_id": "sup"}),
        None,
    )
    .await;
    let refused_status = refused.status().as_u16();
    let refusal = chunks(&read_raw(refused, None).await).remove(0);
    blocker.execute_batch("COMMIT").unwrap();
    let (confirmed, _) = reply(&stream_url(&server), "sup", "CONFIRM_ACTION:confirm").await;
    let seen = chunks(&reading.finish().await);

    assert_eq!(refused_status, 503);
    assert_eq!(refusal.metadata["error_type"], "store_unavailable");
    assert_eq!(confirmed, 200, "the old pause waited on, untouched");
    assert_eq!(seen.last().unwrap().chunk_type, ChunkType::Completion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_whose_end_was_recorded_is_never_reopened_by_a_restart() {
    let dir = Dir::new();
    let mut first = start(&dir, &[]);
    let reading = open_paused(
        &stream_url(&first),
        json!({"message": "one; two", "session_id": "ended"}),
    )
    .await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(reading);
    // As a run superseded (its decision recorded) whose record's removal
    // failed before the crash.
    let db = rusqlite::Connection::open(dir.path("runs.db")).unwrap();
    let superseded = json!({
        "action": "cancel", "confirmation_id": "x", "reason": "superseded", "nonce": "n"
    });
    let changed = db
        .execute(
            "UPDATE paused_runs SET decision = ?1",
            [superseded.to_string()],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(db);

    let second = start(&dir, &[]);
    let replay = post(
        &stream_url(&second),
        json!({"session_id": "ended"}),
        Some(0),
    )
    .await;
    let shown = chunks(&read_raw(replay, None).await);
    let (status, _) = reply(&stream_url(&second), "ended", "CONFIRM_ACTION:confirm").await;

    let last = shown.last().unwrap();
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(last.metadata["reason"], "superseded");
    assert_eq!(status, 404, "an ended pause is not asked again");
}

/// A run that ended while its client was away, its process then killed
/// before the client came back: the next process shows the end (for the
/// grace), never the pause again and never a 404. What the file keeps of
/// an ended run is its end, not its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_ended_before_kill_9_shows_its_end_to_a_re_attach_after_the_restart() {
    let dir = Dir::new();
    let audit = dir.path("audit.jsonl").display().to_string();
    let mut first = start(&dir, &["--audit-log", &audit]);
    let opened = post(
        &stream_url(&first),
        json!({"message": "one; two", "session_id": "gone-early"}),
        None,
    )
    .await;
    let raw = read_raw(opened, Some("confirmation_request")).await;
    let request = chunks(&raw).pop().unwrap();
    // The client is gone (the stream above was dropped); a script confirms.
    let (status, _) = reply(&stream_url(&first), "gone-early", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    let deadline = tokio::time::Instant::now() + WAIT;
    while !audit_trail(&dir.path("audit.jsonl"), "gone-early")
        .0
        .contains(&"ended".to_owned())
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The end is in the store before the audit record is written.
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let kept: (i64, i64, String) = rusqlite::Connection::open(dir.path("runs.db"))
        .unwrap()
        .query_row(
            "SELECT json_array_length(ended, '$.frames'), json_array_length(record, '$.frames'),
                 json_extract(record, '$.message') FROM paused_runs",
            [],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?)),
        )
        .unwrap();
    assert_eq!(kept, (1, 0, String::new()), "the final chunk alone");

    let second = start(&dir, &["--audit-log", &audit]);
    let back = post(
        &stream_url(&second),
        json!({"session_id": "gone-early"}),
        Some(request.sequence),
    )
    .await;
    assert_eq!(back.status(), 200);
    let rest = chunks(&read_raw(back, None).await);
    let (again, _) = reply(&stream_url(&second), "gone-early", "CONFIRM_ACTION:confirm").await;

    // The store kept the end, not the whole log (#32): the final chunk
    // alone, under its own sequence number, the chunks before it announced
    // as a gap.
    assert_eq!(rest.len(), 1, "{rest:?}");
    let last = &rest[0];
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert!(last.finished);
    assert!(last.sequence > request.sequence + 1, "{rest:?}");
    assert_eq!(last.metadata["gap"], true, "{last:?}");
    assert_eq!(again, 404, "the ended run asks nothing again");
    let (events, _) = audit_trail(&dir.path("audit.jsonl"), "gone-early");
    assert_eq!(
        events,
        ["proposed", "decided", "ended"],
        "ended once, by the first"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_s_outcome_is_kept_across_a_restart() {
    let dir = Dir::new();
    let mut server = start(&dir, &["--detach-grace", "0s"]);
    let url = stream_url(&server);
    let reading = open_paused(&url, json!({"message": "build", "session_id": "kept"})).await;
    assert_eq!(reply(&url, "kept", "CONFIRM_ACTION:confirm").await.0, 200);
    reading.finish().await;
    terminate(&mut server);

    let server = start(&dir, &["--detach-grace", "0s"]);
    let response = reqwest::get(format!("{}/api/v1/runs/kept", server.url))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let outcome: serde_json::Value = response.json().await.unwrap();
    assert_eq!(outcome["outcome"], "completion");
    assert_eq!(outcome["pauses"][0]["action"], "confirm");
    assert_eq!(outcome["pauses"][0]["decided_by"], "anonymous");
    assert_eq!(outcome["ran"][0]["tool"], "build");
}
