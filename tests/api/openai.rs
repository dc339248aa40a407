//! The `openai` engine against a scripted stand-in for an OpenAI-compatible
//! model server (on loopback, in the test process): tokens stream through,
//! a plan waits for the user, and the model hears the answer.

use std::sync::Arc;
use std::time::Duration;

use chatgate::engine::llm::OpenAiConfig;
use chatgate::engine::openai::OpenAiEngine;
use chatgate::protocol::{ChunkType, RiskLevel};
use serde_json::{json, Value};

use crate::helpers::{error_type, reason, spawn_app_with_engine, TestApp};
use crate::model_server::{fake_model, plan_call, tokens, STALL};

pub async fn app_with_model(
    url: &str,
    configure: impl FnOnce(&mut chatgate::config::Settings),
) -> TestApp {
    app_with_engine_config(url, |_| {}, configure).await.0
}

/// A server whose openai engine talks to `url`, configured by `engine`; the
/// engine is returned too, to inspect its conversations.
pub async fn app_with_engine_config(
    url: &str,
    engine: impl FnOnce(&mut OpenAiConfig),
    configure: impl FnOnce(&mut chatgate::config::Settings),
) -> (TestApp, Arc<OpenAiEngine>) {
    let mut config = OpenAiConfig::new(url, "test-model");
    config.api_key = Some("model-key".into());
    config.timeout = Duration::from_secs(5);
    engine(&mut config);
    let engine = Arc::new(OpenAiEngine::new(config).expect("client builds"));
    let app = spawn_app_with_engine(configure, engine.clone()).await;
    (app, engine)
}

fn roles(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap().to_owned())
        .collect()
}

fn last_message(request: &Value) -> &Value {
    request["messages"].as_array().unwrap().last().unwrap()
}

fn two_tasks() -> Value {
    json!({"summary": "Clean up?", "risk_level": "high", "tasks": [
        {"description": "list old files", "tool": "shell", "args": {"cmd": "ls"}},
        {"description": "delete them", "tool": "shell"}]})
}

#[tokio::test]
async fn a_question_streams_the_model_s_tokens_as_content_chunks() {
    let model = fake_model(vec![tokens(&["Hello", ", ", "world"])]).await;
    let app = app_with_model(&model.url, |_| {}).await;

    let mut stream = app.open("q", "say hello").await;
    let last = stream.finish().await;

    let content: Vec<&str> = stream
        .chunks
        .iter()
        .filter(|c| c.chunk_type == ChunkType::Content)
        .map(|c| c.chunk.as_str())
        .collect();
    assert_eq!(content, ["Hello", ", ", "world"]);
    assert_eq!(last.chunk_type, ChunkType::Completion);
    let request = &model.requests()[0];
    assert_eq!(request["model"], "test-model");
    assert_eq!(request["stream"], true);
    assert_eq!(request["tools"][0]["function"]["name"], "propose_plan");
    assert_eq!(roles(request), ["system", "user"]);
    assert_eq!(last_message(request)["content"], "say hello");
    assert_eq!(request["authorization"], "Bearer model-key");
}

#[tokio::test]
async fn a_model_that_stalls_does_not_hold_up_shutdown() {
    let model = fake_model(vec![STALL.to_owned()]).await;
    let app = app_with_model(&model.url, |_| {}).await;
    let mut stream = app.open("s", "think hard").await;
    assert_eq!(stream.until(ChunkType::Content).await.chunk, "thinking");

    app.shutdown.cancel();
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(reason(&last), "shutdown");
}

#[tokio::test]
async fn a_plan_pauses_and_only_after_confirm_is_the_model_told_to_carry_it_out() {
    let model = fake_model(vec![
        plan_call("call_a", &two_tasks()),
        tokens(&["Listed 3 files. ", "Deleted them."]),
    ])
    .await;
    let app = app_with_model(&model.url, |_| {}).await;

    let (mut stream, request) = app.open_paused("p", "clean up my folder").await;
    let asked_before_the_answer = model.requests().len();
    let (status, _) = app.reply("p", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    let data = request.approval().unwrap();
    assert_eq!(request.chunk, "Clean up?");
    assert_eq!(data.risk_level, RiskLevel::High);
    assert_eq!(data.tasks.len(), 2);
    assert_eq!(data.tasks[0].args, Some(json!({"cmd": "ls"})));
    assert_eq!(asked_before_the_answer, 1, "nothing more while paused");
    assert_eq!(status, 200);
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.chunk, "Plan carried out.");
    let requests = model.requests();
    assert_eq!(requests.len(), 2);
    let answer = last_message(&requests[1]);
    assert_eq!(answer["role"], "tool");
    assert_eq!(answer["tool_call_id"], "call_a");
    assert!(answer["content"].as_str().unwrap().contains("confirmed"));
    let assistant = &requests[1]["messages"][2];
    assert_eq!(
        assistant["tool_calls"][0]["function"]["arguments"],
        two_tasks().to_string()
    );
    assert!(stream.chunks.iter().any(|c| c.chunk == "Deleted them."));
}

