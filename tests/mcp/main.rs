//! MCP servers behind the gate, against real servers over real sockets: the
//! reference filesystem server (npm) and a server written with the official
//! Python SDK (tests/mcp/servers/asker.py).
//!
//! They need what tests/mcp/setup.sh installs, so they are ignored by a plain
//! `cargo test`; .ci/run runs `tests/mcp/setup.sh` and then
//! `cargo test --test mcp -- --ignored`.

#[path = "../common/mod.rs"]
mod common;
#[allow(dead_code)]
#[path = "../api/helpers.rs"]
mod helpers;
#[cfg(feature = "openai")]
#[allow(dead_code)]
#[path = "../api/model_server.rs"]
mod model_server;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use chatgate::protocol::{Chunk, ChunkType};
use serde_json::{json, Value};

use helpers::{confirmation_id, error_type, reason, spawn_app_with, EventStream, TestApp, WAIT};

const SETUP: &str = "needs the MCP servers: run tests/mcp/setup.sh";

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp")
}

/// A directory of its own for one test: the tools file, the filesystem
/// server's root, the Python server's log, the audit log.
struct Workdir(tempfile::TempDir);

impl Workdir {
    fn new() -> Workdir {
        let python = here().join(".venv/bin/python");
        assert!(python.exists(), "{SETUP}");
        Workdir(tempfile::tempdir().unwrap())
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }

