//! The `openai` engine asks (#16), against the scripted model server: its
//! built-in `ask_user` tool, and the values a declared tool's call lacks.

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::helpers::{error_type, reason, TestApp};
use crate::model_server::{event, fake_model, tokens};
use crate::openai::{app_with_engine_config, app_with_model};
use crate::openai_tools::{offered, tool_messages};

/// One streamed answer calling `name` with `arguments`.
fn tool_call(id: &str, name: &str, arguments: &Value) -> String {
    let call = json!({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "id": id, "type": "function",
         "function": {"name": name, "arguments": arguments.to_string()}}]}}]});
    let end = json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]});
    format!("{}{}data: [DONE]\n\n", event(&call), event(&end))
}

fn region_question() -> Value {
    json!({"questions": [{"question": "Which region?", "header": "Region",
        "options": [{"label": "eu-west", "description": "Frankfurt"}, {"label": "us-east"}]}]})
}

/// A tools file with `note`, whose `step` is a required string.
fn note_tools(dir: &tempfile::TempDir) -> std::path::PathBuf {
    let path = dir.path().join("tools.toml");
    let text = format!(
        r#"
[[tool]]
name = "note"
description = "Append a note"
risk = "low"
command = ["sh", "-c", "cat >> {notes}"]
parameters = {{ type = "object", properties = {{ step = {{ type = "string", description = "What to note?", maxLength = 50 }}, copies = {{ type = "integer", minimum = 1, maximum = 3 }} }}, required = ["step", "copies"] }}
"#,
        notes = dir.path().join("notes").display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn asked(
    app: &TestApp,
    session: &str,
    message: &str,
) -> (crate::helpers::EventStream, chatgate::protocol::Chunk) {
    let mut stream = app.open(session, message).await;
    let request = stream.until(ChunkType::InputRequest).await;
    (stream, request)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ask_user_is_an_input_request_and_the_answer_is_the_tool_s_result() {
    let model = fake_model(vec![
        tool_call("ask_1", "ask_user", &region_question()),
        tokens(&["Deploying to us-east."]),
    ])
    .await;
    let app = app_with_model(&model.url, |_| {}).await;

    let (mut stream, request) = asked(&app, "a", "deploy it").await;
    let data = request.questions().unwrap();
    assert_eq!(data.title, "Which region?");
    assert_eq!(data.questions[0].id, "q1");
    assert_eq!(data.questions[0].header, "Region");
    assert_eq!(data.questions[0].options[1].label, "us-east");
    assert!(data.questions[0].allow_other);
    let (status, ack) = app.reply("a", "CONFIRM_ACTION:answer:2").await;
    let last = stream.finish().await;

    assert_eq!(status, 200, "{ack:?}");
    assert_eq!(ack.metadata["answers"], json!({"q1": "us-east"}));
    assert_eq!(last.chunk_type, ChunkType::Completion);
    let requests = model.requests();
    assert!(offered(&requests[0]).contains(&"ask_user".to_owned()));
    let prompt = requests[0]["messages"][0]["content"].as_str().unwrap();
    assert!(prompt.contains("ask_user"), "{prompt}");
    let told = &tool_messages(&requests[1])[0];
    assert_eq!(told["tool_call_id"], "ask_1");
    let result: Value = serde_json::from_str(told["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        result,
        json!({"answers": [{"question": "Which region?", "answer": "us-east"}]})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skip_tells_the_model_the_user_chose_not_to_answer() {
    let model = fake_model(vec![
        tool_call("ask_1", "ask_user", &region_question()),
        tokens(&["Then I will wait."]),
    ])
    .await;
    let app = app_with_model(&model.url, |_| {}).await;
    let (mut stream, _) = asked(&app, "s", "deploy it").await;

    app.reply("s", "CONFIRM_ACTION:skip").await;
    stream.finish().await;

    let told = &tool_messages(&model.requests()[1])[0];
    assert!(
        told["content"]
            .as_str()
            .unwrap()
            .contains("chose not to answer"),
        "{told}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_ends_the_run_and_the_model_is_not_called_again() {
    let model = fake_model(vec![tool_call("ask_1", "ask_user", &region_question())]).await;
    let app = app_with_model(&model.url, |_| {}).await;
    let (mut stream, _) = asked(&app, "c", "deploy it").await;

    app.reply("c", "CONFIRM_ACTION:cancel").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(reason(&last), "user");
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_user_call_out_of_bounds_goes_back_to_the_model_and_never_reaches_the_user() {
    let five = json!({"questions": [{"question": "a?"}, {"question": "b?"}, {"question": "c?"},
                                    {"question": "d?"}, {"question": "e?"}]});
    let model = fake_model(vec![
        tool_call("ask_1", "ask_user", &five),
        tool_call(
            "ask_2",
            "ask_user",
            &json!({"questions": [{"question": "x?", "options": [{"label": "only"}]}]}),
        ),
        tokens(&["Never mind."]),
    ])
    .await;
    let app = app_with_model(&model.url, |_| {}).await;

    let mut stream = app.open("b", "deploy it").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert!(!stream.types().contains(&ChunkType::InputRequest));
    let requests = model.requests();
    let first = tool_messages(&requests[1])[0]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        first.starts_with("Error:") && first.contains("1 to 4"),
        "{first}"
    );
    let second = tool_messages(&requests[2])[1]["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(second.contains("none or 2 to 8"), "{second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ask_user_offers_no_such_tool() {
    let model = fake_model(vec![tokens(&["Hi."])]).await;
    let (app, _) = app_with_engine_config(&model.url, |c| c.ask_user = false, |_| {}).await;

    app.open("n", "hello").await.finish().await;

    let request = &model.requests()[0];
    assert_eq!(offered(request), ["propose_plan"]);
    assert!(!request["messages"][0]["content"]
        .as_str()
        .unwrap()
        .contains("ask_user"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_lacking_required_values_asks_for_them_then_is_confirmed_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let tools = note_tools(&dir);
    let model = fake_model(vec![
        tool_call("call_1", "note", &json!({})),
        tokens(&["Noted."]),
    ])
    .await;
    let app = app_with_model(&model.url, move |s| s.tooling.tools = Some(tools)).await;

    let (mut stream, request) = asked(&app, "m", "note something").await;
    let data = request.questions().unwrap().clone();
    let ids: Vec<&str> = data.questions.iter().map(|q| q.id.as_str()).collect();
    assert_eq!(ids, ["step", "copies"]);
    assert_eq!(data.questions[0].question, "What to note?");
    assert_eq!(
        data.questions[1].schema,
        Some(json!({"type": "integer", "minimum": 1, "maximum": 3}))
    );
    assert_eq!(data.title, "note needs step, copies");
    let too_many = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:answer", "session_id": "m",
                           "answers": {"step": "buy milk", "copies": 7}}),
        )
        .await;
    let (status, refused) = crate::helpers::one_chunk(too_many).await;
    assert_eq!(status, 422);
    assert_eq!(error_type(&refused), "invalid_answer");
    let answered = app
        .post_json(
            &json!({"message": "CONFIRM_ACTION:answer", "session_id": "m",
                           "answers": {"step": "buy milk", "copies": "2"}}),
        )
        .await;
    assert_eq!(answered.status(), 200);
    let plan = stream.until(ChunkType::ConfirmationRequest).await;
    let task = &plan.approval().unwrap().tasks[0];
    assert_eq!(task.args, Some(json!({"step": "buy milk", "copies": 2})));
    app.reply("m", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    let notes = std::fs::read_to_string(dir.path().join("notes")).unwrap();
    assert!(notes.contains("buy milk"), "{notes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skipped_missing_value_sends_the_schema_error_back_to_the_model() {
    let dir = tempfile::tempdir().unwrap();
    let tools = note_tools(&dir);
    let model = fake_model(vec![
        tool_call("call_1", "note", &json!({"step": "x"})),
        tokens(&["I need the copies."]),
    ])
    .await;
    let app = app_with_model(&model.url, move |s| s.tooling.tools = Some(tools)).await;
    let (mut stream, request) = asked(&app, "k", "note something").await;
    assert_eq!(
        request.questions().unwrap().questions.len(),
        1,
        "only what is missing"
    );

    app.reply("k", "CONFIRM_ACTION:skip").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert!(!stream.types().contains(&ChunkType::ConfirmationRequest));
    let told = &tool_messages(&model.requests()[1])[0];
    let text = told["content"].as_str().unwrap();
    assert!(
        text.contains("do not fit the tool's parameters") && text.contains("copies"),
        "{text}"
    );
    assert!(!dir.path().join("notes").exists(), "nothing ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_that_is_wrong_otherwise_is_not_asked_about() {
    let dir = tempfile::tempdir().unwrap();
    let tools = note_tools(&dir);
    let model = fake_model(vec![
        tool_call("call_1", "note", &json!({"step": 5})),
        tokens(&["Oops."]),
    ])
    .await;
    let app = app_with_model(&model.url, move |s| s.tooling.tools = Some(tools)).await;

    let mut stream = app.open("w", "note something").await;
    stream.finish().await;

    assert!(!stream.types().contains(&ChunkType::InputRequest));
    let told = &tool_messages(&model.requests()[1])[0];
    assert!(told["content"].as_str().unwrap().starts_with("Error:"));
}

/// An `ask_user` pause is stored like a plan: after `kill -9` the answer is
/// taken by the next process and reaches the model there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_user_pause_survives_kill_9_and_its_answer_reaches_the_model() {
    use crate::durable::{self, Dir};
    let model = fake_model(vec![
        tool_call("ask_1", "ask_user", &region_question()),
        tokens(&["Going ", "east."]),
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
    let mut first = durable::start(&dir, &args);
    let opened = durable::post(
        &durable::stream_url(&first),
        json!({"message": "deploy it", "session_id": "k9a"}),
        None,
    )
    .await;
    let raw = durable::read_raw(opened, Some("input_request")).await;
    let request = durable::chunks(&raw).pop().unwrap();
    assert_eq!(request.chunk_type, ChunkType::InputRequest);

    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let second = durable::start(&dir, &args);
    let url = durable::stream_url(&second);
    let back = durable::post(&url, json!({"session_id": "k9a"}), Some(request.sequence)).await;
    let rest = tokio::spawn(durable::read_raw(back, None));
    let (status, ack) = durable::reply(&url, "k9a", "CONFIRM_ACTION:answer:us-east").await;
    let after = durable::chunks(&rest.await.unwrap());

    assert_eq!(status, 200, "{ack:?}");
    assert_eq!(after.last().unwrap().chunk_type, ChunkType::Completion);
    let requests = model.requests();
    assert_eq!(
        requests.len(),
        2,
        "the question, then the answer after the restart"
    );
    let told = &tool_messages(&requests[1])[0];
    assert_eq!(told["tool_call_id"], "ask_1");
    assert!(
        told["content"].as_str().unwrap().contains("us-east"),
        "{told}"
    );
}
