//! Declared tools behind the gate, over real sockets: a tool runs only after
//! a yes, exactly once, as decided per task, and on the record.

use std::path::{Path, PathBuf};
use std::time::Duration;

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::helpers::{
    confirmation_id, error_type, one_chunk, reason, spawn_app_with, EventStream, TestApp,
};

/// A directory of its own for one test: tools file, notes, audit log.
pub(crate) struct Workdir(tempfile::TempDir);

impl Workdir {
    pub(crate) fn new() -> Workdir {
        Workdir(tempfile::tempdir().unwrap())
    }

    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// The notes the `note` tool wrote, one per line.
    pub(crate) fn notes(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("notes/notes.txt"))
            .map(|text| text.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Writes a tools file: `note` (the example's write_note into this
    /// directory) plus `extra` TOML.
    pub(crate) fn tools(&self, extra: &str) -> PathBuf {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tools/write_note.py");
        let text = format!(
            r#"
[[tool]]
name = "note"
description = "Append a note"
risk = "low"
command = ["python3", "{script}", "{notes}"]
timeout_secs = 10
parameters = {{ type = "object", properties = {{ step = {{ type = "string", maxLength = 60 }} }}, required = ["step"] }}
{extra}
"#,
            script = script.display(),
            notes = self.path("notes").display(),
        );
        let path = self.path("tools.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    /// The audit log's records.
    pub(crate) fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }
}

pub(crate) async fn app_with_tools(
    dir: &Workdir,
    extra: &str,
    configure: impl FnOnce(&mut chatgate::config::Settings),
) -> TestApp {
    let tools = dir.tools(extra);
    let audit = dir.path("audit.jsonl");
    spawn_app_with(move |s| {
        s.tooling.tools = Some(tools);
        s.tooling.audit_log = Some(audit);
        configure(s);
    })
    .await
}

/// POSTs a confirm with `decisions`.
pub(crate) async fn confirm_with(
    app: &TestApp,
    session: &str,
    decisions: Value,
) -> reqwest::Response {
    app.post_json(&json!({
        "message": "CONFIRM_ACTION:confirm",
        "session_id": session,
        "decisions": decisions,
    }))
    .await
}

pub(crate) fn outputs(stream: &EventStream) -> Vec<&chatgate::protocol::Chunk> {
    stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::ToolOutput)
        .collect()
}

#[tokio::test]
async fn a_confirmed_tool_step_runs_exactly_once_and_is_on_the_record() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, request) = app.open_paused("once", "note buy milk; then rest").await;

