//! The `openai` engine with declared tools, and the model server's stream as
//! real servers send it, against the scripted model server.

use std::path::Path;
use std::time::Duration;

use chatgate::protocol::{ChunkType, RiskLevel};
use futures_util::StreamExt;
use serde_json::{json, Value};

use crate::helpers::{error_type, one_chunk, reason};
use crate::model_server::{content, event, fake_model, tokens, Answer};
use crate::openai::{app_with_engine_config, app_with_model};

/// A tools file in a fresh directory: `note` (writes notes there, asks),
/// `peek` (read-only, `confirm = false`), `danger` (high risk).
pub(crate) struct Tooling {
    pub(crate) dir: tempfile::TempDir,
}

impl Tooling {
    pub(crate) fn new() -> Tooling {
        Tooling::with_rules("")
    }

    /// The tools, then `rules` (TOML) in the same file.
    pub(crate) fn with_rules(rules: &str) -> Tooling {
        let dir = tempfile::tempdir().unwrap();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tools/write_note.py");
        let text = format!(
            r#"
[[tool]]
name = "note"
description = "Append a note"
risk = "low"
command = ["python3", "{script}", "{notes}"]
parameters = {{ type = "object", properties = {{ step = {{ type = "string" }} }}, required = ["step"] }}

[[tool]]
name = "peek"
description = "Read-only look"
risk = "low"
confirm = false
command = ["echo", "peeked"]
parameters = {{ type = "object" }}

[[tool]]
name = "danger"
description = "Something irreversible"
risk = "high"
command = ["python3", "{script}", "{notes}"]
parameters = {{ type = "object", properties = {{ step = {{ type = "string" }} }}, required = ["step"] }}
{rules}
"#,
            script = script.display(),
            notes = dir.path().join("notes").display(),
        );
        std::fs::write(dir.path().join("tools.toml"), text).unwrap();
        Tooling { dir }
    }

    pub(crate) fn notes(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.path().join("notes/notes.txt"))
            .map(|t| t.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    pub(crate) fn configure(&self) -> impl FnOnce(&mut chatgate::config::Settings) {
        let tools = self.dir.path().join("tools.toml");
        let audit = self.dir.path().join("audit.jsonl");
        move |s| {
            s.tooling.tools = Some(tools);
            s.tooling.audit_log = Some(audit);
        }
    }
}

/// A tool-call delta.
pub(crate) fn call(
    index: Option<usize>,
    id: Option<&str>,
    name: Option<&str>,
    args: Value,
) -> Value {
    let mut part = json!({ "function": {} });
    if let Some(index) = index {
        part["index"] = json!(index);
    }
    if let Some(id) = id {
        part["id"] = json!(id);
        part["type"] = json!("function");
    }
    if let Some(name) = name {
        part["function"]["name"] = json!(name);
    }
    part["function"]["arguments"] = args;
    json!({ "choices": [{ "delta": { "tool_calls": [part] } }] })
}

/// Events, then a `finish_reason`, then `[DONE]`.
pub(crate) fn answer(events: &[Value], finish: &str) -> String {
    let mut body: String = events.iter().map(event).collect();
    body.push_str(&event(
        &json!({ "choices": [{ "delta": {}, "finish_reason": finish }] }),
    ));
    body.push_str("data: [DONE]\n\n");
    body
}

/// Two interleaved calls of `note`, their arguments split in small pieces.
fn two_notes(first: &str, second: &str) -> String {
    let a = json!({ "step": first }).to_string();
    let b = json!({ "step": second }).to_string();
    let (a1, a2) = a.split_at(5);
    let (b1, b2) = b.split_at(7);
    answer(
        &[
            call(Some(0), Some("call_a"), Some("note"), json!(a1)),
            call(Some(1), Some("call_b"), Some("note"), json!(b1)),
            call(Some(0), None, None, json!(a2)),
            call(Some(1), None, None, json!(b2)),
        ],
        "tool_calls",
    )
}

pub(crate) fn tool_messages(request: &Value) -> Vec<Value> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .cloned()
        .collect()
}

/// The tools a system prompt tells the model to call, as a model that
/// follows it literally reads them: every tool name it mentions, of the
/// ones offered and of `propose_plan`.
fn tools_named_in_prompt(request: &Value, candidates: &[&str]) -> Vec<String> {
    let prompt = request["messages"][0]["content"].as_str().unwrap();
    assert_eq!(request["messages"][0]["role"], "system");
    let words: Vec<&str> = prompt
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .collect();
    candidates
        .iter()
        .filter(|name| words.contains(name))
        .map(|name| (*name).to_owned())
        .collect()
}