    /// What the Python server did, one line per call past its question.
    fn server_log(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("asker.log"))
            .map(|text| text.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// A tools file with both servers (`fs` rooted in `data/`, `ask`) and
    /// `extra` TOML.
    fn tools(&self, ask_timeout: f64, extra: &str) -> PathBuf {
        std::fs::create_dir_all(self.path("data")).unwrap();
        let fs = here().join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
        assert!(fs.exists(), "{SETUP}");
        let text = format!(
            r#"
[[mcp]]
name = "fs"
command = ["node", "{fs}", "{data}"]

[[mcp]]
name = "ask"
command = ["{python}", "{script}", "--log", "{log}"]
timeout_secs = {ask_timeout}
{extra}
"#,
            fs = fs.display(),
            data = self.path("data").display(),
            python = here().join(".venv/bin/python").display(),
            script = here().join("servers/asker.py").display(),
            log = self.path("asker.log").display(),
        );
        let path = self.path("tools.toml");
        std::fs::write(&path, text).unwrap();
        path
    }

    fn audit(&self) -> Vec<Value> {
        std::fs::read_to_string(self.path("audit.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    }

    fn executed(&self) -> Vec<Value> {
        self.audit()
            .into_iter()
            .filter(|r| r["event"] == "executed")
            .collect()
    }
}

async fn app(
    dir: &Workdir,
    ask_timeout: f64,
    configure: impl FnOnce(&mut chatgate::config::Settings),
) -> TestApp {
    let tools = dir.tools(ask_timeout, "");
    let audit = dir.path("audit.jsonl");
    spawn_app_with(move |s| {
        s.tooling.tools = Some(tools);
        s.tooling.audit_log = Some(audit);
        configure(s);
    })
    .await
}

fn outputs(stream: &EventStream) -> Vec<&Chunk> {
    stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::ToolOutput)
        .collect()
}

/// Opens a run of `message`, confirms its plan, and returns the stream.
async fn confirmed(app: &TestApp, session: &str, message: &str) -> EventStream {
    let (stream, _) = app.open_paused(session, message).await;
    let (status, _) = app.reply(session, "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    stream
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn the_handshake_offers_2025_11_25() {
    let dir = Workdir::new();
    let app = app(&dir, 10.0, |_| {}).await;
    let mut stream = confirmed(&app, "rev", "ask__revision").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(outputs(&stream)[0].metadata["result"], "2025-11-25");
    // The listing names each tool's server.
    let (status, body) = app.get("/api/v1/tools").await;
    assert_eq!(status, 200);
    let listed: Value = serde_json::from_str(&body).unwrap();
    let revision = listed["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "ask__revision")
        .unwrap();
    assert_eq!(
        revision["source"],
        json!({"kind": "mcp", "server": "ask", "tool": "revision"})
    );
    assert_eq!(revision["risk"], "low");
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn the_filesystem_server_lists_and_reads_after_a_yes() {
    let dir = Workdir::new();
    std::fs::create_dir_all(dir.path("data")).unwrap();
    std::fs::write(dir.path("data/hello.txt"), "hello from the disk\n").unwrap();
    let app = app(&dir, 10.0, |_| {}).await;
    let data = dir.path("data");

    let message = format!(
        "fs__list_directory {}\nfs__read_text_file {}",
        json!({"path": data}),
        json!({"path": data.join("hello.txt")})
    );
    let (mut stream, request) = app.open_paused("fs-read", &message).await;
    let tasks = &request.confirmation_data.as_ref().unwrap();
    let tasks = serde_json::to_value(tasks).unwrap()["tasks"].clone();
    assert_eq!(tasks[0]["tool"], "fs__list_directory");
    assert_eq!(tasks[1]["args"], json!({"path": data.join("hello.txt")}));
    // The server says both are read-only: low risk.
    assert_eq!(tasks[0]["risk_level"], "low", "{tasks}");
    app.reply("fs-read", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion, "{last:?}");
    let outputs = outputs(&stream);
    assert!(outputs[0].metadata["result"]
        .as_str()
        .unwrap()
        .contains("hello.txt"));
    assert_eq!(outputs[1].metadata["result"], "hello from the disk\n");
    assert_eq!(outputs[1].metadata["ok"], true);
    let executed = dir.executed();
    assert_eq!(executed.len(), 2);
    assert_eq!(executed[1]["args"], json!({"path": data.join("hello.txt")}));
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn a_gated_write_happens_once_on_confirm_and_never_on_cancel_reject_or_timeout() {
    let dir = Workdir::new();
    let app = app(&dir, 10.0, |s| {
        s.pauses.confirm_timeout = Duration::from_secs(2)
    })
    .await;
    let write = |name: &str| {
        format!(
            "fs__write_file {}",
            json!({"path": dir.path("data").join(name), "content": "written"})
        )
    };

    // Cancel: nothing written.
    let (mut stream, request) = app.open_paused("w-cancel", &write("cancel.txt")).await;
    let risk = serde_json::to_value(request.confirmation_data.as_ref().unwrap()).unwrap();
    assert_eq!(
        risk["tasks"][0]["risk_level"], "high",
        "destructiveHint: {risk}"
    );
    app.reply("w-cancel", "CONFIRM_ACTION:cancel").await;
    assert_eq!(reason(&stream.finish().await), "user");

    // Reject the one task: nothing written, the run completes.
    let (mut stream, _) = app.open_paused("w-reject", &write("reject.txt")).await;
    let response = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:confirm", "session_id": "w-reject",
                           "decisions": [{"index": 1, "decision": "reject"}]}),
        )
        .await;
    assert_eq!(response.status(), 200);
    stream.finish().await;
    assert_eq!(outputs(&stream)[0].metadata["skipped"], true);

    // Silence: the timeout cancels, nothing written.
    let (mut stream, _) = app.open_paused("w-timeout", &write("timeout.txt")).await;
    assert_eq!(reason(&stream.finish().await), "timeout");

    // Confirm: written once.
    let mut stream = confirmed(&app, "w-yes", &write("yes.txt")).await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);

    // Edit: the edited arguments are checked and are what runs.
    let (mut stream, _) = app.open_paused("w-edit", &write("draft.txt")).await;
    let edited = json!({"path": dir.path("data").join("edited.txt"), "content": "edited"});
    let bad = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:confirm", "session_id": "w-edit",
                           "decisions": [{"index": 1, "decision": "edit", "args": {"path": 5}}]}),
        )
        .await;
    assert_eq!(bad.status(), 422, "an edit that does not fit the schema");
    let response = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:confirm", "session_id": "w-edit",
                           "decisions": [{"index": 1, "decision": "edit", "args": edited}]}),
        )
        .await;
    assert_eq!(response.status(), 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert!(!dir.path("data/draft.txt").exists());
    assert_eq!(
        std::fs::read_to_string(dir.path("data/edited.txt")).unwrap(),
        "edited"
    );

    for name in ["cancel.txt", "reject.txt", "timeout.txt"] {
        assert!(!dir.path("data").join(name).exists(), "{name} was written");
    }
    assert_eq!(
        std::fs::read_to_string(dir.path("data/yes.txt")).unwrap(),
        "written"
    );
    let executed = dir.executed();
    assert_eq!(executed.len(), 2, "{executed:?}");
    assert_eq!(executed[1]["args"], edited, "the exact arguments sent");
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn thirty_racing_confirms_write_once() {
    let dir = Workdir::new();
    let app = app(&dir, 10.0, |_| {}).await;
    let message = format!(
        "fs__write_file {}",
        json!({"path": dir.path("data/race.txt"), "content": "once"})
    );
    let (mut stream, _) = app.open_paused("race", &message).await;
    let replies = (0..30).map(|_| app.reply("race", "CONFIRM_ACTION:confirm"));
    let statuses: Vec<u16> = futures_util::future::join_all(replies)
        .await
        .into_iter()
        .map(|(status, _)| status.as_u16())
        .collect();
    let last = stream.finish().await;

    assert_eq!(
        statuses.iter().filter(|s| **s == 200).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(outputs(&stream).len(), 1);
    assert_eq!(dir.executed().len(), 1);
    assert_eq!(
        std::fs::read_to_string(dir.path("data/race.txt")).unwrap(),
        "once"
    );
}

/// Confirms `ask__deploy` and waits for the server's question.
async fn deploy_asked(app: &TestApp, session: &str) -> (EventStream, Chunk) {
    let mut stream = confirmed(app, session, r#"ask__deploy {"service": "web"}"#).await;
    let question = stream.until(ChunkType::InputRequest).await;
    (stream, question)
}

/// #26: a server's log lines during a call name the run it is for
/// (its session, number and key), as every log line about a run does.
#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn a_server_s_log_lines_during_a_call_name_its_run() {
    let dir = Workdir::new();
    let tools = dir.tools(10.0, "");
    let server = common::start_binary(&["--tools", tools.to_str().unwrap()]);
    let client = reqwest::Client::new();
    let url = format!("{}/api/v1/chat/stream", server.url);
    let session = r#"logged "one""#;
    let post = |message: &str| {
        client
            .post(&url)
            .json(&json!({"message": message, "session_id": session}))
            .send()
    };
    let opened = post(r#"ask__deploy {"service": "api"}"#).await.unwrap();
    let mut stream = EventStream::new(opened);
    stream.until(ChunkType::ConfirmationRequest).await;
    assert_eq!(post("CONFIRM_ACTION:confirm").await.unwrap().status(), 200);
    // The server logged before it asked; the call waits on the question
    // until it is answered, so its line comes while the call is in flight.
    stream.until(ChunkType::InputRequest).await;
    let deadline = Instant::now() + WAIT;
    let line = loop {
        let logs = server.logs.lock().unwrap().clone();
        if let Some(line) = logs
            .iter()
            .find(|l| l.contains("asking where to deploy api"))
        {
            break line.clone();
        }
        assert!(Instant::now() < deadline, "{logs:#?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(
        line.contains(r#"session="logged \"one\"" run="#)
            && line.contains("key=anonymous: MCP server ask (Info)"),
        "{line}"
    );
    assert_eq!(post("CONFIRM_ACTION:skip").await.unwrap().status(), 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn the_server_s_question_is_asked_on_the_stream_and_answered() {
    let dir = Workdir::new();
    // 1 s per call: the time the person takes does not count.
    let app = app(&dir, 1.0, |_| {}).await;
    let (mut stream, question) = deploy_asked(&app, "elicit").await;

    let data = serde_json::to_value(question.confirmation_data.as_ref().unwrap()).unwrap();
    assert_eq!(data["kind"], "question");
    assert_eq!(data["title"], "Deploy web where?");
    assert_eq!(data["options"], json!(["answer", "skip", "cancel"]));
    let region = &data["questions"][0];
    assert_eq!(region["id"], "region");
    assert_eq!(region["question"], "Where to deploy?");
    let labels: Vec<&str> = region["options"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["eu-west", "us-east"]);
    let replicas = &data["questions"][1];
    assert_eq!(replicas["schema"]["type"], "integer");
    assert_eq!(replicas["schema"]["maximum"], 5);
    assert!(
        dir.server_log().is_empty(),
        "the server waits for the answer"
    );

    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Out of range: refused, the pause untouched.
    let bad = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:answer", "session_id": "elicit",
                           "answers": {"region": "us-east", "replicas": 9}}),
        )
        .await;
    assert_eq!(bad.status(), 422);
    let (status, received) = app.reply("elicit", "CONFIRM_ACTION:answer").await;
    assert_eq!(status, 422, "{received:?}");
    let answered = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:answer", "session_id": "elicit",
                           "confirmation_id": confirmation_id(&question),
                           "answers": {"region": "us-east", "replicas": "3"}}),
        )
        .await;
    assert_eq!(answered.status(), 200);
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion, "{last:?}");
    assert_eq!(dir.server_log(), ["deployed web to us-east x3"]);
    let output = outputs(&stream)[0];
    assert_eq!(output.metadata["result"], "deployed web to us-east x3");
    let asked: Vec<Value> = dir
        .audit()
        .into_iter()
        .filter(|r| r["event"] == "asked" || r["event"] == "answered")
        .collect();
    assert_eq!(asked.len(), 2, "{asked:?}");
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn skip_declines_cancel_and_timeout_cancel_the_server_s_question() {
    let dir = Workdir::new();
    let app = app(&dir, 10.0, |s| {
        s.pauses.confirm_timeout = Duration::from_secs(2)
    })
    .await;

    let (mut stream, _) = deploy_asked(&app, "skip").await;
    let (status, _) = app.reply("skip", "CONFIRM_ACTION:skip").await;
    assert_eq!(status, 200);
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion, "{last:?}");
    assert_eq!(
        outputs(&stream)[0].metadata["result"],
        "not deployed: decline"
    );

    let (mut stream, _) = deploy_asked(&app, "cancel").await;
    app.reply("cancel", "CONFIRM_ACTION:cancel").await;
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(reason(&last), "user");

    let (mut stream, _) = deploy_asked(&app, "timeout").await;
    let last = stream.finish().await;
    assert_eq!(reason(&last), "timeout");

    // The server was told each time; it deployed nothing.
    let deadline = Instant::now() + WAIT;
    while dir.server_log().len() < 3 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        dir.server_log(),
        ["decline web", "cancel web", "cancel web"]
    );
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn an_error_result_a_slow_call_and_a_huge_result_are_bounded_outcomes() {
    let dir = Workdir::new();
    let app = app(&dir, 1.0, |_| {}).await;

    let mut stream = confirmed(&app, "fail", r#"ask__fail {"why": "no"}"#).await;
    let last = stream.finish().await;
    assert_eq!(error_type(&last), "task_failed");
    let output = outputs(&stream)[0];
    assert_eq!(output.metadata["ok"], false);
    assert!(
        output.metadata["error"]
            .as_str()
            .unwrap()
            .contains("refused: no"),
        "{output:?}"
    );

    let started = Instant::now();
    let mut stream = confirmed(&app, "slow", r#"ask__slow {"seconds": 30}"#).await;
    stream.finish().await;
    let output = outputs(&stream)[0];
    assert_eq!(output.metadata["error"], "timed out after 1s");
    assert!(started.elapsed() < Duration::from_secs(10));
    // A call given up on restarts its server (see below).
    ready_again(&app).await;

    let mut stream = confirmed(&app, "big", r#"ask__huge {"kib": 1024}"#).await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let output = outputs(&stream)[0];
    assert_eq!(output.metadata["truncated"], true);
    assert_eq!(
        output.metadata["result"].as_str().unwrap().len(),
        chatgate::tools::MAX_OUTPUT_BYTES
    );

    // Over the message bound: dropped unread, the call fails at once.
    let started = Instant::now();
    let mut stream = confirmed(&app, "huge", r#"ask__huge {"kib": 6000}"#).await;
    stream.finish().await;
    let output = outputs(&stream)[0];
    assert!(
        output.metadata["error"]
            .as_str()
            .unwrap()
            .contains("over 4 MiB"),
        "{output:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // The server is still there.
    let mut stream = confirmed(&app, "after", r#"ask__echo {"text": "still here"}"#).await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(outputs(&stream)[0].metadata["result"], "still here");
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn a_server_that_crashes_mid_call_fails_the_call_and_is_restarted() {
    let dir = Workdir::new();
    let app = app(&dir, 10.0, |_| {}).await;
    let pid = |stream: &EventStream| outputs(stream)[0].metadata["result"].clone();
    let mut stream = confirmed(&app, "pid-1", "ask__pid").await;
    stream.finish().await;
    let first = pid(&stream);

    let mut stream = confirmed(&app, "crash", "ask__crash").await;
    let last = stream.finish().await;
    assert_eq!(error_type(&last), "task_failed");
    let error = outputs(&stream)[0].metadata["error"].clone();
    assert_eq!(error, "MCP server ask exited during the call");

    // Down: /readyz names it, and calls fail at once.
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.contains("mcp_unavailable") && body.contains("\"ask\""),
        "{body}"
    );
    let mut stream = confirmed(&app, "while-down", "ask__pid").await;
    stream.finish().await;
    let error = outputs(&stream)[0].metadata["error"].clone();
    assert_eq!(error, "MCP server ask is not running");
    // Back after its backoff (1 s).
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = app.get("/readyz").await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "not restarted: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut stream = confirmed(&app, "pid-2", "ask__pid").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_ne!(pid(&stream), first, "a new process");
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn a_server_that_cannot_start_or_a_name_taken_twice_stops_the_start_in_one_line() {
    let dir = Workdir::new();
    let build = |tools: PathBuf| async move {
        let mut settings = chatgate::config::Settings::for_bind("127.0.0.1:0");
        settings.tooling.tools = Some(tools);
        match chatgate::startup::Application::build(settings).await {
            Ok(_) => panic!("started"),
            Err(err) => err.to_string(),
        }
    };
    let broken = dir.path("broken.toml");
    std::fs::write(&broken, "[[mcp]]\nname = \"dead\"\ncommand = [\"false\"]\n").unwrap();
    let line = build(broken.clone()).await;
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.contains(&broken.display().to_string()) && line.contains("mcp \"dead\""),
        "{line}"
    );

    let twice = dir.tools(10.0, "[[tool]]\nname = \"ask__echo\"\ndescription = \"x\"\nrisk = \"low\"\ncommand = [\"cat\"]\nparameters = { type = \"object\" }\n");
    let line = build(twice).await;
    assert!(
        line.contains("ask__echo") && line.contains("declared tool"),
        "{line}"
    );

    let allow = dir.tools(10.0, "allow = [\"echo\", \"nope\"]");
    let line = build(allow).await;
    assert!(line.contains("allow") && line.contains("nope"), "{line}");
}

#[cfg(feature = "openai")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/mcp/setup.sh"]
async fn the_openai_engine_calls_an_mcp_tool_after_the_yes() {
    use chatgate::engine::llm::OpenAiConfig;
    use chatgate::engine::openai::OpenAiEngine;
    use model_server::{event, fake_model, tokens};

    let dir = Workdir::new();
    let path = dir.path("data").join("from-model.txt");
    let arguments = json!({"path": path, "content": "the model wrote this"}).to_string();
    let call = json!({"choices": [{"delta": {"tool_calls": [{"index": 0, "id": "call_1",
        "type": "function", "function": {"name": "fs__write_file", "arguments": arguments}}]}}]});
    let end = json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]});
    let answer = format!("{}{}data: [DONE]\n\n", event(&call), event(&end));
    let model = fake_model(vec![answer, tokens(&["Written."])]).await;
    let mut config = OpenAiConfig::new(&model.url, "test-model");
    config.timeout = Duration::from_secs(5);
    let engine = std::sync::Arc::new(OpenAiEngine::new(config).unwrap());
    let tools = dir.tools(10.0, "");
    let audit = dir.path("audit.jsonl");
    let app = helpers::spawn_app_with_engine(
        move |s| {
            s.tooling.tools = Some(tools);
            s.tooling.audit_log = Some(audit);
        },
        engine,
    )
    .await;

    let (mut stream, request) = app.open_paused("model", "write a file").await;
    let offered: Vec<String> = model.requests()[0]["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        offered.iter().any(|name| name == "fs__write_file"),
        "{offered:?}"
    );
    assert!(
        offered.iter().any(|name| name == "ask__deploy"),
        "{offered:?}"
    );
    let data = request.approval().unwrap();
    assert_eq!(data.tasks[0].tool, "fs__write_file");
    assert!(!path.exists(), "nothing before the yes");
    app.reply("model", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion, "{last:?}");
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        "the model wrote this"
    );
    let told = &model.requests()[1]["messages"];
    let result = told
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .unwrap();
    assert!(
        result["content"]
            .as_str()
            .unwrap()
            .contains("Successfully wrote"),
        "{result}"
    );
    assert_eq!(dir.executed().len(), 1);
}

fn alive(pid: u32) -> bool {
    // A zombie has been killed; only its parent has not reaped it yet.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| !stat.contains(") Z "))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/mcp/setup.sh"]
async fn a_call_asking_when_chatgate_is_killed_is_put_to_a_person_after_the_restart() {
    let dir = Workdir::new();
    let tools = dir.tools(10.0, "");
    let store = format!("sqlite:{}", dir.path("store.db").display());
    let args = [
        "--tools",
        tools.to_str().unwrap(),
        "--store",
        &store,
        "--step-delay",
        "0",
    ];
    let mut first = common::start_binary(&args);
    let client = reqwest::Client::new();
    let chat = |url: &str, body: Value| {
        client
            .post(format!("{url}/api/v1/chat/stream"))
            .json(&body)
            .send()
    };
    let url = first.url.clone();
    let mut stream = EventStream::new(
        chat(&url, json!({"message": "ask__pid", "session_id": "pid"}))
            .await
            .unwrap(),
    );
    stream.until(ChunkType::ConfirmationRequest).await;
    chat(
        &url,
        json!({"message": "CONFIRM_ACTION:confirm", "session_id": "pid"}),
    )
    .await
    .unwrap();
    stream.finish().await;
    let pid: u32 = outputs(&stream)[0].metadata["result"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();

    let mut stream = EventStream::new(
        chat(
            &url,
            json!({"message": r#"ask__deploy {"service": "db"}"#, "session_id": "cut"}),
        )
        .await
        .unwrap(),
    );
    stream.until(ChunkType::ConfirmationRequest).await;
    chat(
        &url,
        json!({"message": "CONFIRM_ACTION:confirm", "session_id": "cut"}),
    )
    .await
    .unwrap();
    stream.until(ChunkType::InputRequest).await;
    assert!(alive(pid));

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let deadline = Instant::now() + WAIT;
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "the MCP server outlived chatgate"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let second = common::start_binary(&args);
    let replay = client
        .post(format!("{}/api/v1/chat/stream", second.url))
        .header("Last-Event-ID", "0")
        .json(&json!({"session_id": "cut"}))
        .send()
        .await
        .unwrap();
    let mut replay = EventStream::new(replay);
    // The run goes on from its journal (#44): the call the crash cut short
    // (it was asking) may have run, and its tool declares neither
    // `idempotent` nor `reconcile`, so a person is asked.
    let asked = replay.until(ChunkType::InputRequest).await;
    let data = serde_json::to_value(&asked).unwrap()["confirmation_data"].clone();
    assert_eq!(data["kind"], "reconcile", "{asked:?}");
    assert_eq!(data["options"], json!(["run_again", "skip", "cancel"]));
    let (status, _) = {
        let response = chat(
            &second.url,
            json!({"message": "CONFIRM_ACTION:cancel", "session_id": "cut"}),
        )
        .await
        .unwrap();
        (response.status(), response.text().await.unwrap())
    };
    assert_eq!(status, 200);
    let last = replay.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Cancelled, "{last:?}");
    assert!(
        dir.server_log().is_empty(),
        "nothing deployed: {:?}",
        dir.server_log()
    );
}

/// The Python server on streamable HTTP, on a free loopback port; killed on
/// drop.
#[cfg(feature = "openai")]
struct HttpServer {
    child: std::process::Child,
    url: String,
}

#[cfg(feature = "openai")]
impl HttpServer {
    fn start() -> HttpServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = std::process::Command::new(here().join(".venv/bin/python"))
            .arg(here().join("servers/asker.py"))
            .args(["--http", &port.to_string()])
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("the Python server starts");
        let deadline = Instant::now() + WAIT;
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the HTTP MCP server did not listen"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        HttpServer {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        }
    }
}

#[cfg(feature = "openai")]
impl Drop for HttpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(feature = "openai")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/mcp/setup.sh"]
async fn a_streamable_http_server_gets_its_headers_asks_its_questions_and_is_reconnected() {
    let dir = Workdir::new();
    let mut server = HttpServer::start();
    let tools = dir.path("http.toml");
    std::fs::write(
        &tools,
        format!(
            "[[mcp]]\nname = \"web\"\nurl = \"{}\"\nheaders = {{ \"X-Chatgate-Test\" = \"path=${{PATH}}\" }}\n",
            server.url
        ),
    )
    .unwrap();
    let app = spawn_app_with(move |s| s.tooling.tools = Some(tools)).await;

    let mut stream = confirmed(&app, "header", "web__header").await;
    stream.finish().await;
    let expected = format!("path={}", std::env::var("PATH").unwrap());
    assert_eq!(outputs(&stream)[0].metadata["result"], expected.as_str());

    let mut stream = confirmed(&app, "ask", r#"web__deploy {"service": "api"}"#).await;
    stream.until(ChunkType::InputRequest).await;
    let answered = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:answer", "session_id": "ask",
                           "answers": {"region": "eu-west", "replicas": 2}}),
        )
        .await;
    assert_eq!(answered.status(), 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(
        outputs(&stream)[0].metadata["result"],
        "deployed api to eu-west x2"
    );

    // The server goes away: the next call fails and the server is down...
    let port = server
        .url
        .split(':')
        .nth(2)
        .unwrap()
        .trim_end_matches("/mcp")
        .to_owned();
    let _ = server.child.kill();
    let _ = server.child.wait();
    let mut stream = confirmed(&app, "gone", "web__header").await;
    assert_eq!(error_type(&stream.finish().await), "task_failed");
    assert_eq!(
        outputs(&stream)[0].metadata["error"],
        "MCP server web could not be reached during the call"
    );
    let (status, body) = app.get("/readyz").await;
    assert_eq!(status, 503, "{body}");
    // ...until it is back on the same address.
    let mut again = std::process::Command::new(here().join(".venv/bin/python"))
        .arg(here().join("servers/asker.py"))
        .args(["--http", &port])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, body) = app.get("/readyz").await;
        if status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "not reconnected: {body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut stream = confirmed(&app, "back", "web__header").await;
    let last = stream.finish().await;
    let _ = again.kill();
    let _ = again.wait();
    assert_eq!(last.chunk_type, ChunkType::Completion, "{last:?}");
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn roots_and_sampling_are_refused_and_a_changed_tool_list_is_read_again() {
    let dir = Workdir::new();
    let app = app(&dir, 10.0, |_| {}).await;

    let mut stream = confirmed(&app, "borrow", "ask__borrow").await;
    stream.finish().await;
    let said = outputs(&stream)[0].metadata["result"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        said.contains("roots: refused (chatgate does not offer roots"),
        "{said}"
    );
    assert!(said.contains("sampling: refused"), "{said}");

    let mut stream = confirmed(&app, "retire", r#"ask__retire {"name": "echo"}"#).await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let mut stream = confirmed(&app, "gone", r#"ask__echo {"text": "x"}"#).await;
    assert_eq!(error_type(&stream.finish().await), "task_failed");
    assert_eq!(
        outputs(&stream)[0].metadata["error"],
        "MCP server ask no longer offers `echo`"
    );
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn a_tool_list_is_bounded_and_a_second_question_at_once_is_declined() {
    let dir = Workdir::new();
    let python = here().join(".venv/bin/python");
    let script = here().join("servers/asker.py");
    let log = dir.path("asker.log");
    let server = |extra: usize| {
        format!(
            "[[mcp]]\nname = \"many\"\ncommand = [\"{}\", \"{}\", \"--extra-tools\", \"{extra}\", \"--log\", \"{}\"]\n",
            python.display(),
            script.display(),
            log.display()
        )
    };
    // Past 128 tools: refused at start, in one line.
    let too_many = dir.path("many.toml");
    std::fs::write(&too_many, server(130)).unwrap();
    let mut settings = chatgate::config::Settings::for_bind("127.0.0.1:0");
    settings.tooling.tools = Some(too_many);
    let line = match chatgate::startup::Application::build(settings).await {
        Ok(_) => panic!("started with 130 more tools"),
        Err(err) => err.to_string(),
    };
    assert!(
        line.contains("mcp \"many\"") && line.contains("more than 128 tools"),
        "{line}"
    );

    // Within it: offered, a long description cut to 4 KiB.
    let some = dir.path("some.toml");
    std::fs::write(&some, server(3)).unwrap();
    let model_sees = {
        let mut tools = chatgate::tools::Tools::load(&some).unwrap();
        tools.start_mcp().await.unwrap();
        let tool = tools.get("many__extra_0").unwrap();
        tool.description.chars().count()
    };
    assert_eq!(model_sees, chatgate::tools::mcp::MAX_DESCRIPTION_CHARS);

    // Two questions at once from one call: the first is asked, the second
    // declined at once.
    let app = spawn_app_with(move |s| {
        s.tooling.tools = Some(some);
        s.pauses.confirm_timeout = Duration::from_secs(5);
    })
    .await;
    let mut stream = confirmed(&app, "twice", "many__ask_twice").await;
    let question = stream.until(ChunkType::InputRequest).await;
    // Answered only once the server has the other one back (declined): an
    // answer sent sooner could free the first before the second arrives.
    let deadline = Instant::now() + WAIT;
    while dir.server_log().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the second question never came back"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(dir.server_log(), ["one came back"]);
    let answered = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:answer", "session_id": "twice",
                           "answers": {"region": "eu-west", "replicas": 1}}),
        )
        .await;
    assert_eq!(answered.status(), 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let result = outputs(&stream)[0].metadata["result"].clone();
    assert!(
        result == "first: accept, second: decline" || result == "first: decline, second: accept",
        "{result} after {question:?}"
    );
    let asked = stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::InputRequest)
        .count();
    assert_eq!(asked, 1);
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn a_call_s_progress_shows_as_status_chunks() {
    let dir = Workdir::new();
    let app = app(&dir, 10.0, |_| {}).await;
    let mut stream = confirmed(&app, "steps", r#"ask__steps {"n": 3}"#).await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let shown: Vec<&str> = stream
        .chunks
        .iter()
        .filter(|c| {
            c.chunk_type == ChunkType::Status
                && c.metadata.get("tool") == Some(&json!("ask__steps"))
        })
        .map(|c| c.chunk.as_str())
        .collect();
    assert_eq!(
        shown,
        [
            "ask__steps: 1/3: step 1",
            "ask__steps: 2/3: step 2",
            "ask__steps: 3/3: step 3"
        ]
    );
    assert_eq!(outputs(&stream)[0].metadata["result"], "3 steps");
}

#[tokio::test]
#[ignore = "needs tests/mcp/setup.sh"]
async fn same_titled_choices_reach_the_server_as_the_one_the_person_picked() {
    let dir = Workdir::new();
    let app = app(&dir, 10.0, |_| {}).await;
    for (at, expected) in ["/srv/a/report.pdf", "/srv/b/report.pdf"]
        .iter()
        .enumerate()
    {
        let session = format!("pick-{at}");
        let mut stream = confirmed(&app, &session, "ask__pick").await;
        let question = stream.until(ChunkType::InputRequest).await;
        let data = serde_json::to_value(question.confirmation_data.as_ref().unwrap()).unwrap();
        let option = data["questions"][0]["options"][at].clone();
        assert!(option["label"].as_str().unwrap().starts_with("report.pdf"));
        // By label (what a person reads) and by id: the same option.
        let by = if at == 0 {
            &option["id"]
        } else {
            &option["label"]
        };
        let answered = app
            .post_json(
                &json!({"message": "CONFIRM_ACTION:answer", "session_id": session,
                               "answers": {"file": by}}),
            )
            .await;
        assert_eq!(answered.status(), 200);
        assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
        assert_eq!(
            outputs(&stream)[0].metadata["result"],
            format!("picked {expected}")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/mcp/setup.sh"]
async fn a_call_given_up_on_restarts_its_server_and_its_late_question_reaches_no_other_run() {
    let dir = Workdir::new();
    // 1 s per call; the server works 3 s, then asks.
    let app = app(&dir, 1.0, |_| {}).await;
    let mut first = confirmed(&app, "first", r#"ask__late {"seconds": 3}"#).await;
    first.finish().await;
    let output = outputs(&first)[0];
    assert_eq!(output.metadata["ok"], false);
    assert!(output.metadata["error"]
        .as_str()
        .unwrap()
        .contains("timed out"));
    let pid: u32 = dir.server_log()[0]
        .strip_prefix("late pid=")
        .unwrap()
        .parse()
        .unwrap();

    // The server that was working on it is gone: it asks nobody.
    let deadline = Instant::now() + WAIT;
    while alive(pid) {
        assert!(Instant::now() < deadline, "{pid} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Back (a fresh process); the next run, another session, is asked its
    // own question only.
    ready_again(&app).await;
    let (mut second, question) = deploy_asked(&app, "second").await;
    assert_eq!(question.chunk, "Deploy web where?");
    let answered = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:answer", "session_id": "second",
                           "answers": {"region": "eu-west", "replicas": 1}}),
        )
        .await;
    assert_eq!(answered.status(), 200);
    assert_eq!(second.finish().await.chunk_type, ChunkType::Completion);
    let asked = second
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::InputRequest)
        .count();
    assert_eq!(asked, 1);
    let log = dir.server_log();
    assert!(
        !log.iter().any(|l| l.starts_with("late question")),
        "{log:?}"
    );
    assert_eq!(log.last().unwrap(), "deployed web to eu-west x1");
}

/// Waits until every server is up again (`/readyz` 200).
async fn ready_again(app: &TestApp) {
    let deadline = Instant::now() + WAIT;
    while app.get("/readyz").await.0 != 200 {
        assert!(Instant::now() < deadline, "never ready again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/mcp/setup.sh"]
async fn an_mcp_call_gets_its_receipt_in_meta_and_pyjwt_verifies_it() {
    let dir = Workdir::new();
    let app = app(&dir, 10.0, |_| {}).await;
    let mut stream = confirmed(&app, "stamp", r#"ask__stamp {"text": "hi"}"#).await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);

    let line = dir
        .server_log()
        .into_iter()
        .find(|line| line.starts_with("receipt "))
        .expect("the server recorded the call's _meta");
    let token = line.trim_start_matches("receipt ").to_owned();
    assert_eq!(outputs(&stream)[0].metadata["receipt"], token.as_str());
    // Its idempotency key (#44) in `_meta` too, as the output shows it.
    let key = dir
        .server_log()
        .into_iter()
        .find_map(|line| line.strip_prefix("idempotency_key ").map(str::to_owned))
        .expect("the server recorded the call's key");
    assert_eq!(key.len(), 43, "{key}");
    assert_eq!(
        outputs(&stream)[0].metadata["idempotency_key"],
        key.as_str()
    );
    let pyjwt = TestAppAddress(app.address.clone());
    let claims = tokio::task::spawn_blocking(move || pyjwt.verify(&token))
        .await
        .unwrap()
        .expect("PyJWT verifies the receipt");
    assert_eq!(claims["task"]["tool"], "ask__stamp");
    assert_eq!(claims["session_id"], "stamp");
    assert_eq!(claims["via"], "chat");
    assert_eq!(claims["approved_by"], json!(["anonymous"]));
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
        br#"{"args":{"text":"hi"},"tool":"ask__stamp"}"#,
    ));
    assert_eq!(claims["task"]["args_digest"], digest.as_str());
    // One changed character of the payload: PyJWT refuses it.
    let token = line.trim_start_matches("receipt ");
    let mut parts: Vec<String> = token.split('.').map(str::to_owned).collect();
    let last = parts[1].pop().unwrap();
    parts[1].push(if last == 'A' { 'B' } else { 'A' });
    let forged = parts.join(".");
    let refused =
        tokio::task::spawn_blocking(move || TestAppAddress(app.address.clone()).verify(&forged))
            .await
            .unwrap();
    assert!(refused.is_err(), "{refused:?}");
}

/// A server's address, for a blocking check with PyJWT
/// (tests/mcp/servers/verify_receipt.py): it fetches the JWKS over HTTP
/// while the server keeps serving.
struct TestAppAddress(String);

impl TestAppAddress {
    /// `token` verified against the server's JWKS: its claims, or why not.
    fn verify(&self, token: &str) -> Result<Value, String> {
        let output = std::process::Command::new(here().join(".venv/bin/python"))
            .arg(here().join("servers/verify_receipt.py"))
            .arg(format!("{}/.well-known/jwks.json", self.0))
            .arg(token)
            .output()
            .unwrap();
        if output.status.success() {
            Ok(serde_json::from_slice(&output.stdout).unwrap())
        } else {
            Err(String::from_utf8_lossy(&output.stderr).into_owned())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs tests/mcp/setup.sh"]
async fn an_mcp_tool_s_preview_is_another_tool_of_its_server_called_with_the_same_arguments() {
    let dir = Workdir::new();
    let tools = dir.tools(10.0, "preview_tool = { stamp = \"echo\" }\nrecheck = true");
    let audit = dir.path("audit.jsonl");
    let app = spawn_app_with(move |s| {
        s.tooling.tools = Some(tools);
        s.tooling.audit_log = Some(audit);
    })
    .await;
    let (mut stream, request) = app
        .open_paused("pv", r#"ask__stamp {"text": "hello"}"#)
        .await;
    let preview = request.approval().unwrap().tasks[0]
        .preview
        .clone()
        .expect("the card shows the preview");
    assert!(preview.ok);
    assert_eq!(preview.body, "hello");
    let (status, _) = app.reply("pv", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    // recheck ran `echo` again, saw the same, and the call ran.
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert!(dir
        .server_log()
        .iter()
        .any(|line| line.starts_with("receipt ey")));
    assert_eq!(
        dir.executed().len(),
        1,
        "the preview is not an executed call"
    );
}
