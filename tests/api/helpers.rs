//! A real server on a free port, and small typed helpers to talk to it.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use chatgate::config::Settings;
use chatgate::confirmation::ConfirmationManager;
use chatgate::engine::planner::PlannerEngine;
use chatgate::protocol::{Chunk, ChunkType};
use chatgate::run::registry::ReplayRegistry;
use chatgate::run::Engine;
use chatgate::startup::Application;
use futures_util::StreamExt;
use reqwest::{Response, StatusCode};
use serde_json::{json, Value};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// How long any single wait in a test may take before the test fails.
/// Generous: it only bounds hangs, it is never what a test measures.
pub const WAIT: Duration = Duration::from_secs(20);

pub struct TestApp {
    pub address: String,
    pub client: reqwest::Client,
    pub manager: ConfirmationManager,
    pub logs: ReplayRegistry,
    pub shutdown: CancellationToken,
    pub server: JoinHandle<std::io::Result<()>>,
}

/// A loopback port nothing listens on (bound, then freed at once): for a
/// server that is not there.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a server with the defaults, except no step delay.
pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

/// Starts a server with the defaults adjusted by `configure`.
pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn_app_with_engine(configure, Arc::new(PlannerEngine)).await
}

/// Starts a server with a given engine.
pub async fn spawn_app_with_engine(
    configure: impl FnOnce(&mut Settings),
    engine: Arc<dyn Engine>,
) -> TestApp {
    let mut settings = Settings::for_bind("127.0.0.1:0");
    settings.engines.step_delay = std::time::Duration::from_millis(0);
    settings.server.workers = Some(2);
    configure(&mut settings);
    let app = Application::build_with_engine(settings, engine)
        .await
        .expect("server builds");
    let test_app = TestApp {
        address: format!("http://{}", app.address()),
        client: reqwest::Client::new(),
        manager: app.manager(),
        logs: app.replays(),
        shutdown: app.shutdown_token(),
        server: tokio::spawn(app.run_until_stopped()),
    };
    test_app
}

impl TestApp {
    pub fn url(&self) -> String {
        format!("{}/api/v1/chat/stream", self.address)
    }

    /// POSTs a JSON body to the chat endpoint.
    pub async fn post_json(&self, body: &Value) -> Response {
        self.client
            .post(self.url())
            .json(body)
            .send()
            .await
            .expect("request sent")
    }

    /// POSTs a chat message on `session`.
    pub async fn chat(&self, session: &str, message: &str) -> Response {
        self.post_json(&json!({ "message": message, "session_id": session }))
            .await
    }

    /// Starts a run on `session` and returns its stream.
    pub async fn open(&self, session: &str, message: &str) -> EventStream {
        let response = self.chat(session, message).await;
        assert_eq!(response.status(), StatusCode::OK);
        EventStream::new(response)
    }

    /// Starts a task on `session` and reads until its confirmation request.
    pub async fn open_paused(&self, session: &str, message: &str) -> (EventStream, Chunk) {
        let mut stream = self.open(session, message).await;
        let request = stream.until(ChunkType::ConfirmationRequest).await;
        (stream, request)
    }

    /// Sends a reply and returns its status and its single chunk.
    pub async fn reply(&self, session: &str, message: &str) -> (StatusCode, Chunk) {
        let response = self.chat(session, message).await;
        one_chunk(response).await
    }

    /// Re-attaches to `session` after chunk `last_seen`.
    pub async fn reattach(&self, session: &str, last_seen: u64) -> Response {
        self.client
            .post(self.url())
            .header("Last-Event-ID", last_seen.to_string())
            .json(&json!({ "session_id": session }))
            .send()
            .await
            .expect("request sent")
    }

    /// GETs `path`; returns the status and the body.
    pub async fn get(&self, path: &str) -> (u16, String) {
        let response = self.get_with(path, &[]).await;
        (response.status().as_u16(), response.text().await.unwrap())
    }