pub(crate) fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_system_prompt_names_exactly_the_tools_the_model_is_offered() {
    let candidates = ["propose_plan", "note", "peek", "danger", "ask_user"];
    let tooling = Tooling::new();
    let with_tools = fake_model(vec![tokens(&["Nothing to do."])]).await;
    let app = app_with_model(&with_tools.url, tooling.configure()).await;
    app.open("p", "hello").await.finish().await;
    let without_tools = fake_model(vec![tokens(&["Nothing to do."])]).await;
    let plain = app_with_model(&without_tools.url, |_| {}).await;
    plain.open("p", "hello").await.finish().await;

    let request = &with_tools.requests()[0];
    assert_eq!(offered(request), ["note", "peek", "danger", "ask_user"]);
    assert_eq!(
        tools_named_in_prompt(request, &candidates),
        ["note", "peek", "danger", "ask_user"],
        "a model that obeys its prompt calls only what it is offered"
    );
    let request = &without_tools.requests()[0];
    assert_eq!(offered(request), ["propose_plan", "ask_user"]);
    assert_eq!(
        tools_named_in_prompt(request, &candidates),
        ["propose_plan", "ask_user"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_answer_s_calls_are_one_confirmation_and_run_once_after_the_yes() {
    let tooling = Tooling::new();
    let model = fake_model(vec![
        two_notes("buy milk", "call mum"),
        tokens(&["Both noted."]),
    ])
    .await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let (mut stream, request) = app.open_paused("t", "remember two things").await;
    assert!(tooling.notes().is_empty(), "nothing before the yes");
    let (status, _) = app.reply("t", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    let data = request.approval().unwrap();
    assert_eq!(data.tasks.len(), 2);
    assert_eq!(data.tasks[0].tool, "note");
    assert_eq!(data.tasks[1].args, Some(json!({"step": "call mum"})));
    assert!(data.tasks[0].description.contains("buy milk"));
    assert_eq!(data.risk_level, RiskLevel::Low);
    assert_eq!(status, 200);
    assert_eq!(tooling.notes(), ["buy milk", "call mum"]);
    assert_eq!(last.chunk_type, ChunkType::Completion);
    let outputs: Vec<_> = stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::ToolOutput)
        .collect();
    assert_eq!(outputs.len(), 2);
    assert!(outputs.iter().all(|o| o.metadata["ok"] == true));
    let results = tool_messages(&model.requests()[1]);
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["tool_call_id"], "call_a");
    assert!(results[1]["content"].as_str().unwrap().contains("call mum"));
    // The `ended` record follows the final chunk: wait for it.
    let (events, _) =
        crate::durable::ended_trail(&tooling.dir.path().join("audit.jsonl"), "t").await;
    assert_eq!(
        events,
        ["proposed", "decided", "executed", "executed", "ended"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_modify_sends_the_feedback_and_the_next_batch_is_a_new_confirmation() {
    let tooling = Tooling::new();
    let single = answer(
        &[call(
            Some(0),
            Some("c1"),
            Some("note"),
            json!("{\"step\":\"draft\"}"),
        )],
        "tool_calls",
    );
    let revised = answer(
        &[call(
            Some(0),
            Some("c2"),
            Some("note"),
            json!("{\"step\":\"final\"}"),
        )],
        "tool_calls",
    );
    let model = fake_model(vec![single, revised, tokens(&["ok"])]).await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let (mut stream, first) = app.open_paused("m", "note it").await;
    app.reply("m", "CONFIRM_ACTION:modify:say final").await;
    let second = stream.until(ChunkType::ConfirmationRequest).await;
    app.reply("m", "CONFIRM_ACTION:confirm").await;
    stream.finish().await;

    assert_ne!(
        first.approval().cloned().unwrap().confirmation_id,
        second.approval().unwrap().confirmation_id
    );
    assert_eq!(second.approval().cloned().unwrap().confirmation_round, 2);
    assert_eq!(tooling.notes(), ["final"], "the draft never ran");
    let told = &tool_messages(&model.requests()[1])[0]["content"];
    assert!(told.as_str().unwrap().contains("say final"), "{told}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rejected_call_is_not_run_and_the_model_is_told_why() {
    let tooling = Tooling::new();
    let model = fake_model(vec![two_notes("keep", "drop"), tokens(&["fine"])]).await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let (mut stream, _) = app.open_paused("r", "two notes").await;
    let reply = app
        .post_json(&json!({"message": "CONFIRM_ACTION:confirm", "session_id": "r",
                           "decisions": [{"index": 2, "decision": "reject", "reason": "not that one"}]}))
        .await;
    assert_eq!(one_chunk(reply).await.0, 200);
    stream.finish().await;

    assert_eq!(tooling.notes(), ["keep"]);
    let results = tool_messages(&model.requests()[1]);
    assert!(results[1]["content"].as_str().unwrap().contains("rejected"));
    assert!(results[1]["content"]
        .as_str()
        .unwrap()
        .contains("not that one"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_arguments_go_back_to_the_model_and_never_reach_the_user() {
    let tooling = Tooling::new();
    let bad = answer(
        &[
            call(Some(0), Some("c1"), Some("note"), json!("{\"step\": 5}")),
            call(Some(1), Some("c2"), Some("nope"), json!("{}")),
            call(Some(2), Some("c3"), Some("note"), json!("not json")),
        ],
        "tool_calls",
    );
    let model = fake_model(vec![bad, tokens(&["Sorry."])]).await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let mut stream = app.open("bad", "note something").await;
    let last = stream.finish().await;

    assert!(!stream.types().contains(&ChunkType::ConfirmationRequest));
    assert_eq!(last.chunk_type, ChunkType::Completion);
    let results = tool_messages(&model.requests()[1]);
    assert_eq!(results.len(), 3);
    assert!(results[0]["content"]
        .as_str()
        .unwrap()
        .contains("do not fit"));
    assert!(results[1]["content"]
        .as_str()
        .unwrap()
        .contains("no tool `nope`"));
    assert!(results[2]["content"]
        .as_str()
        .unwrap()
        .contains("not a JSON object"));
    assert!(tooling.notes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_tool_runs_at_once_and_the_highest_risk_of_a_batch_counts() {
    let tooling = Tooling::new();
    let mixed = answer(
        &[
            call(Some(0), Some("c1"), Some("peek"), json!("{}")),
            call(Some(1), Some("c2"), Some("note"), json!("{\"step\":\"a\"}")),
            call(
                Some(2),
                Some("c3"),
                Some("danger"),
                json!("{\"step\":\"b\"}"),
            ),
        ],
        "tool_calls",
    );
    let model = fake_model(vec![mixed, tokens(&["done"])]).await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let (mut stream, request) = app.open_paused("ro", "look and act").await;
    let peeked = stream
        .chunks
        .iter()
        .find(|c| c.chunk_type == ChunkType::ToolOutput)
        .expect("peek ran before the confirmation");
    assert_eq!(peeked.metadata["tool"], "peek");
    let data = request.approval().unwrap();
    assert_eq!(data.tasks.len(), 2, "only the calls that need a yes");
    assert_eq!(data.risk_level, RiskLevel::High);
    app.reply("ro", "CONFIRM_ACTION:cancel").await;
    assert_eq!(reason(&stream.finish().await), "user");
    assert!(tooling.notes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_confirmation_are_bounded_per_run() {
    let tooling = Tooling::new();
    // 16 read-only calls an answer (the most an answer may make), three times.
    let calls: Vec<Value> = (0..16)
        .map(|i| call(Some(i), Some(&format!("c{i}")), Some("peek"), json!("{}")))
        .collect();
    let burst = answer(&calls, "tool_calls");
    let model = fake_model(vec![burst.clone(), burst.clone(), burst]).await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let mut stream = app.open("burst", "peek a lot").await;
    let last = stream.finish().await;

    let ran = stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::ToolOutput)
        .count();
    assert_eq!(
        ran,
        chatgate::run::context::tools::MAX_UNCONFIRMED_CALLS,
        "no call past the bound"
    );
    assert_eq!(last.metadata["error_type"], "tool_call_limit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_never_stops_calling_tools_ends_with_tool_call_limit() {
    let tooling = Tooling::new();
    let peek = answer(
        &[call(Some(0), Some("c"), Some("peek"), json!("{}"))],
        "tool_calls",
    );
    let model = fake_model((0..20).map(|_| peek.clone()).collect::<Vec<_>>()).await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let last = app.open("loop", "peek forever").await.finish().await;

    assert_eq!(error_type(&last), "tool_call_limit");
    assert_eq!(model.requests().len(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_as_real_servers_send_them_are_assembled_right() {
    let tooling = Tooling::new();
    // No index (a new id starts a call), the name repeated in every piece,
    // and arguments as an object: still exactly two calls.
    let quirky = answer(
        &[
            call(None, Some("x1"), Some("note"), json!("{\"step\":")),
            call(None, None, Some("note"), json!("\"one\"}")),
            call(None, Some("x2"), Some("note"), json!({"step": "two"})),
        ],
        "tool_calls",
    );
    let model = fake_model(vec![quirky, tokens(&["ok"])]).await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let (mut stream, request) = app.open_paused("q", "two").await;
    app.reply("q", "CONFIRM_ACTION:confirm").await;
    stream.finish().await;

    let tasks = &request.approval().unwrap().tasks;
    assert_eq!(tasks.len(), 2);
    assert_eq!(tasks[0].tool, "note");
    assert_eq!(tooling.notes(), ["one", "two"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_ends_early_or_carries_a_bad_event_is_an_error_not_a_completion() {
    // A clean close with neither a finish_reason nor [DONE].
    let cut = event(&content("Plan carried"));
    let malformed = format!(
        "{}data: {{not json\n\n{}",
        event(&content("Hello")),
        answer(&[content("!")], "stop")
    );
    let model = fake_model(vec![cut, malformed]).await;
    let app = app_with_model(&model.url, |_| {}).await;

    let ended_early = app.open("cut", "go").await.finish().await;
    let bad_event = app.open("bad", "go").await.finish().await;

    assert_eq!(error_type(&ended_early), "engine_unavailable");
    assert!(
        ended_early.chunk.contains("ended before"),
        "{}",
        ended_early.chunk
    );
    assert_eq!(error_type(&bad_event), "engine_unavailable");
    assert!(
        bad_event.chunk.contains("unreadable"),
        "{}",
        bad_event.chunk
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_answer_says_so_in_its_completion() {
    let model = fake_model(vec![answer(&[content("It was a dark and")], "length")]).await;
    let app = app_with_model(&model.url, |_| {}).await;

    let last = app.open("len", "tell a story").await.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.metadata["finish_reason"], "length");
    assert!(last.chunk.contains("cut off"), "{}", last.chunk);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_legacy_function_call_and_a_first_index_of_one_work_in_plan_mode() {
    let plan = json!({"tasks": [{"description": "a"}]}).to_string();
    let legacy = answer(
        &[
            json!({"choices": [{"delta": {"function_call": {"name": "propose_plan", "arguments": plan}}}]}),
        ],
        "function_call",
    );
    let index_one = answer(
        &[call(Some(1), Some("p"), Some("propose_plan"), json!(plan))],
        "tool_calls",
    );
    let model = fake_model(vec![legacy, tokens(&["ok"]), index_one, tokens(&["ok"])]).await;
    let app = app_with_model(&model.url, |_| {}).await;

    for session in ["legacy", "index-one"] {
        let (mut stream, request) = app.open_paused(session, "plan").await;
        assert_eq!(request.approval().unwrap().tasks.len(), 1);
        app.reply(session, "CONFIRM_ACTION:confirm").await;
        assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    }
    let calls = model.requests()[1]["messages"][2]["tool_calls"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(calls, 1, "one call, no empty one before it");
}

/// A status with `Retry-After`, as a streamed answer.
fn limited(status: u16, retry_after: &str) -> Answer {
    let body =
        futures_util::stream::once(async { actix_web::web::Bytes::from_static(b"slow down") })
            .boxed();
    Answer::Limited(status, retry_after.to_owned(), body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_limits_are_retried_within_the_deadline_and_reported_when_they_last() {
    let model = fake_model(vec![
        limited(429, "0"),
        limited(503, "0.2"),
        Answer::Body(tokens(&["finally"])),
        limited(429, "120"),
    ])
    .await;
    let (app, _) =
        app_with_engine_config(&model.url, |c| c.max_time = Duration::from_secs(5), |_| {}).await;

    let recovered = app.open("retry", "hello").await.finish().await;
    let started = std::time::Instant::now();
    let limited = app.open("limited", "hello").await.finish().await;

    assert_eq!(recovered.chunk_type, ChunkType::Completion);
    assert_eq!(error_type(&limited), "rate_limited");
    assert_eq!(limited.metadata["retry_after"], 120);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "gave up at once: 120 s is past the deadline"
    );
}
