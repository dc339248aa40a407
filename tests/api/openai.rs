//! The `openai` engine against a scripted stand-in for an OpenAI-compatible
//! model server (on loopback, in the test process): tokens stream through,
//! a plan waits for the user, and the model hears the answer.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::convert::Infallible;

use actix_web::web::Bytes;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use chatgate::engine::openai::{OpenAiConfig, OpenAiEngine};
use chatgate::protocol::{ChunkType, RiskLevel};
use futures_util::{stream, StreamExt};
use serde_json::{json, Value};

use crate::helpers::{error_type, reason, spawn_app_with_engine, TestApp};

/// A model server that answers each chat-completions request with the next
/// scripted SSE body, and records every request it got.
struct FakeModel {
    url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

#[derive(Clone)]
struct Script {
    answers: Arc<Mutex<VecDeque<String>>>,
    requests: Arc<Mutex<Vec<Value>>>,
}

/// A scripted answer that sends one token and then nothing, forever.
const STALL: &str = "stall";

async fn completions(
    req: HttpRequest,
    script: web::Data<Script>,
    body: web::Json<Value>,
) -> HttpResponse {
    let mut request = body.into_inner();
    // Recorded beside the body, for the tests to check.
    request["authorization"] = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .into();
    script.requests.lock().unwrap().push(request);
    match script.answers.lock().unwrap().pop_front() {
        Some(answer) if answer == STALL => {
            let token = Bytes::from(tokens(&["thinking"]).replace("data: [DONE]\n\n", ""));
            let body =
                stream::once(async move { Ok::<_, Infallible>(token) }).chain(stream::pending());
            HttpResponse::Ok()
                .content_type("text/event-stream")
                .streaming(body)
        }
        Some(answer) => HttpResponse::Ok()
            .content_type("text/event-stream")
            .body(answer),
        None => HttpResponse::InternalServerError().body("script exhausted"),
    }
}

async fn fake_model(answers: Vec<String>) -> FakeModel {
    let script = Script {
        answers: Arc::new(Mutex::new(answers.into())),
        requests: Arc::default(),
    };
    let requests = script.requests.clone();
    let data = web::Data::new(script);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .route("/v1/chat/completions", web::post().to(completions))
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .expect("fake model binds");
    let url = format!("http://{}/v1", server.addrs()[0]);
    tokio::spawn(server.run());
    FakeModel { url, requests }
}

impl FakeModel {
    fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

/// A streamed answer of plain tokens.
fn tokens(words: &[&str]) -> String {
    let mut body: String = words
        .iter()
        .map(|w| {
            format!(
                "data: {}\n\n",
                json!({"choices": [{"delta": {"content": w}}]})
            )
        })
        .collect();
    body.push_str("data: [DONE]\n\n");
    body
}

/// A streamed `propose_plan` call, its arguments split over two events.
fn plan_call(id: &str, arguments: &Value) -> String {
    let arguments = arguments.to_string();
    let (head, tail) = arguments.split_at(arguments.len() / 2);
    let first = json!({"choices": [{"delta": {"content": "Here is my plan.", "tool_calls": [
        {"index": 0, "id": id, "type": "function",
         "function": {"name": "propose_plan", "arguments": head}}]}}]});
    let second = json!({"choices": [{"delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": tail}}]}}]});
    let end = json!({"choices": [{"delta": {}, "finish_reason": "tool_calls"}]});
    format!("data: {first}\n\ndata: {second}\n\ndata: {end}\n\ndata: [DONE]\n\n")
}

async fn app_with_model(
    url: &str,
    configure: impl FnOnce(&mut chatgate::config::Settings),
) -> TestApp {
    let mut config = OpenAiConfig::new(url, "test-model");
    config.api_key = Some("model-key".into());
    config.timeout = Duration::from_secs(5);
    let engine = OpenAiEngine::new(config).expect("client builds");
    spawn_app_with_engine(configure, Arc::new(engine)).await
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

    let data = request.confirmation_data.as_ref().unwrap();
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

    let data = second.confirmation_data.as_ref().unwrap();
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
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let app = app_with_model(&format!("http://127.0.0.1:{port}/v1"), |_| {}).await;

    let last = app.open("u", "hello").await.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Error);
    assert_eq!(error_type(&last), "engine_unavailable");
    assert!(
        !last.chunk.contains("127.0.0.1"),
        "internal details are logged, not sent"
    );
}

#[tokio::test]
async fn a_session_s_next_run_carries_its_conversation_and_another_key_s_does_not() {
    let model = fake_model(vec![
        tokens(&["Hi Ada."]),
        tokens(&["Ada."]),
        tokens(&["Who?"]),
    ])
    .await;
    let app = app_with_model(&model.url, |s| s.api_keys = vec!["k1".into(), "k2".into()]).await;
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
