//! A scripted stand-in for an OpenAI-compatible model server, on loopback in
//! the test process: each chat-completions request gets the next scripted
//! [`Answer`], and every request is recorded. Hostile answers (endless
//! bodies, huge lines, pings) are built from streams, so they cost the test
//! no memory and stop when chatgate stops reading.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::web::Bytes;
use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use futures_util::stream::{self, BoxStream};
use futures_util::StreamExt;
use serde_json::{json, Value};

/// A scripted answer that sends one token and then nothing, forever.
pub const STALL: &str = "stall";

/// What the model server answers to one request.
pub enum Answer {
    /// A complete SSE body (or [`STALL`]).
    Body(String),
    /// A status and a streamed body.
    Stream(u16, BoxStream<'static, Bytes>),
    /// A status with a `Retry-After` header, and a body.
    Limited(u16, String, BoxStream<'static, Bytes>),
}

impl From<String> for Answer {
    fn from(body: String) -> Answer {
        Answer::Body(body)
    }
}

pub struct FakeModel {
    pub url: String,
    requests: Arc<Mutex<Vec<Value>>>,
}

#[derive(Clone)]
struct Script {
    answers: Arc<Mutex<VecDeque<Answer>>>,
    requests: Arc<Mutex<Vec<Value>>>,
}

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
    let answer = script.answers.lock().unwrap().pop_front();
    match answer {
        Some(Answer::Body(answer)) if answer == STALL => {
            let token = Bytes::from(tokens(&["thinking"]).replace("data: [DONE]\n\n", ""));
            let body =
                stream::once(async move { Ok::<_, Infallible>(token) }).chain(stream::pending());
            HttpResponse::Ok()
                .content_type("text/event-stream")
                .streaming(body)
        }
        Some(Answer::Body(answer)) => HttpResponse::Ok()
            .content_type("text/event-stream")
            .body(answer),
        Some(Answer::Stream(status, body)) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
                .content_type("text/event-stream")
                .streaming(body.map(Ok::<_, Infallible>))
        }
        Some(Answer::Limited(status, retry_after, body)) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap())
                .insert_header(("Retry-After", retry_after))
                .streaming(body.map(Ok::<_, Infallible>))
        }
        None => HttpResponse::InternalServerError().body("script exhausted"),
    }
}

/// Starts a model server that gives `answers` in order.
pub async fn fake_model(answers: Vec<impl Into<Answer>>) -> FakeModel {
    let script = Script {
        answers: Arc::new(Mutex::new(answers.into_iter().map(Into::into).collect())),
        requests: Arc::default(),
    };
    let requests = script.requests.clone();
    let data = web::Data::new(script);
    let server = HttpServer::new(move || {
        App::new()
            .app_data(data.clone())
            .app_data(web::JsonConfig::default().limit(16 << 20))
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
    pub fn requests(&self) -> Vec<Value> {
        self.requests.lock().unwrap().clone()
    }
}

/// A streamed answer of plain tokens.
pub fn tokens(words: &[&str]) -> String {
    let mut body: String = words.iter().map(|w| event(&content(w))).collect();
    body.push_str("data: [DONE]\n\n");
    body
}

/// One SSE event carrying `value`.
pub fn event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// A chat-completion chunk with a text delta.
pub fn content(text: &str) -> Value {
    json!({"choices": [{"delta": {"content": text}}]})
}

/// A streamed `propose_plan` call, its arguments split over two events.
pub fn plan_call(id: &str, arguments: &Value) -> String {
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

/// `head`, then `piece` repeated for ever, `every` apart (zero: as fast as
/// the reader takes it).
pub fn endless(head: &str, piece: &'static [u8], every: Duration) -> BoxStream<'static, Bytes> {
    let head = Bytes::from(head.to_owned());
    let rest = stream::unfold((), move |()| async move {
        if !every.is_zero() {
            tokio::time::sleep(every).await;
        }
        Some((Bytes::from_static(piece), ()))
    });
    stream::once(async move { head }).chain(rest).boxed()
}