    assert!(dir.notes().is_empty(), "nothing runs before the yes");
    let (status, _) = app.reply("once", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    assert_eq!(status, 200);
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note buy milk"]);
    let output = outputs(&stream)[0];
    assert_eq!(output.metadata["tool"], "note");
    assert_eq!(output.metadata["ok"], true);
    assert_eq!(output.metadata["skipped"], false);
    assert_eq!(output.metadata["truncated"], false);
    assert!(output.metadata["duration_ms"].is_u64());
    assert!(output.metadata["result"]
        .as_str()
        .unwrap()
        .contains("note buy milk"));
    assert!(!output.chunk.contains('\n'), "one-line summary");
    // The `ended` record follows the final chunk: wait for it.
    let (events, _) = crate::durable::ended_trail(&dir.path("audit.jsonl"), "once").await;
    assert_eq!(events, ["proposed", "decided", "executed", "ended"]);
    let audit = dir.audit();
    assert_eq!(audit[0]["confirmation_id"], confirmation_id(&request));
    assert_eq!(audit[0]["session_id"], "once");
    assert_eq!(audit[0]["tasks"][0]["args"]["step"], "note buy milk");
    assert_eq!(audit[1]["action"], "confirm");
    assert_eq!(audit[1]["key"], "anonymous");
    assert_eq!(audit[1]["client"], "127.0.0.1");
    assert_eq!(audit[2]["tool"], "note");
    assert_eq!(audit[2]["args"]["step"], "note buy milk");
    assert_eq!(audit[2]["exit_status"], 0);
    assert_eq!(audit[2]["output_sha256"].as_str().unwrap().len(), 64);
    assert_eq!(audit[3]["outcome"], "completion");
}

#[tokio::test]
async fn cancel_timeout_supersede_and_modify_run_nothing() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |s| {
        s.pauses.confirm_timeout = Duration::from_millis(400)
    })
    .await;

    let (mut cancelled, _) = app.open_paused("c", "note one").await;
    app.reply("c", "CONFIRM_ACTION:cancel").await;
    assert_eq!(reason(&cancelled.finish().await), "user");

    let (mut timed_out, _) = app.open_paused("t", "note two").await;
    assert_eq!(reason(&timed_out.finish().await), "timeout");

    let (mut superseded, _) = app.open_paused("s", "note three").await;
    let (mut successor, _) = app.open_paused("s", "rest").await;
    assert_eq!(reason(&superseded.finish().await), "superseded");

    let (mut modified, _) = app.open_paused("m", "note four").await;
    app.reply("m", "CONFIRM_ACTION:modify:also note five").await;
    modified.until(ChunkType::ConfirmationRequest).await;
    app.reply("m", "CONFIRM_ACTION:cancel").await;
    assert_eq!(reason(&modified.finish().await), "user");
    app.reply("s", "CONFIRM_ACTION:cancel").await;
    successor.finish().await;

    assert!(dir.notes().is_empty(), "{:?}", dir.notes());
    app.registry_drains().await;
    assert!(!dir.audit().iter().any(|r| r["event"] == "executed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_racing_confirms_run_the_tool_once() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, _) = app.open_paused("race", "note raced").await;

    let replies = futures_util::future::join_all(
        (0..50).map(|_| app.reply("race", "CONFIRM_ACTION:confirm")),
    )
    .await;
    let last = stream.finish().await;

    assert_eq!(
        replies.iter().filter(|(status, _)| *status == 200).count(),
        1
    );
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note raced"]);
}

#[tokio::test]
async fn a_rejected_call_is_skipped_and_an_edited_one_runs_with_the_new_arguments() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, _) = app
        .open_paused("per", "note first; note second; note third")
        .await;

    let response = confirm_with(
        &app,
        "per",
        json!([
            {"index": 1, "decision": "reject", "reason": "not that"},
            {"index": 2, "decision": "edit", "args": {"step": "edited second"}},
            {"index": 3, "decision": "respond", "result": "done by hand"}
        ]),
    )
    .await;
    let (status, ack) = one_chunk(response).await;
    let last = stream.finish().await;

    assert_eq!(status, 200);
    assert_eq!(ack.metadata["decisions"][0]["decision"], "reject");
    assert_eq!(
        ack.metadata["decisions"][1]["args"]["step"],
        "edited second"
    );
    assert_eq!(dir.notes(), ["edited second"], "only the edited call ran");
    // What is shown running is what runs: the edit, not the plan's step.
    let statuses: Vec<&str> = stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::Status)
        .map(|c| c.chunk.as_str())
        .collect();
    assert_eq!(statuses, ["Step 2/3: edited second (edited)"]);
    let outputs = outputs(&stream);
    assert_eq!(outputs[0].metadata["skipped"], true);
    assert_eq!(outputs[0].metadata["ok"], false);
    assert!(outputs[0].metadata["error"]
        .as_str()
        .unwrap()
        .contains("not that"));
    assert_eq!(outputs[1].metadata["ok"], true);
    assert_eq!(outputs[2].metadata["skipped"], true);
    assert_eq!(outputs[2].metadata["result"], "done by hand");
    let received = stream
        .chunks
        .iter()
        .find(|c| c.chunk_type == ChunkType::ConfirmationReceived)
        .unwrap();
    assert_eq!(received.metadata["decisions"][2]["decision"], "respond");
    assert_eq!(last.chunk_type, ChunkType::Completion);
    app.registry_drains().await;
    let decided = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "decided")
        .unwrap();
    assert_eq!(decided["decisions"][0]["reason"], "not that");
    let executed: Vec<Value> = dir
        .audit()
        .into_iter()
        .filter(|r| r["event"] == "executed")
        .collect();
    assert_eq!(executed.len(), 1);
    assert_eq!(executed[0]["args"]["step"], "edited second");
}