#[tokio::test]
async fn cancel_ends_the_run_and_the_model_is_not_called_again() {
    let model = fake_model(vec![
        plan_call("call_b", &two_tasks()),
        tokens(&["should not run"]),
    ])
    .await;
    let app = app_with_model(&model.url, |_| {}).await;

    let (mut stream, _) = app.open_paused("c", "clean up").await;
    app.reply("c", "CONFIRM_ACTION:cancel").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(reason(&last), "user");
    assert_eq!(model.requests().len(), 1);
}

#[tokio::test]
async fn modify_sends_the_feedback_to_the_model_and_its_revised_plan_is_round_two() {
    let revised = json!({"tasks": [{"description": "move old files to the trash"}]});
    let model = fake_model(vec![
        plan_call("call_1", &two_tasks()),
        plan_call("call_2", &revised),
        tokens(&["Moved."]),
    ])
    .await;
    let app = app_with_model(&model.url, |_| {}).await;

    let (mut stream, _) = app.open_paused("m", "clean up").await;
    app.reply("m", "CONFIRM_ACTION:modify:use the trash, do not delete")
        .await;
    let second = stream.until(ChunkType::ConfirmationRequest).await;
    app.reply("m", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;

    let data = second.approval().unwrap();
    assert_eq!(data.confirmation_round, 2);
    assert_eq!(data.tasks[0].description, "move old files to the trash");
    assert_eq!(
        data.risk_level,
        RiskLevel::Medium,
        "unstated risk is not low"
    );
    assert_eq!(last.chunk_type, ChunkType::Completion);
    let feedback = last_message(&model.requests()[1]).clone();
    assert_eq!(feedback["tool_call_id"], "call_1");
    assert!(feedback["content"]
        .as_str()
        .unwrap()
        .contains("use the trash, do not delete"));
}

#[tokio::test]
async fn an_unreachable_model_server_ends_the_run_with_engine_unavailable() {
    // Bound and dropped at once: nothing listens on this port.
    let port = crate::helpers::free_port();
    let app = app_with_model(&format!("http://127.0.0.1:{port}/v1"), |_| {}).await;

    let last = app.open("u", "hello").await.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Error);
    assert_eq!(error_type(&last), "engine_unavailable");
    assert!(
        !last.chunk.contains("127.0.0.1"),
        "internal details are logged, not sent"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_says_when_the_model_server_cannot_be_reached_and_when_it_is_back() {
    let port = crate::helpers::free_port();
    let app = app_with_model(&format!("http://127.0.0.1:{port}/v1"), |_| {}).await;
    let ready = |body: &str| -> Value { serde_json::from_str(body).unwrap() };

    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    let (status, body) = loop {
        let (status, body) = app.get("/readyz").await;
        if status == 503 || tokio::time::Instant::now() > deadline {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(status, 503, "{body}");
    assert_eq!(ready(&body)["status"], "engine_unavailable");
    assert!(ready(&body)["error"]
        .as_str()
        .unwrap()
        .contains("cannot be reached"));

    // Something listens there now: looked at again, it is ready.
    let listener = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    loop {
        let (status, body) = app.get("/readyz").await;
        if status == 200 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{body}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(listener);
}

#[tokio::test]
async fn a_session_s_next_run_carries_its_conversation_and_another_key_s_does_not() {
    let model = fake_model(vec![
        tokens(&["Hi Ada."]),
        tokens(&["Ada."]),
        tokens(&["Who?"]),
    ])
    .await;
    let app = app_with_model(&model.url, |s| {
        s.server.api_keys = vec!["k1".into(), "k2".into()]
    })
    .await;
    let run = |key: &'static str, message: &'static str| {
        let app = &app;
        async move {
            let response = app
                .client
                .post(app.url())
                .bearer_auth(key)
                .json(&json!({ "message": message, "session_id": "shared" }))
                .send()
                .await
                .unwrap();
            crate::helpers::EventStream::new(response).finish().await
        }
    };

    run("k1", "I am Ada").await;
    run("k1", "what is my name?").await;
    run("k2", "what is my name?").await;

    let requests = model.requests();
    assert_eq!(roles(&requests[1]), ["system", "user", "assistant", "user"]);
    assert_eq!(requests[1]["messages"][2]["content"], "Hi Ada.");
    assert_eq!(
        roles(&requests[2]),
        ["system", "user"],
        "k2 sees none of k1's session"
    );
}