    /// GETs `path` with extra headers.
    pub async fn get_with(&self, path: &str, headers: &[(&str, &str)]) -> Response {
        let mut request = self.client.get(format!("{}{path}", self.address));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        request.send().await.expect("request sent")
    }

    /// POSTs `body` as is to the chat endpoint, with `content_type` if any.
    pub async fn post_raw(
        &self,
        content_type: Option<&str>,
        body: impl Into<reqwest::Body>,
    ) -> Response {
        let mut request = self.client.post(self.url()).body(body);
        if let Some(content_type) = content_type {
            request = request.header("Content-Type", content_type);
        }
        request.send().await.expect("request sent")
    }

    /// The value of the metric line `name` (no labels) in `/metrics`.
    pub async fn metric(&self, name: &str) -> i64 {
        let (_, text) = self.get("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("{name} in\n{text}"))
            .parse()
            .expect("an integer")
    }

    /// Waits until `check` holds, polling (for state with no event to await).
    pub async fn eventually(&self, what: &str, check: impl Fn(&TestApp) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !check(self) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for: {what}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls the registry until it is empty (or fails after [`WAIT`]).
    pub async fn registry_drains(&self) {
        tokio::time::timeout(WAIT, self.manager.wait_until_empty())
            .await
            .expect("every run ended and freed its session");
    }
}

/// Reads a response that must be exactly one chunk long.
pub async fn one_chunk(response: Response) -> (StatusCode, Chunk) {
    let status = response.status();
    assert_sse_headers(&response);
    let mut stream = EventStream::new(response);
    let chunk = stream.next_chunk().await.expect("one chunk");
    assert!(chunk.finished, "a one-chunk stream is finished: {chunk:?}");
    assert_eq!(
        stream.next_event().await,
        None,
        "nothing after the final chunk"
    );
    (status, chunk)
}

pub fn assert_sse_headers(response: &Response) {
    let headers = response.headers();
    assert_eq!(
        headers["content-type"], "text/event-stream; charset=utf-8",
        "{headers:?}"
    );
    assert_eq!(headers["cache-control"], "no-cache");
    assert_eq!(headers["x-accel-buffering"], "no");
}

pub fn error_type(chunk: &Chunk) -> &str {
    assert_eq!(chunk.chunk_type, ChunkType::Error, "{chunk:?}");
    chunk.metadata["error_type"]
        .as_str()
        .expect("error_type is a string")
}

pub fn reason(chunk: &Chunk) -> &str {
    assert_eq!(chunk.chunk_type, ChunkType::Cancelled, "{chunk:?}");
    assert!(chunk.finished);
    chunk.metadata["reason"]
        .as_str()
        .expect("reason is a string")
}

/// One SSE event as read off the wire.
#[derive(Debug, PartialEq)]
pub enum Event {
    Chunk { id: u64, chunk: Box<Chunk> },
    Comment(String),
}

/// Incremental SSE reader over a streaming response body.
pub struct EventStream {
    body: futures_util::stream::BoxStream<'static, reqwest::Result<bytes::Bytes>>,
    buffer: BytesMut,
    /// Every chunk read so far, in order.
    pub chunks: Vec<Chunk>,
    ended: bool,
    /// The sequence the first chunk must have (1, or after Last-Event-ID).
    first_sequence: u64,
}

impl EventStream {
    pub fn new(response: Response) -> EventStream {
        assert_sse_headers(&response);
        EventStream {
            body: response.bytes_stream().boxed(),
            buffer: BytesMut::new(),
            chunks: Vec::new(),
            ended: false,
            first_sequence: 1,
        }
    }

    /// A re-attached stream, which starts after `last_seen`.
    pub fn resumed(response: Response, last_seen: u64) -> EventStream {
        let mut stream = EventStream::new(response);
        stream.first_sequence = last_seen + 1;
        stream
    }

    /// The next event, or `None` once the server closed the stream.
    pub async fn next_event(&mut self) -> Option<Event> {
        tokio::time::timeout(WAIT, self.read_event())
            .await
            .expect("an event or the end of the stream within the wait")
    }

    async fn read_event(&mut self) -> Option<Event> {
        loop {
            if let Some(end) = self.buffer.windows(2).position(|w| w == b"\n\n") {
                let raw = self.buffer.split_to(end);
                self.buffer.advance(2);
                let text = String::from_utf8(raw.to_vec()).expect("UTF-8 event");
                return Some(self.parse(&text));
            }
            if self.ended {
                assert!(self.buffer.is_empty(), "truncated event: {:?}", self.buffer);
                return None;
            }
            match self.body.next().await {
                Some(Ok(bytes)) => self.buffer.extend_from_slice(&bytes),
                Some(Err(err)) => panic!("stream broke: {err}"),
                None => self.ended = true,
            }
        }
    }

    fn parse(&mut self, text: &str) -> Event {
        if let Some(comment) = text.strip_prefix(':') {
            assert!(!text.contains('\n'), "one comment line: {text:?}");
            return Event::Comment(comment.trim().to_owned());
        }
        let mut lines = text.split('\n');
        let id_line = lines.next().expect("id line");
        let data_line = lines.next().expect("data line");
        assert_eq!(lines.next(), None, "exactly two lines per event: {text:?}");
        let id: u64 = id_line
            .strip_prefix("id: ")
            .expect("id: line first")
            .parse()
            .expect("numeric id");
        let json = data_line.strip_prefix("data: ").expect("data: line second");
        let chunk: Chunk = serde_json::from_str(json).expect("chunk JSON");
        assert_eq!(chunk.sequence, id, "id equals sequence");
        let expected = self
            .chunks
            .last()
            .map_or(self.first_sequence, |last| last.sequence + 1);
        if chunk.metadata.get("gap") == Some(&Value::Bool(true)) {
            assert!(chunk.sequence > expected, "a gap skips sequences");
        } else {
            assert_eq!(chunk.sequence, expected, "sequence increases by one");
        }
        assert!(
            !self.chunks.last().is_some_and(|last| last.finished),
            "nothing after a finished chunk"
        );
        self.chunks.push(chunk.clone());
        Event::Chunk {
            id,
            chunk: Box::new(chunk),
        }
    }

    /// The next chunk, skipping comments; `None` at the end of the stream.
    pub async fn next_chunk(&mut self) -> Option<Chunk> {
        loop {
            match self.next_event().await? {
                Event::Chunk { chunk, .. } => return Some(*chunk),
                Event::Comment(_) => continue,
            }
        }
    }

    /// Reads until a chunk of `chunk_type` and returns it.
    pub async fn until(&mut self, chunk_type: ChunkType) -> Chunk {
        loop {
            let chunk = self.next_chunk().await.unwrap_or_else(|| {
                panic!("stream ended before {chunk_type:?}: {:#?}", self.chunks)
            });
            if chunk.chunk_type == chunk_type {
                return chunk;
            }
            assert!(!chunk.finished, "ended before {chunk_type:?}: {chunk:?}");
        }
    }

    /// Reads to the end; returns the final chunk after checking that it is
    /// the only finished one and that the stream closes right after it.
    pub async fn finish(&mut self) -> Chunk {
        while self.next_chunk().await.is_some() {}
        let last = self.chunks.last().expect("at least one chunk").clone();
        assert!(last.finished, "the last chunk is finished: {last:?}");
        assert_eq!(
            self.chunks.iter().filter(|c| c.finished).count(),
            1,
            "exactly one finished chunk"
        );
        last
    }

    /// The chunk types read so far, in order.
    pub fn types(&self) -> Vec<ChunkType> {
        self.chunks.iter().map(|c| c.chunk_type).collect()
    }
}

pub fn confirmation_id(request: &Chunk) -> String {
    request
        .confirmation_data
        .as_ref()
        .expect("confirmation_data")
        .confirmation_id()
        .to_owned()
}