#[tokio::test]
async fn invalid_decisions_are_422_and_leave_the_pause_untouched() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, _) = app.open_paused("bad", "note a; rest").await;
    let cases = [
        json!([{"index": 3, "decision": "approve"}]),
        json!([{"index": 1, "decision": "approve"}, {"index": 1, "decision": "reject"}]),
        json!([{"index": 1, "decision": "maybe"}]),
        json!([{"index": 1, "decision": "edit"}]),
        json!([{"index": 1, "decision": "edit", "args": {"step": 5}}]),
        json!([{"index": 1, "decision": "edit", "args": {"step": "x".repeat(61)}}]),
        json!([{"index": 2, "decision": "respond"}]),
    ];

    for decisions in cases {
        let (status, chunk) = one_chunk(confirm_with(&app, "bad", decisions.clone()).await).await;
        assert_eq!(status, 422, "{decisions}");
        assert_eq!(error_type(&chunk), "invalid_decision", "{decisions}");
    }
    let with_cancel = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:cancel", "session_id": "bad",
                            "decisions": [{"index": 1, "decision": "reject"}]}),
        )
        .await;
    let (status, chunk) = one_chunk(with_cancel).await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (422, "invalid_decision")
    );
    let stale = app
        .post_json(&json!({"message": "CONFIRM_ACTION:confirm", "session_id": "bad",
                            "confirmation_id": "not-it", "decisions": [{"index": 9, "decision": "x"}]}))
        .await;
    assert_eq!(
        one_chunk(stale).await.0,
        409,
        "stale is checked before the decisions"
    );

    let (ok, _) = app.reply("bad", "CONFIRM_ACTION:confirm").await;
    assert_eq!(ok, 200, "the pause was untouched");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note a"]);
}

#[tokio::test]
async fn a_step_whose_arguments_do_not_fit_its_tool_ends_before_anything_is_asked() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;

    let long_step = format!("note {}", "x".repeat(70));
    let mut stream = app.open("fit", &format!("rest; {long_step}")).await;
    let last = stream.finish().await;

    assert_eq!(error_type(&last), "invalid_tool_args");
    assert!(last.chunk.contains("step 2"), "{}", last.chunk);
    assert!(!stream.types().contains(&ChunkType::ConfirmationRequest));
}

#[tokio::test]
async fn a_failing_a_slow_and_a_chatty_tool_are_reported() {
    let dir = Workdir::new();
    let extra = r#"
[[tool]]
name = "broken"
description = "Always fails"
risk = "medium"
command = ["sh", "-c", "echo it broke >&2; exit 4"]
parameters = { type = "object" }

[[tool]]
name = "slow"
description = "Sleeps, with a child"
risk = "low"
command = ["sh", "-c", "sleep 30 & sleep 30"]
timeout_secs = 0.3
parameters = { type = "object" }

[[tool]]
name = "chatty"
description = "Writes a lot"
risk = "low"
command = ["sh", "-c", "head -c 100000 /dev/zero | tr '\\0' y"]
parameters = { type = "object" }
"#;
    let app = app_with_tools(&dir, extra, |_| {}).await;

    let (mut chatty, request) = app.open_paused("chatty", "chatty now; broken then").await;
    assert_eq!(
        request.approval().unwrap().risk_level,
        chatgate::protocol::RiskLevel::Medium
    );
    app.reply("chatty", "CONFIRM_ACTION:confirm").await;
    let last = chatty.finish().await;
    let outputs = outputs(&chatty);
    assert_eq!(outputs[0].metadata["truncated"], true);
    assert_eq!(
        outputs[0].metadata["result"].as_str().unwrap().len(),
        64 * 1024
    );
    assert_eq!(outputs[1].metadata["ok"], false);
    assert!(outputs[1].metadata["error"]
        .as_str()
        .unwrap()
        .contains("exit status 4: it broke"));
    assert_eq!(error_type(&last), "task_failed");

    let started = std::time::Instant::now();
    let (mut slow, _) = app.open_paused("slow", "slow down").await;
    app.reply("slow", "CONFIRM_ACTION:confirm").await;
    let last = slow.finish().await;
    let output = outputs_of(&slow);
    assert!(output.metadata["error"]
        .as_str()
        .unwrap()
        .starts_with("timed out after 300ms"));
    assert_eq!(error_type(&last), "task_failed");
    assert!(started.elapsed() < Duration::from_secs(10));
}

fn outputs_of(stream: &EventStream) -> &chatgate::protocol::Chunk {
    outputs(stream)[0]
}

