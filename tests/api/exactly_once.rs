//! Exactly once after a crash (#44), against the real binary and a real
//! SQLite file: a command tool is `kill -9`ed with its server mid-call,
//! and after the restart its run goes on where the execution journal says:
//! called again with the same idempotency key (`idempotent`, `reconcile`
//! exit 3, a person's `run_again`), not called again (`reconcile` exit 0, a
//! finished task, `skip`), or ended (`cancel`).

use std::path::Path;
use std::time::Duration;

use chatgate::protocol::{Chunk, ChunkType};
use serde_json::{json, Value};

use crate::common::Binary;
use crate::durable::{
    chunks, open_paused, post, post_with, read_raw, reply, start, stream_url, terminate, Dir,
    Reading,
};
use crate::helpers::WAIT;

/// A tools file with `mark`: it notes its key in `starts` as it starts,
/// sleeps 30 s while the file `slow` is there, then does its effect once
/// per key (`effects`: a key already there is not written again). And a
/// quick `note` tool that appends to `notes`. `extra`: more keys of `mark`.
fn tools(dir: &Dir, extra: &str) -> String {
    let (starts, effects, slow, notes) = (
        dir.path("starts").display().to_string(),
        dir.path("effects").display().to_string(),
        dir.path("slow").display().to_string(),
        dir.path("notes").display().to_string(),
    );
    let path = dir.path("tools.toml");
    std::fs::write(
        &path,
        format!(
            "[[tool]]\nname = \"note\"\ndescription = \"notes\"\nrisk = \"low\"\n\
             command = [\"sh\", \"-c\", \"echo \\\"$CHATGATE_IDEMPOTENCY_KEY\\\" >> {notes}\"]\n\
             parameters = {{ type = \"object\" }}\n\n\
             [[tool]]\nname = \"mark\"\ndescription = \"marks\"\nrisk = \"low\"\n\
             command = [\"sh\", \"-c\", \"echo \\\"$CHATGATE_IDEMPOTENCY_KEY\\\" >> {starts}; \
             if [ -f {slow} ]; then sleep 30; fi; \
             grep -qx \\\"$CHATGATE_IDEMPOTENCY_KEY\\\" {effects} 2>/dev/null || \
             echo \\\"$CHATGATE_IDEMPOTENCY_KEY\\\" >> {effects}; echo marked\"]\n\
             parameters = {{ type = \"object\" }}\n{extra}\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|text| text.lines().map(str::to_owned).collect())
        .unwrap_or_default()
}

/// Waits until `path` has `count` lines.
async fn wait_lines(path: &Path, count: usize) {
    let deadline = tokio::time::Instant::now() + WAIT;
    while lines(path).len() < count {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} never had {count} lines",
            path.display()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Runs `message` on `session`, confirms it, and `kill -9`s the server
/// while `mark` runs (its first start noted); then starts it again.
async fn crash_mid_call(dir: &Dir, tools: &str, session: &str, message: &str) -> Binary {
    crash_mid_call_with(dir, tools, session, message, &[]).await
}

/// As [`crash_mid_call`], both servers started with `extra` flags too.
async fn crash_mid_call_with(
    dir: &Dir,
    tools: &str,
    session: &str,
    message: &str,
    extra: &[&str],
) -> Binary {
    std::fs::write(dir.path("slow"), "").unwrap();
    let audit = dir.path("audit.jsonl").display().to_string();
    let mut args = vec!["--tools", tools, "--audit-log", &audit];
    args.extend_from_slice(extra);
    let mut first = start(dir, &args);
    let reading = open_paused(
        &stream_url(&first),
        json!({"message": message, "session_id": session}),
    )
    .await;
    let (status, ack) = reply(&stream_url(&first), session, "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200, "{ack:?}");
    wait_lines(&dir.path("starts"), 1).await;
    first.child.kill().unwrap(); // SIGKILL: no shutdown at all
    first.child.wait().unwrap();
    drop(reading);
    std::fs::remove_file(dir.path("slow")).unwrap();
    start(dir, &args)
}

/// Re-attaches to `session` from the start and reads until `until` (or
/// the end).
async fn reattach(server: &Binary, session: &str, until: Option<&str>) -> Vec<Chunk> {
    let back = post(&stream_url(server), json!({"session_id": session}), Some(0)).await;
    assert_eq!(back.status(), 200);
    chunks(&read_raw(back, until).await)
}

/// Re-attaches to `session` from the start and reads the rest of its
/// stream in the background (attached before this returns).
async fn read_on(server: &Binary, session: &str) -> tokio::task::JoinHandle<Vec<Chunk>> {
    let back = post(&stream_url(server), json!({"session_id": session}), Some(0)).await;
    assert_eq!(back.status(), 200);
    tokio::spawn(async move { chunks(&read_raw(back, None).await) })
}

fn outputs(seen: &[Chunk]) -> Vec<&Chunk> {
    seen.iter()
        .filter(|c| c.chunk_type == ChunkType::ToolOutput)
        .collect()
}

/// The audit log's records of `event`.
fn audited(dir: &Dir, event: &str) -> Vec<Value> {
    lines(&dir.path("audit.jsonl"))
        .iter()
        .map(|line| serde_json::from_str::<Value>(line).unwrap())
        .filter(|record| record["event"] == event)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idempotent_tool_cut_short_by_kill_9_is_called_again_with_its_key_and_acts_once() {
    let dir = Dir::new();
    let tools = tools(&dir, "idempotent = true");
    let second = crash_mid_call(&dir, &tools, "idem", "mark it").await;

    let seen = reattach(&second, "idem", None).await;

    let last = seen.last().unwrap();
    assert_eq!(last.chunk_type, ChunkType::Completion, "{seen:?}");
    let starts = lines(&dir.path("starts"));
    assert_eq!(starts.len(), 2, "called again once: {starts:?}");
    assert_eq!(starts[0], starts[1], "with the same key");
    assert_eq!(starts[0].len(), 43, "base64url of SHA-256, no padding");
    assert_eq!(
        lines(&dir.path("effects")),
        [starts[0].clone()],
        "acted once"
    );
    let output = outputs(&seen);
    assert_eq!(output.len(), 1, "{seen:?}");
    assert_eq!(output[0].metadata["idempotency_key"], starts[0].as_str());
    assert_eq!(output[0].metadata["resumed_after_crash"], true);
    assert_eq!(output[0].metadata["attempt"], 2);
    let resumed = audited(&dir, "resumed");
    assert_eq!(resumed.len(), 1, "{resumed:?}");
    assert_eq!(resumed[0]["how"], "reran");
    assert_eq!(resumed[0]["idempotency_key"], starts[0].as_str());
    let executed = audited(&dir, "executed");
    assert_eq!(executed.len(), 1, "only the attempt that finished");
    assert_eq!(executed[0]["idempotency_key"], starts[0].as_str());
    assert_eq!(executed[0]["attempt"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_says_done_is_not_called_again_and_its_stdout_is_the_result() {
    let dir = Dir::new();
    let seen_key = dir.path("reconciled").display().to_string();
    let extra = format!(
        "reconcile = [\"sh\", \"-c\", \"echo \\\"$CHATGATE_IDEMPOTENCY_KEY\\\" > {seen_key}; \
         echo it was done; exit 0\"]"
    );
    let tools = tools(&dir, &extra);
    let second = crash_mid_call(&dir, &tools, "rec0", "mark it").await;

    let seen = reattach(&second, "rec0", None).await;

    assert_eq!(seen.last().unwrap().chunk_type, ChunkType::Completion);
    let starts = lines(&dir.path("starts"));
    assert_eq!(starts.len(), 1, "not called again");
    assert_eq!(
        lines(&dir.path("reconciled")),
        starts,
        "reconcile got the key"
    );
    let output = outputs(&seen);
    assert_eq!(output.len(), 1, "{seen:?}");
    assert_eq!(output[0].metadata["reconciled"], true);
    assert_eq!(output[0].metadata["ok"], true);
    assert!(output[0].metadata["result"]
        .as_str()
        .unwrap()
        .contains("it was done"));
    assert_eq!(audited(&dir, "resumed")[0]["how"], "reconciled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_that_says_not_done_calls_it_again_with_the_same_key() {
    let dir = Dir::new();
    let tools = tools(&dir, "reconcile = [\"sh\", \"-c\", \"exit 3\"]");
    let second = crash_mid_call(&dir, &tools, "rec3", "mark it").await;

    let seen = reattach(&second, "rec3", None).await;

    assert_eq!(seen.last().unwrap().chunk_type, ChunkType::Completion);
    let starts = lines(&dir.path("starts"));
    assert_eq!(starts.len(), 2);
    assert_eq!(starts[0], starts[1]);
    assert_eq!(outputs(&seen)[0].metadata["attempt"], 2);
}

/// A tool that declares neither: the run pauses on a reconcile pause.
async fn asked_to_reconcile(dir: &Dir, session: &str) -> (Binary, Chunk) {
    let tools = tools(dir, "");
    let second = crash_mid_call(dir, &tools, session, "mark it").await;
    let asked = reconcile_asked(&second, session).await;
    (second, asked)
}

/// The reconcile pause `server` asks on `session`, read from a re-attach.
async fn reconcile_asked(server: &Binary, session: &str) -> Chunk {
    let seen = reattach(server, session, Some("\"chunk_type\":\"input_request\"")).await;
    let asked = seen.last().unwrap().clone();
    assert_eq!(asked.chunk_type, ChunkType::InputRequest, "{seen:?}");
    asked
}

fn data(asked: &Chunk) -> Value {
    serde_json::to_value(asked).unwrap()["confirmation_data"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_declaration_a_person_chooses_run_again() {
    let dir = Dir::new();
    let (second, asked) = asked_to_reconcile(&dir, "again").await;
    let data = data(&asked);
    let key = lines(&dir.path("starts"))[0].clone();
    assert_eq!(data["kind"], "reconcile", "{data}");
    assert_eq!(data["options"], json!(["run_again", "skip", "cancel"]));
    assert_eq!(
        data["idempotency_key"],
        key.as_str(),
        "it names the call's key"
    );
    assert_eq!(data["task"]["index"], 1);
    assert_eq!(data["task"]["tool"], "mark");
    assert_eq!(data["attempt"], 1);
    assert!(
        data["started_at"].as_str().unwrap().ends_with('Z'),
        "{data}"
    );
    assert!(
        data["expires_at"].as_str().unwrap().ends_with('Z'),
        "{data}"
    );
    assert_eq!(asked.metadata["kind"], "reconcile");

    let rest = read_on(&second, "again").await;
    let (status, ack) = reply(&stream_url(&second), "again", "CONFIRM_ACTION:run_again").await;
    let after = rest.await.unwrap();

    assert_eq!(status, 200, "{ack:?}");
    assert_eq!(ack.metadata["action"], "run_again", "{ack:?}");
    assert_eq!(ack.metadata["kind"], "reconcile", "{ack:?}");
    assert_eq!(
        after.last().unwrap().chunk_type,
        ChunkType::Completion,
        "{after:?}"
    );
    let starts = lines(&dir.path("starts"));
    assert_eq!(
        starts,
        [key.clone(), key.clone()],
        "run again with the same key"
    );
    assert_eq!(lines(&dir.path("effects")), vec![key.clone()], "acted once");
    assert_eq!(audited(&dir, "resumed")[0]["how"], "asked");
    let asked_record = &audited(&dir, "reconcile_asked")[0];
    assert_eq!(asked_record["idempotency_key"], key.as_str());
    assert_eq!(asked_record["confirmation_id"], data["confirmation_id"]);
    let decided: Vec<Value> = audited(&dir, "decided")
        .into_iter()
        .filter(|r| r["confirmation_id"] == data["confirmation_id"])
        .collect();
    assert_eq!(decided.len(), 1, "{decided:?}");
    assert_eq!(decided[0]["action"], "run_again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_pause_refuses_what_it_does_not_offer() {
    let dir = Dir::new();
    let (second, asked) = asked_to_reconcile(&dir, "odd").await;
    let url = stream_url(&second);

    let (confirm, refused) = reply(&url, "odd", "CONFIRM_ACTION:confirm").await;
    let (answer, _) = reply(&url, "odd", "CONFIRM_ACTION:answer: run_again").await;

    assert_eq!(confirm, 422, "{refused:?}");
    assert_eq!(
        refused.metadata["error_type"], "invalid_confirm_action",
        "{refused:?}"
    );
    assert_eq!(answer, 422);
    let with_decisions = post(
        &url,
        json!({"message": "CONFIRM_ACTION:run_again", "session_id": "odd",
               "decisions": [{"index": 1, "decision": "approve"}]}),
        None,
    )
    .await;
    assert_eq!(with_decisions.status(), 422);
    let refused = chunks(&read_raw(with_decisions, None).await).remove(0);
    assert_eq!(
        refused.metadata["error_type"], "invalid_decision",
        "{refused:?}"
    );
    assert_eq!(lines(&dir.path("starts")).len(), 1, "nothing ran");
    // Still waiting: the right word decides it.
    let rest = read_on(&second, "odd").await;
    let (status, _) = reply(&url, "odd", "CONFIRM_ACTION:skip").await;
    assert_eq!(status, 200);
    let seen = rest.await.unwrap();
    assert_eq!(seen.last().unwrap().chunk_type, ChunkType::Completion);
    assert_eq!(asked.metadata["kind"], "reconcile");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_pause_outlives_a_second_crash_with_its_id_and_deadline() {
    let dir = Dir::new();
    let (mut second, asked) = asked_to_reconcile(&dir, "twice").await;
    second.child.kill().unwrap(); // SIGKILL while the reconcile waits
    second.child.wait().unwrap();
    let tools = dir.path("tools.toml").display().to_string();
    let audit = dir.path("audit.jsonl").display().to_string();
    let third = start(&dir, &["--tools", &tools, "--audit-log", &audit]);

    let again = reconcile_asked(&third, "twice").await;

    let (before, after) = (data(&asked), data(&again));
    assert_eq!(after["kind"], "reconcile");
    assert_eq!(
        after["confirmation_id"], before["confirmation_id"],
        "the same pause"
    );
    assert_eq!(
        after["expires_at"], before["expires_at"],
        "the same deadline"
    );
    assert_eq!(after["idempotency_key"], before["idempotency_key"]);
    let rest = read_on(&third, "twice").await;
    let (status, _) = reply(&stream_url(&third), "twice", "CONFIRM_ACTION:run_again").await;
    assert_eq!(status, 200);
    let seen = rest.await.unwrap();
    assert_eq!(seen.last().unwrap().chunk_type, ChunkType::Completion);
    let starts = lines(&dir.path("starts"));
    assert_eq!(
        starts.len(),
        2,
        "run again once, after the person said so: {starts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_again_needs_the_tools_approvers_and_quorum_not_the_requester() {
    let dir = Dir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(
        &keys,
        "agent-key-000001 label=ci-bot\n\
         approver lead-key-000001 label=lead-1 groups=leads\n\
         approver lead-key-000002 label=lead-2 groups=leads\n",
    )
    .unwrap();
    let keys = keys.display().to_string();
    let tools = tools(&dir, "approvals = 2");
    let audit = dir.path("audit.jsonl").display().to_string();
    let args = [
        "--tools",
        &tools,
        "--audit-log",
        &audit,
        "--api-keys-file",
        &keys,
    ];
    std::fs::write(dir.path("slow"), "").unwrap();
    let mut first = start(&dir, &args);
    let url = stream_url(&first);
    let opened = post_with(
        &url,
        Some("agent-key-000001"),
        json!({"message": "mark it", "session_id": "q"}),
        None,
    )
    .await;
    let seen = chunks(&read_raw(opened, Some("confirmation_request")).await);
    let id = seen.last().unwrap().metadata["confirmation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let decide = |key: &'static str, url: String, id: String, word: &'static str| async move {
        let body = json!({"message": word, "session_id": "q", "confirmation_id": id});
        let response = post_with(&url, Some(key), body, None).await;
        let status = response.status().as_u16();
        (status, chunks(&read_raw(response, None).await).remove(0))
    };
    for key in ["lead-key-000001", "lead-key-000002"] {
        let (status, chunk) = decide(key, url.clone(), id.clone(), "CONFIRM_ACTION:confirm").await;
        assert_eq!(status, 200, "{chunk:?}");
    }
    wait_lines(&dir.path("starts"), 1).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    std::fs::remove_file(dir.path("slow")).unwrap();
    let second = start(&dir, &args);
    let url = stream_url(&second);
    let back = post_with(
        &url,
        Some("agent-key-000001"),
        json!({"session_id": "q"}),
        Some(0),
    )
    .await;
    assert_eq!(back.status(), 200);
    let seen = chunks(&read_raw(back, Some("\"chunk_type\":\"input_request\"")).await);
    let asked = data(seen.last().unwrap());
    assert_eq!(asked["kind"], "reconcile", "{seen:?}");
    assert_eq!(asked["required"], 2, "{asked}");
    let rid = asked["confirmation_id"].as_str().unwrap().to_owned();

    let (own, refused) = decide(
        "agent-key-000001",
        url.clone(),
        rid.clone(),
        "CONFIRM_ACTION:run_again",
    )
    .await;
    let (one, recorded) = decide(
        "lead-key-000001",
        url.clone(),
        rid.clone(),
        "CONFIRM_ACTION:run_again",
    )
    .await;
    let ran_on_one = lines(&dir.path("starts")).len();
    let rest = post_with(
        &url,
        Some("agent-key-000001"),
        json!({"session_id": "q"}),
        Some(0),
    )
    .await;
    let rest = tokio::spawn(read_raw(rest, None));
    let (two, decided) = decide(
        "lead-key-000002",
        url.clone(),
        rid,
        "CONFIRM_ACTION:run_again",
    )
    .await;
    let after = chunks(&rest.await.unwrap());

    assert_eq!(own, 403, "the requester may not run it again: {refused:?}");
    assert_eq!(one, 200, "{recorded:?}");
    assert_eq!(
        recorded.chunk_type,
        ChunkType::ApprovalRecorded,
        "{recorded:?}"
    );
    assert_eq!(ran_on_one, 1, "nothing ran on one approval");
    assert_eq!(two, 200, "{decided:?}");
    assert_eq!(decided.metadata["approved_by"], json!(["lead-1", "lead-2"]));
    assert_eq!(
        after.last().unwrap().chunk_type,
        ChunkType::Completion,
        "{after:?}"
    );
    assert_eq!(
        lines(&dir.path("starts")).len(),
        2,
        "run again on two approvals"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_declaration_skip_records_it_as_not_run_and_cancel_ends_the_run() {
    let dir = Dir::new();
    let (second, _) = asked_to_reconcile(&dir, "skip").await;
    let rest = read_on(&second, "skip").await;
    let (status, _) = reply(&stream_url(&second), "skip", "CONFIRM_ACTION:skip").await;
    let seen = rest.await.unwrap();

    assert_eq!(status, 200);
    assert_eq!(
        seen.last().unwrap().chunk_type,
        ChunkType::Completion,
        "{seen:?}"
    );
    let skipped = outputs(&seen);
    let last = skipped
        .last()
        .unwrap_or_else(|| panic!("no tool_output: {seen:?}"));
    assert_eq!(last.metadata["skipped"], true, "{seen:?}");
    assert_eq!(lines(&dir.path("starts")).len(), 1, "not run again");
    drop(second);

    let dir = Dir::new();
    let (second, _) = asked_to_reconcile(&dir, "stop").await;
    let rest = read_on(&second, "stop").await;
    let (status, _) = reply(&stream_url(&second), "stop", "CONFIRM_ACTION:cancel").await;
    let seen = rest.await.unwrap();

    assert_eq!(status, 200);
    assert_eq!(seen.last().unwrap().chunk_type, ChunkType::Cancelled);
    assert_eq!(lines(&dir.path("starts")).len(), 1, "not run again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_task_is_shown_again_from_the_journal_and_never_run_twice() {
    let dir = Dir::new();
    let tools = tools(&dir, "idempotent = true");
    let second = crash_mid_call(&dir, &tools, "two", "note it; mark it").await;

    let seen = reattach(&second, "two", None).await;

    assert_eq!(seen.last().unwrap().chunk_type, ChunkType::Completion);
    assert_eq!(lines(&dir.path("notes")).len(), 1, "the note ran once");
    let output = outputs(&seen);
    let replayed: Vec<&&Chunk> = output
        .iter()
        .filter(|c| c.metadata.get("replayed") == Some(&json!(true)))
        .collect();
    assert_eq!(replayed.len(), 1, "{output:?}");
    assert_eq!(replayed[0].metadata["tool"], "note");
    assert_eq!(
        replayed[0].metadata["idempotency_key"],
        lines(&dir.path("notes"))[0].as_str()
    );
    let how: Vec<Value> = audited(&dir, "resumed")
        .iter()
        .map(|r| r["how"].clone())
        .collect();
    assert_eq!(how, [json!("replayed"), json!("reran")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_gets_its_key_in_its_output_and_two_calls_never_share_one() {
    let dir = Dir::new();
    let tools = tools(&dir, "");
    let server = start(&dir, &["--tools", &tools]);
    let reading: Reading = open_paused(
        &stream_url(&server),
        json!({"message": "note it; note it", "session_id": "keys"}),
    )
    .await;
    let (status, _) = reply(&stream_url(&server), "keys", "CONFIRM_ACTION:confirm").await;
    let seen = chunks(&reading.finish().await);

    assert_eq!(status, 200);
    let notes = lines(&dir.path("notes"));
    assert_eq!(notes.len(), 2);
    assert_ne!(notes[0], notes[1], "two calls, two keys");
    let keys: Vec<&Value> = outputs(&seen)
        .iter()
        .map(|c| &c.metadata["idempotency_key"])
        .collect();
    assert_eq!(keys, [&json!(notes[0]), &json!(notes[1])]);
}

#[cfg(feature = "openai")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_tool_gets_the_same_idempotency_key_header_on_both_attempts() {
    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
    use std::sync::{Arc, Mutex};
    let keys: Arc<Mutex<Vec<String>>> = Arc::default();
    let server = HttpServer::new({
        let keys = keys.clone();
        move || {
            let keys = keys.clone();
            App::new().route(
                "/pay",
                web::post().to(move |req: HttpRequest| {
                    let keys = keys.clone();
                    async move {
                        let key = req
                            .headers()
                            .get("Idempotency-Key")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_owned();
                        let first = {
                            let mut keys = keys.lock().unwrap();
                            keys.push(key);
                            keys.len() == 1
                        };
                        if first {
                            // Held until its server is killed.
                            tokio::time::sleep(Duration::from_secs(30)).await;
                        }
                        HttpResponse::Ok().body("paid")
                    }
                }),
            )
        }
    })
    .workers(2)
    .bind("127.0.0.1:0")
    .unwrap();
    let url = format!("http://{}/pay", server.addrs()[0]);
    tokio::spawn(server.run());
    let dir = Dir::new();
    let tools = dir.path("tools.toml");
    std::fs::write(
        &tools,
        format!(
            "[[tool]]\nname = \"pay\"\ndescription = \"Pays\"\nrisk = \"low\"\nhttp = \"{url}\"\n\
             idempotent = true\nparameters = {{ type = \"object\" }}\n"
        ),
    )
    .unwrap();
    let tools = tools.display().to_string();
    let mut first = start(&dir, &["--tools", &tools]);
    let reading = open_paused(
        &stream_url(&first),
        json!({"message": "pay it", "session_id": "pay"}),
    )
    .await;
    reply(&stream_url(&first), "pay", "CONFIRM_ACTION:confirm").await;
    let deadline = tokio::time::Instant::now() + WAIT;
    while keys.lock().unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "never called");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(reading);
    let second = start(&dir, &["--tools", &tools]);

    let seen = reattach(&second, "pay", None).await;

    assert_eq!(
        seen.last().unwrap().chunk_type,
        ChunkType::Completion,
        "{seen:?}"
    );
    let keys = keys.lock().unwrap().clone();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys[0].len(), 43);
    assert_eq!(keys[0], keys[1], "the same key on both attempts");
    assert_eq!(
        outputs(&seen)[0].metadata["idempotency_key"],
        keys[0].as_str()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recorded_modify_is_replanned_with_its_text_after_a_crash() {
    let dir = Dir::new();
    let mut first = start(&dir, &[]);
    let reading = open_paused(
        &stream_url(&first),
        json!({"message": "one; two", "session_id": "edit"}),
    )
    .await;
    terminate(&mut first);
    let seen = chunks(&reading.finish().await);
    let id = seen.last().unwrap().metadata["confirmation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    // The process died the instant after it kept a modify, before the new
    // plan was asked: its record holds the decision, as the decide path
    // writes it.
    let db = rusqlite::Connection::open(dir.path("runs.db")).unwrap();
    let decision = json!({"action": "modify", "confirmation_id": id, "decisions": null,
                          "text": "three; four; five", "nonce": "n1"});
    let changed = db
        .execute(
            "UPDATE paused_runs SET decision = ?1",
            [decision.to_string()],
        )
        .unwrap();
    assert_eq!(changed, 1);
    drop(db);

    let second = start(&dir, &[]);
    let asked = reattach(&second, "edit", Some("\"confirmation_round\":2")).await;

    let request = asked.last().unwrap();
    assert_eq!(
        request.chunk_type,
        ChunkType::ConfirmationRequest,
        "{asked:?}"
    );
    let data = serde_json::to_value(request).unwrap()["confirmation_data"].clone();
    assert_eq!(data["confirmation_round"], 2, "{data}");
    assert_eq!(
        data["tasks"].as_array().unwrap().len(),
        3,
        "replanned with the text: {data}"
    );
    assert!(
        data["tasks"][2]["description"]
            .as_str()
            .unwrap()
            .contains("three; four; five"),
        "{data}"
    );
    let received = asked
        .iter()
        .find(|c| c.chunk_type == ChunkType::ConfirmationReceived)
        .unwrap_or_else(|| panic!("{asked:?}"));
    assert_eq!(received.metadata["action"], "modify");
    let (status, _) = reply(&stream_url(&second), "edit", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_pause_is_announced_with_links_and_its_page_runs_it_again() {
    let receiver = crate::webhooks::Receiver::start().await;
    let dir = Dir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(
        &keys,
        "agent-key-000001 label=ci-bot\napprover lead-key-000001 label=lead-1 groups=leads\n",
    )
    .unwrap();
    let keys = keys.display().to_string();
    let tools = tools(&dir, "");
    let audit = dir.path("audit.jsonl").display().to_string();
    let args = [
        "--tools",
        &tools,
        "--audit-log",
        &audit,
        "--api-keys-file",
        &keys,
        "--webhook",
        &receiver.url,
        "--webhook-secret",
        "a-webhook-secret-0123",
        "--public-url",
        "https://gate.example",
        "--link-secret",
        "a-link-secret-that-is-long-enough-0123",
    ];
    std::fs::write(dir.path("slow"), "").unwrap();
    let mut first = start(&dir, &args);
    let url = stream_url(&first);
    let opened = post_with(
        &url,
        Some("agent-key-000001"),
        json!({"message": "mark it", "session_id": "ln"}),
        None,
    )
    .await;
    read_raw(opened, Some("confirmation_request")).await;
    let body = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "ln"});
    let confirmed = post_with(&url, Some("agent-key-000001"), body, None).await;
    assert_eq!(confirmed.status(), 200);
    wait_lines(&dir.path("starts"), 1).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    std::fs::remove_file(dir.path("slow")).unwrap();
    let second = start(&dir, &args);

    // `interaction.requested` of kind reconcile, with a link per person.
    let mut n = 1;
    let requested = loop {
        let seen = receiver.wait_for(n).await;
        let found = seen.into_iter().find(|d| {
            d.event == "interaction.requested" && d.body.to_string().contains("\"reconcile\"")
        });
        match found {
            Some(found) => break found,
            None => n += 1,
        }
    };
    let lead = requested.body["links"]
        .as_array()
        .expect("links")
        .iter()
        .find(|link| link["label"] == "lead-1")
        .unwrap_or_else(|| panic!("{}", requested.body))["url"]
        .as_str()
        .unwrap()
        .replace("https://gate.example", &second.url);
    let client = reqwest::Client::new();
    let page = client.get(&lead).send().await.unwrap();
    assert_eq!(page.status(), 200);
    let page = page.text().await.unwrap();
    let key = lines(&dir.path("starts"))[0].clone();
    assert!(page.contains("value=\"run_again\""), "{page}");
    assert!(page.contains(&key), "the page names the key: {page}");
    assert_eq!(lines(&dir.path("starts")).len(), 1, "a GET decides nothing");

    let rest = post_with(
        &stream_url(&second),
        Some("agent-key-000001"),
        json!({"session_id": "ln"}),
        Some(0),
    )
    .await;
    let rest = tokio::spawn(read_raw(rest, None));
    let posted = client
        .post(&lead)
        .form(&[("action", "run_again")])
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status(), 200, "{:?}", posted.text().await);
    let seen = chunks(&rest.await.unwrap());

    assert_eq!(
        seen.last().unwrap().chunk_type,
        ChunkType::Completion,
        "{seen:?}"
    );
    assert_eq!(
        lines(&dir.path("starts")),
        [key.clone(), key],
        "run again, same key"
    );
    let decided = audited(&dir, "decided");
    let by_link = decided.last().unwrap();
    assert_eq!(by_link["action"], "run_again");
    assert_eq!(by_link["key"], "lead-1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reconcile_pause_nobody_answers_ends_the_run_and_nothing_runs() {
    let dir = Dir::new();
    let tools = tools(&dir, "");
    let extra = ["--confirm-timeout", "2s"];
    let second = crash_mid_call_with(&dir, &tools, "quiet", "mark it", &extra).await;

    let seen = reattach(&second, "quiet", None).await;

    let asked = seen
        .iter()
        .find(|c| c.chunk_type == ChunkType::InputRequest)
        .unwrap_or_else(|| panic!("{seen:?}"));
    assert_eq!(asked.metadata["kind"], "reconcile");
    let last = seen.last().unwrap();
    assert_eq!(last.chunk_type, ChunkType::Cancelled, "{seen:?}");
    assert_eq!(last.metadata["reason"], "timeout", "{last:?}");
    assert_eq!(lines(&dir.path("starts")).len(), 1, "not run again");
}

/// The `openai` engine's conversation goes on with the results: a tool
/// call the model made and a person confirmed, cut short by `kill -9`, is
/// called again (idempotent) after the restart, and the model gets its
/// result in the same conversation.
#[cfg(feature = "openai")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_run_cut_mid_call_goes_on_and_its_model_gets_the_result() {
    use crate::model_server::{event, fake_model, tokens};
    let call = json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_mark",
        "type": "function", "function": {"name": "mark", "arguments": "{}"}}]}}]});
    let end = json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]});
    let model = fake_model(vec![
        format!("{}{}data: [DONE]\n\n", event(&call), event(&end)),
        tokens(&["Marked ", "once."]),
    ])
    .await;
    let dir = Dir::new();
    let tools = tools(&dir, "idempotent = true");
    let extra = [
        "--engine",
        "openai",
        "--llm-url",
        &model.url,
        "--llm-model",
        "m",
    ];
    let second = crash_mid_call_with(&dir, &tools, "llm", "mark it", &extra).await;

    let seen = reattach(&second, "llm", None).await;

    assert_eq!(
        seen.last().unwrap().chunk_type,
        ChunkType::Completion,
        "{seen:?}"
    );
    let starts = lines(&dir.path("starts"));
    assert_eq!(starts.len(), 2, "called again once: {starts:?}");
    assert_eq!(starts[0], starts[1], "with the same key");
    assert_eq!(
        lines(&dir.path("effects")),
        vec![starts[0].clone()],
        "acted once"
    );
    let text: String = seen
        .iter()
        .filter(|c| c.chunk_type == ChunkType::Content)
        .map(|c| c.chunk.as_str())
        .collect();
    assert!(text.ends_with("Marked once."), "{text:?}");
    let requests = model.requests();
    assert_eq!(
        requests.len(),
        2,
        "the call, then its result after the restart"
    );
    let messages = requests[1]["messages"].as_array().unwrap();
    assert_eq!(messages[1]["content"], "mark it", "the same conversation");
    let result = messages.last().unwrap();
    assert_eq!(result["role"], "tool");
    assert_eq!(result["tool_call_id"], "call_mark");
    assert!(
        result["content"].as_str().unwrap().contains("marked"),
        "{result}"
    );
}