#[tokio::test]
async fn an_http_tool_posts_the_arguments_to_a_real_server() {
    use actix_web::{web, App, HttpResponse, HttpServer};
    let server = HttpServer::new(|| {
        App::new().route(
            "/hook",
            web::post().to(|body: web::Json<Value>| async move {
                HttpResponse::Ok().json(json!({"got": body.into_inner()}))
            }),
        )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let url = format!("http://{}/hook", server.addrs()[0]);
    tokio::spawn(server.run());
    let dir = Workdir::new();
    let extra = format!(
        r#"
[[tool]]
name = "hook"
description = "Calls the hook"
risk = "high"
http = "{url}"
parameters = {{ type = "object" }}
"#
    );
    let app = app_with_tools(&dir, &extra, |_| {}).await;

    let (mut stream, request) = app.open_paused("hook", "hook it").await;
    app.reply("hook", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    assert_eq!(
        request.approval().unwrap().risk_level,
        chatgate::protocol::RiskLevel::High
    );
    assert_eq!(last.chunk_type, ChunkType::Completion);
    let result: Value =
        serde_json::from_str(outputs_of(&stream).metadata["result"].as_str().unwrap()).unwrap();
    assert_eq!(result["got"]["step"], "hook it");
    app.registry_drains().await;
    let executed = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "executed")
        .unwrap();
    assert_eq!(executed["http_status"], 200);
}

#[tokio::test]
async fn an_audit_log_that_cannot_be_written_refuses_the_decision_and_nothing_runs() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, _) = app.open_paused("closed", "note never").await;
    // The log's path becomes a directory: no record can be written there.
    std::fs::remove_file(dir.path("audit.jsonl")).unwrap();
    std::fs::create_dir(dir.path("audit.jsonl")).unwrap();

    let (status, chunk) = app.reply("closed", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;
    let (ready, body) = app.get("/readyz").await;

    assert_eq!(status, 503);
    assert_eq!(error_type(&chunk), "audit_unavailable");
    assert_eq!(error_type(&last), "audit_unavailable");
    assert!(dir.notes().is_empty(), "nothing ran");
    assert_eq!(ready, 503);
    assert!(body.contains("audit.jsonl"), "{body}");
    // A new run cannot even be proposed while the log is unwritable.
    let mut refused = app.open("closed-2", "note later").await;
    assert_eq!(error_type(&refused.finish().await), "audit_unavailable");
    assert!(!refused.types().contains(&ChunkType::ConfirmationRequest));

    std::fs::remove_dir(dir.path("audit.jsonl")).unwrap();
    let (mut again, _) = app.open_paused("closed-3", "note recovered").await;
    assert_eq!(
        app.get("/readyz").await.0,
        200,
        "healthy once a record is written"
    );
    app.reply("closed-3", "CONFIRM_ACTION:confirm").await;
    assert_eq!(again.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note recovered"]);
}

#[test]
fn a_bad_tools_file_stops_the_start_with_one_line_naming_file_tool_and_key() {
    let dir = Workdir::new();
    let path = dir.path("bad.toml");
    std::fs::write(
        &path,
        "[[tool]]\nname = \"x\"\ndescription = \"d\"\nrisk = \"low\"\ncommand = [\"true\"]\nhttp = \"http://127.0.0.1:1/\"\nparameters = { type = \"object\" }\n",
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
        .args(["--bind", "127.0.0.1:0", "--tools"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&path.display().to_string()), "{stderr}");
    assert!(stderr.contains("tool \"x\""), "{stderr}");
    assert!(stderr.contains("`command` and `http`"), "{stderr}");
}

#[tokio::test]
async fn a_shutdown_stops_a_running_command_and_its_outcome_is_reported_and_recorded() {
    let dir = Workdir::new();
    let extra = r#"
[[tool]]
name = "wait"
description = "Waits long"
risk = "low"
command = ["sleep", "30"]
parameters = { type = "object" }
"#;
    let app = app_with_tools(&dir, extra, |_| {}).await;
    let (mut stream, _) = app.open_paused("down", "wait a while").await;
    app.reply("down", "CONFIRM_ACTION:confirm").await;
    stream.until(ChunkType::Status).await;
    let started = std::time::Instant::now();

    app.shutdown.cancel();
    let last = stream.finish().await;

    assert!(
        started.elapsed() < Duration::from_secs(5),
        "SIGTERM, not the 30 s sleep"
    );
    let output = outputs_of(&stream);
    assert_eq!(output.metadata["ok"], false);
    assert!(output.metadata["error"]
        .as_str()
        .unwrap()
        .contains("stopped"));
    assert_eq!(reason(&last), "shutdown");
    let executed = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "executed")
        .unwrap();
    assert_eq!(executed["ok"], false);
}

/// A tool that takes half a second, then appends its arguments to `marks`.
fn slow_mark(dir: &Workdir) -> String {
    format!(
        r#"
[[tool]]
name = "mark"
description = "Slowly marks"
risk = "low"
command = ["sh", "-c", "sleep 0.5; cat >> {marks}; echo >> {marks}"]
parameters = {{ type = "object" }}
"#,
        marks = dir.path("marks").display()
    )
}

fn marks(dir: &Workdir) -> usize {
    std::fs::read_to_string(dir.path("marks"))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_re_attaches_and_new_messages_while_a_tool_runs_run_nothing_twice() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, &slow_mark(&dir), |_| {}).await;
    let (stream, request) = app.open_paused("busy", "mark it").await;
    app.reply("busy", "CONFIRM_ACTION:confirm").await;
    drop(stream); // the client goes; the run goes on (grace 60 s)

    let again: Vec<u16> = futures_util::future::join_all(
        (0..10).map(|_| app.reply("busy", "CONFIRM_ACTION:confirm")),
    )
    .await
    .into_iter()
    .map(|(status, _)| status.as_u16())
    .collect();
    let (busy, chunk) = one_chunk(app.chat("busy", "mark it again").await).await;
    let mut back = EventStream::resumed(
        app.reattach("busy", request.sequence).await,
        request.sequence,
    );
    let last = back.finish().await;

    assert!(again.iter().all(|s| *s == 409 || *s == 404), "{again:?}");
    assert_eq!((busy.as_u16(), error_type(&chunk)), (409, "session_busy"));
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(marks(&dir), 1, "ran exactly once");
    app.registry_drains().await;
    let executed = dir
        .audit()
        .into_iter()
        .filter(|r| r["event"] == "executed")
        .count();
    assert_eq!(executed, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_a_tool_runs_stops_it_once_and_records_it() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, &slow_mark(&dir), |s| {
        s.server.keep_alive = Duration::from_millis(50);
        s.pauses.detach_grace = Duration::ZERO;
    })
    .await;
    let (mut stream, _) = app.open_paused("gone", "mark it").await;
    app.reply("gone", "CONFIRM_ACTION:confirm").await;
    stream.until(ChunkType::Status).await;

    drop(stream);
    app.registry_drains().await;
    tokio::time::sleep(Duration::from_millis(800)).await;

    assert_eq!(marks(&dir), 0, "stopped before it wrote");
    let audit = dir.audit();
    let executed: Vec<&Value> = audit.iter().filter(|r| r["event"] == "executed").collect();
    assert_eq!(executed.len(), 1);
    assert_eq!(executed[0]["ok"], false);
    let ended = audit.iter().find(|r| r["event"] == "ended").unwrap();
    assert_eq!(ended["reason"], "client_gone");
}

#[tokio::test]
async fn an_unreachable_http_tool_says_refused_and_never_shows_its_url_to_the_client() {
    // A port just freed: nothing listens there.
    let port = crate::helpers::free_port();
    let dir = Workdir::new();
    let extra = format!(
        r#"
[[tool]]
name = "hook"
description = "Calls the hook"
risk = "low"
http = "http://user:pw-s3cret@127.0.0.1:{port}/hook?token=t0ken-s3cret"
parameters = {{ type = "object" }}
"#
    );
    let app = app_with_tools(&dir, &extra, |_| {}).await;

    let (mut stream, _) = app.open_paused("down", "hook it").await;
    app.reply("down", "CONFIRM_ACTION:confirm").await;
    stream.finish().await;

    let output = outputs_of(&stream);
    assert_eq!(output.metadata["ok"], false);
    let error = output.metadata["error"].as_str().unwrap();
    assert!(
        error.to_lowercase().contains("connection refused"),
        "{error}"
    );
    let everything = serde_json::to_string(&stream.chunks).unwrap();
    assert!(!everything.contains("s3cret"), "{everything}");
}

#[tokio::test]
async fn a_step_with_no_tool_says_it_is_simulated_on_the_card_and_in_its_output() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;

    let (mut stream, request) = app.open_paused("sim", "note hello; tidy up").await;
    let tasks = &request.approval().unwrap().tasks;
    app.reply("sim", "CONFIRM_ACTION:confirm").await;
    stream.finish().await;

    // The card: which task runs a real tool, and which decisions each takes.
    assert!(!tasks[0].simulated);
    assert!(tasks[1].simulated);
    let raw = serde_json::to_value(request.approval().unwrap()).unwrap();
    assert_eq!(
        raw["tasks"][0]["decisions"],
        json!(["approve", "reject", "edit", "respond"])
    );
    assert_eq!(
        raw["tasks"][1]["decisions"],
        json!(["approve", "reject", "respond"])
    );
    assert_eq!(raw["tasks"][1]["simulated"], true);
    assert!(raw["tasks"][0].get("simulated").is_none());
    let outputs = outputs(&stream);
    assert!(outputs[0].metadata.get("simulated").is_none());
    assert_eq!(outputs[1].metadata["simulated"], true);
    assert_eq!(dir.notes(), ["note hello"]);
}

#[tokio::test]
async fn a_misspelt_tool_is_refused_before_anything_is_asked_with_did_you_mean() {
    let dir = Workdir::new();
    let extra = r#"
[[tool]]
name = "fs__write_file"
description = "Writes"
risk = "high"
command = ["true"]
parameters = { type = "object" }
"#;
    let app = app_with_tools(&dir, extra, |_| {}).await;
    for (i, (step, meant)) in [
        (r#"fs__write_fil {"path": "x"}"#, "fs__write_file"),
        ("notes hello", "note"),
        ("fs__anything at all", "fs__write_file"),
    ]
    .into_iter()
    .enumerate()
    {
        let mut stream = app.open(&format!("typo-{i}"), step).await;
        let last = stream.finish().await;
        assert_eq!(error_type(&last), "unknown_tool", "{last:?}");
        assert!(
            last.chunk.contains(&format!("did you mean `{meant}`")),
            "{last:?}"
        );
        assert!(!stream.types().contains(&ChunkType::ConfirmationRequest));
    }
    // Plain words far from every name stay steps to pretend.
    let (_, request) = app.open_paused("plain", "tidy the desk; notify").await;
    assert!(request
        .approval()
        .unwrap()
        .tasks
        .iter()
        .all(|t| t.simulated));
}

#[tokio::test]
async fn a_json_object_after_a_declared_tool_s_name_is_its_arguments_checked_by_its_schema() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;

    let (mut stream, request) = app
        .open_paused("args", r#"note {"step": "from json"}"#)
        .await;
    let task = &request.approval().unwrap().tasks[0];
    assert_eq!(task.tool, "note");
    assert_eq!(task.args, Some(json!({"step": "from json"})));
    app.reply("args", "CONFIRM_ACTION:confirm").await;
    stream.finish().await;
    assert_eq!(dir.notes(), ["from json"]);

    // An object that does not fit the schema: refused before it is asked.
    let mut stream = app.open("bad-args", r#"note {"step": 5}"#).await;
    let last = stream.finish().await;
    assert_eq!(error_type(&last), "invalid_tool_args", "{last:?}");
}

#[tokio::test]
async fn the_offered_tools_are_listed_for_whoever_may_use_the_chat() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |s| s.server.api_keys = vec!["list-key".into()]).await;
    let url = format!("{}/api/v1/tools", app.address);

    let refused = reqwest::get(&url).await.unwrap();
    let listed = app
        .client
        .get(&url)
        .bearer_auth("list-key")
        .send()
        .await
        .unwrap();

    assert_eq!(refused.status(), 401);
    assert_eq!(listed.status(), 200);
    let body: Value = listed.json().await.unwrap();
    let note = &body["tools"][0];
    assert_eq!(note["name"], "note");
    assert_eq!(note["description"], "Append a note");
    assert_eq!(note["risk"], "low");
    assert_eq!(note["confirm"], true);
    assert_eq!(note["source"], json!({"kind": "file"}));
    assert_eq!(note["parameters"]["required"], json!(["step"]));
    assert_eq!(body["tools"].as_array().unwrap().len(), 1);
}
