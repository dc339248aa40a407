//! Webhooks (`--webhook`) against a real receiver on loopback: it checks
//! every signature, answers as a test scripts it (an error, `Retry-After`,
//! a hang), and can be down and come back on the same port.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
use chatgate::protocol::ChunkType;
use hmac::{Hmac, Mac};
use secrecy::SecretString;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::durable::{self, Dir};
use crate::helpers::{confirmation_id, spawn_app_with, TestApp, WAIT};

pub(crate) const SECRET: &str = "a-webhook-secret-of-some-length";

/// How the receiver answers one delivery.
#[derive(Debug, Clone, Copy)]
pub enum Answer {
    Status(u16),
    /// 503 with `Retry-After: N` (seconds).
    RetryAfter(u64),
    /// No answer for this long.
    Hang(Duration),
}

/// One delivery as the receiver got it.
#[derive(Debug, Clone)]
pub struct Delivery {
    pub event: String,
    pub delivery: String,
    pub signed: bool,
    pub body: Value,
    pub at: Instant,
}

#[derive(Clone, Default)]
struct Inbox {
    seen: Arc<Mutex<Vec<Delivery>>>,
    answers: Arc<Mutex<VecDeque<Answer>>>,
}

/// A webhook receiver on loopback.
pub struct Receiver {
    pub url: String,
    port: u16,
    inbox: Inbox,
    server: Option<actix_web::dev::ServerHandle>,
}

/// Whether `header` (`t=..,v1=..`) signs `body` with [`SECRET`], made
/// within 5 minutes: the check docs/operations.md shows.
fn verify(header: &str, body: &[u8]) -> bool {
    let mut t = None;
    let mut v1 = None;
    for part in header.split(',') {
        match part.split_once('=') {
            Some(("t", value)) => t = value.parse::<u64>().ok(),
            Some(("v1", value)) => v1 = hex::decode(value).ok(),
            _ => {}
        }
    }
    let (Some(t), Some(v1)) = (t, v1) else {
        return false;
    };
    let now = chatgate::webhook::unix_now();
    if now.abs_diff(t) > 300 {
        return false;
    }
    let mut mac = Hmac::<Sha256>::new_from_slice(SECRET.as_bytes()).unwrap();
    mac.update(format!("{t}.").as_bytes());
    mac.update(body);
    mac.verify_slice(&v1).is_ok()
}

async fn receive(req: HttpRequest, body: web::Bytes, inbox: web::Data<Inbox>) -> HttpResponse {
    let header = |name: &str| {
        req.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned()
    };
    let delivery = Delivery {
        event: header("x-chatgate-event"),
        delivery: header("x-chatgate-delivery"),
        signed: verify(&header("x-chatgate-signature"), &body)
            && header("content-type") == "application/json",
        body: serde_json::from_slice(&body).unwrap_or(Value::Null),
        at: Instant::now(),
    };
    inbox.seen.lock().unwrap().push(delivery);
    let answer = inbox.answers.lock().unwrap().pop_front();
    match answer.unwrap_or(Answer::Status(200)) {
        Answer::Status(status) => {
            HttpResponse::build(actix_web::http::StatusCode::from_u16(status).unwrap()).finish()
        }
        Answer::RetryAfter(seconds) => HttpResponse::ServiceUnavailable()
            .insert_header(("retry-after", seconds.to_string()))
            .finish(),
        Answer::Hang(time) => {
            tokio::time::sleep(time).await;
            HttpResponse::Ok().finish()
        }
    }
}

impl Receiver {
    pub async fn start() -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut receiver = Receiver {
            url: format!("http://127.0.0.1:{port}/hook"),
            port,
            inbox: Inbox::default(),
            server: None,
        };
        receiver.serve(listener);
        receiver
    }

    /// A receiver whose port is known but that is down until [`Receiver::up`].
    pub fn down() -> Receiver {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        Receiver {
            url: format!("http://127.0.0.1:{port}/hook"),
            port,
            inbox: Inbox::default(),
            server: None,
        }
    }

    pub fn up(&mut self) {
        let listener = std::net::TcpListener::bind(("127.0.0.1", self.port)).unwrap();
        self.serve(listener);
    }

    fn serve(&mut self, listener: std::net::TcpListener) {
        let inbox = self.inbox.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(web::Data::new(inbox.clone()))
                .route("/hook", web::post().to(receive))
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        self.server = Some(server.handle());
        tokio::spawn(server);
    }

    /// The next deliveries get these answers (then 200).
    pub fn answer(&self, answers: &[Answer]) {
        self.inbox.answers.lock().unwrap().extend(answers);
    }

    pub fn seen(&self) -> Vec<Delivery> {
        self.inbox.seen.lock().unwrap().clone()
    }

    /// Waits until `n` deliveries have arrived; returns them.
    pub async fn wait_for(&self, n: usize) -> Vec<Delivery> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let seen = self.seen();
            if seen.len() >= n {
                return seen;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {n} deliveries arrived: {seen:#?}",
                seen.len()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            drop(server.stop(false));
        }
    }
}

pub(crate) fn hooked(receiver: &Receiver) -> impl FnOnce(&mut chatgate::config::Settings) + '_ {
    move |s| {
        s.notify.webhooks = vec![receiver.url.clone()];
        s.notify.webhook_secret = Some(SecretString::from(SECRET.to_owned()));
        s.notify.public_url = Some("https://gate.example".to_owned());
    }
}

/// `chatgate_webhook_deliveries_total{type=..,outcome=..}` at `app`.
async fn deliveries(app: &TestApp, event: &str, outcome: &str) -> i64 {
    let (_, text) = app.get("/metrics").await;
    let prefix =
        format!("chatgate_webhook_deliveries_total{{type=\"{event}\",outcome=\"{outcome}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |v| v.parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_s_life_is_announced_signed_in_order_with_the_pinned_body() {
    let receiver = Receiver::start().await;
    let app = spawn_app_with(hooked(&receiver)).await;

    let (mut stream, request) = app.open_paused("deploy 1/a", "build; ship").await;
    let requested = receiver.wait_for(1).await;
    let (status, _) = app.reply("deploy 1/a", "CONFIRM_ACTION:confirm").await;
    stream.finish().await;
    let seen = receiver.wait_for(3).await;

    assert_eq!(status, 200);
    assert_eq!(requested.len(), 1, "announced while the run waits");
    assert!(seen.iter().all(|d| d.signed), "{seen:#?}");
    let types: Vec<_> = seen.iter().map(|d| d.event.as_str()).collect();
    assert_eq!(
        types,
        ["interaction.requested", "interaction.decided", "run.ended"]
    );
    let id = confirmation_id(&request);
    for delivery in &seen {
        let body = &delivery.body;
        assert_eq!(body["type"], delivery.event.as_str());
        assert_eq!(body["id"], delivery.delivery.as_str());
        assert_eq!(body["session_id"], "deploy 1/a");
        assert_eq!(body["confirmation_id"], id.as_str());
        assert_eq!(body["kind"], "approval");
        assert_eq!(body["key"], "anonymous");
        assert_eq!(
            body["decide_url"],
            "https://gate.example/#session=deploy%201%2Fa"
        );
        let at = body["at"].as_str().unwrap();
        assert!(humantime::parse_rfc3339(at).is_ok(), "{at}");
    }
    let data = &seen[0].body["data"];
    assert_eq!(
        *data,
        serde_json::to_value(&request.confirmation_data).unwrap()
    );
    let decided = &seen[1].body["data"];
    assert_eq!(decided["action"], "confirm");
    assert_eq!(decided["decisions"][0]["decision"], "approve");
    assert_eq!(decided["decided_by"]["key"], "anonymous");
    assert_eq!(decided["decided_by"]["client"], "127.0.0.1");
    assert_eq!(
        seen[2].body["data"],
        json!({"outcome": "completion", "reason": null})
    );
    assert_eq!(deliveries(&app, "run.ended", "delivered").await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_skips_timeouts_and_supersedes_each_have_their_event() {
    let receiver = Receiver::start().await;
    let app = spawn_app_with(|s| {
        hooked(&receiver)(s);
        s.pauses.confirm_timeout = Duration::from_secs(1);
        s.server.api_keys = vec![SecretString::from("agent-key-0123456789".to_owned())];
    })
    .await;
    let keyed = |body: Value| {
        app.client
            .post(app.url())
            .bearer_auth("agent-key-0123456789")
            .json(&body)
            .send()
    };
    // A question answered.
    let asking = keyed(
        json!({"session_id": "q", "message": "ask region: Which region? eu | us; deploy to {region}"}),
    );
    let mut stream = crate::helpers::EventStream::new(asking.await.unwrap());
    stream.until(ChunkType::InputRequest).await;
    let answered = keyed(json!({"session_id": "q", "message": "CONFIRM_ACTION:answer:us"}))
        .await
        .unwrap();
    assert_eq!(answered.status(), 200);
    stream.until(ChunkType::ConfirmationRequest).await;
    // Then left to time out.
    stream.finish().await;
    // A pause superseded by a new message.
    let first = keyed(json!({"session_id": "s", "message": "one"}))
        .await
        .unwrap();
    let mut first = crate::helpers::EventStream::new(first);
    first.until(ChunkType::ConfirmationRequest).await;
    let second = keyed(json!({"session_id": "s", "message": "two"}))
        .await
        .unwrap();
    let mut second = crate::helpers::EventStream::new(second);
    first.finish().await;
    second.until(ChunkType::ConfirmationRequest).await;
    let cancel = keyed(json!({"session_id": "s", "message": "CONFIRM_ACTION:cancel"}))
        .await
        .unwrap();
    assert_eq!(cancel.status(), 200);
    second.finish().await;
    receiver.wait_for(11).await;

    let of = |session: &str| -> Vec<Value> {
        receiver
            .seen()
            .into_iter()
            .filter(|d| d.body["session_id"] == session)
            .map(|d| d.body)
            .collect()
    };
    let q = of("q");
    let types: Vec<_> = q.iter().map(|b| b["type"].as_str().unwrap()).collect();
    assert_eq!(
        types,
        [
            "interaction.requested",
            "interaction.decided",
            "interaction.requested",
            "interaction.expired",
            "run.ended"
        ]
    );
    assert_eq!(q[0]["kind"], "question");
    assert_eq!(q[0]["key"], "key-1");
    assert_eq!(q[0]["data"]["questions"][0]["id"], "region");
    assert_eq!(q[1]["data"]["action"], "answer");
    assert_eq!(q[1]["data"]["answers"], json!({"region": "us"}));
    assert_eq!(q[1]["data"]["decided_by"]["key"], "key-1");
    assert_eq!(q[3]["kind"], "approval");
    assert_eq!(q[3]["confirmation_id"], q[2]["confirmation_id"]);
    assert_eq!(q[3]["data"]["reason"], "timeout");
    assert_eq!(
        q[4]["data"],
        json!({"outcome": "cancelled", "reason": "timeout"})
    );
    // The old run ends while the new one starts: its `run.ended` may come
    // before or after the new pause's `requested`, but its supersede is
    // announced before the new run can pause.
    let s = of("s");
    let old_id = &s[0]["confirmation_id"];
    let old: Vec<&Value> = s
        .iter()
        .filter(|b| b["confirmation_id"] == *old_id)
        .collect();
    let new: Vec<&Value> = s
        .iter()
        .filter(|b| b["confirmation_id"] != *old_id)
        .collect();
    let types = |events: &[&Value]| -> Vec<String> {
        events
            .iter()
            .map(|b| b["type"].as_str().unwrap().to_owned())
            .collect()
    };
    let life = ["interaction.requested", "interaction.decided", "run.ended"];
    assert_eq!(s.len(), 6);
    assert_eq!(
        s[1]["type"], "interaction.decided",
        "superseded before the new pause"
    );
    assert_eq!(types(&old), life);
    assert_eq!(types(&new), life);
    assert_eq!(old[1]["data"]["reason"], "superseded");
    assert_eq!(old[1]["data"]["decided_by"]["key"], "key-1");
    assert_eq!(old[2]["data"]["reason"], "superseded");
    assert_eq!(new[1]["data"]["action"], "cancel");
    assert_eq!(new[1]["data"]["reason"], "user");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_delivery_is_retried_with_its_id_and_holds_its_session_s_next_events() {
    let receiver = Receiver::start().await;
    receiver.answer(&[Answer::Status(500), Answer::RetryAfter(2)]);
    let app = spawn_app_with(hooked(&receiver)).await;
    let (mut stream, _) = app.open_paused("r", "one step").await;
    let (status, _) = app.reply("r", "CONFIRM_ACTION:confirm").await;
    stream.finish().await;
    let seen = receiver.wait_for(5).await;

    assert_eq!(status, 200, "a receiver that fails delays no reply");
    let types: Vec<_> = seen.iter().map(|d| d.event.as_str()).collect();
    assert_eq!(
        types,
        [
            "interaction.requested",
            "interaction.requested",
            "interaction.requested",
            "interaction.decided",
            "run.ended"
        ]
    );
    assert_eq!(seen[0].delivery, seen[1].delivery);
    assert_eq!(seen[1].delivery, seen[2].delivery);
    assert_ne!(seen[2].delivery, seen[3].delivery);
    assert!(seen.iter().all(|d| d.signed));
    let backoff = seen[1].at - seen[0].at;
    assert!(backoff >= Duration::from_millis(900), "{backoff:?}");
    let retry_after = seen[2].at - seen[1].at;
    assert!(
        retry_after >= Duration::from_millis(1900),
        "{retry_after:?}"
    );
    assert_eq!(deliveries(&app, "interaction.requested", "failed").await, 2);
    assert_eq!(
        deliveries(&app, "interaction.requested", "delivered").await,
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_that_hangs_delays_nothing_and_one_that_never_answers_is_given_up() {
    let receiver = Receiver::start().await;
    receiver.answer(&[Answer::Hang(Duration::from_secs(60))]);
    let app = spawn_app_with(|s| {
        hooked(&receiver)(s);
        s.notify.webhook_retry_for = Duration::from_secs(1);
    })
    .await;

    let started = Instant::now();
    let (mut stream, _) = app.open_paused("h", "one step").await;
    receiver.wait_for(1).await;
    let (status, _) = app.reply("h", "CONFIRM_ACTION:confirm").await;
    let last = stream.finish().await;
    let took = started.elapsed();

    assert_eq!(status, 200);
    assert_eq!(last.chunk_type, ChunkType::Completion);
    // The delivery hangs for 60 s (chatgate gives up at 10 s): the run
    // went on regardless.
    assert!(took < Duration::from_secs(8), "{took:?}");
    // The hung delivery times out at 10 s; past --webhook-retry-for it is
    // dropped, and the events behind it go out.
    let deadline = tokio::time::Instant::now() + WAIT;
    while deliveries(&app, "interaction.requested", "dropped").await == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never dropped");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let seen = receiver.wait_for(3).await;
    assert_eq!(seen[1].event, "interaction.decided");
    assert_eq!(seen[2].event, "run.ended");
    // The gauges are brought up to date every second.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let (_, text) = app.get("/metrics").await;
        if text.contains("chatgate_webhook_queue_depth 0")
            && text.contains("chatgate_webhook_oldest_undelivered_seconds 0")
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sqlite_nothing_is_lost_to_a_kill_9_while_the_receiver_is_down() {
    let dir = Dir::new();
    let mut receiver = Receiver::down();
    let target = receiver.url.clone();
    let hook = ["--webhook", &target, "--webhook-secret", SECRET];
    let mut first = durable::start(&dir, &hook);
    let url = durable::stream_url(&first);
    // One run ends before the crash, one is paused at it.
    let done = durable::open_paused(&url, json!({"session_id": "done", "message": "one"})).await;
    let (status, _) = durable::reply(&url, "done", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    let ended = durable::chunks(&done.finish().await);
    assert_eq!(ended.last().unwrap().chunk_type, ChunkType::Completion);
    let held = durable::open_paused(&url, json!({"session_id": "held", "message": "two"})).await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(held);

    receiver.up();
    let second = durable::start(&dir, &hook);
    receiver.wait_for(4).await;
    let url = durable::stream_url(&second);
    let (status, _) = durable::reply(&url, "held", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    receiver.wait_for(6).await;
    // Nothing more comes: each event once.
    tokio::time::sleep(Duration::from_millis(700)).await;

    let seen = receiver.seen();
    assert!(seen.iter().all(|d| d.signed));
    let of = |session: &str| -> Vec<String> {
        seen.iter()
            .filter(|d| d.body["session_id"] == session)
            .map(|d| d.event.clone())
            .collect()
    };
    let life = ["interaction.requested", "interaction.decided", "run.ended"];
    assert_eq!(of("done"), life, "{seen:#?}");
    assert_eq!(of("held"), life, "{seen:#?}");
    assert_eq!(seen.len(), 6, "{seen:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sqlite_a_graceful_stop_writes_down_what_was_delivered() {
    let dir = Dir::new();
    let receiver = Receiver::start().await;
    let target = receiver.url.clone();
    let hook = ["--webhook", &target, "--webhook-secret", SECRET];
    let mut first = durable::start(&dir, &hook);
    let url = durable::stream_url(&first);
    let run = durable::open_paused(&url, json!({"session_id": "once", "message": "one"})).await;
    let (status, _) = durable::reply(&url, "once", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    durable::chunks(&run.finish().await);
    receiver.wait_for(3).await;
    // The server has taken the three answers (settled in its memory).
    let metrics = format!("{}/metrics", first.url);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let text = reqwest::get(&metrics).await.unwrap().text().await.unwrap();
        let delivered: f64 = text
            .lines()
            .filter(|l| l.starts_with("chatgate_webhook_deliveries_total{"))
            .filter(|l| l.contains("outcome=\"delivered\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        if delivered >= 3.0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // At once: the deliveries' settles are still only in the sender's
    // memory (they are written together, at most a second later), so the
    // stop itself must write them: the outbox the next process reads
    // holds nothing, and it sends nothing again.
    durable::terminate(&mut first);
    let seen = receiver.seen();
    let events: Vec<&str> = seen.iter().map(|d| d.event.as_str()).collect();
    assert_eq!(
        events,
        ["interaction.requested", "interaction.decided", "run.ended"],
        "{seen:#?}"
    );
    let db = rusqlite::Connection::open(dir.path("runs.db")).unwrap();
    let undelivered: i64 = db
        .query_row("SELECT COUNT(*) FROM webhook_outbox", [], |row| row.get(0))
        .unwrap();
    assert_eq!(undelivered, 0, "delivered events left in the outbox");
}

#[test]
fn webhooks_need_a_long_secret() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let build = |configure: &dyn Fn(&mut chatgate::config::Settings)| {
        let mut settings = chatgate::config::Settings::for_bind("127.0.0.1:0");
        settings.notify.webhooks = vec!["http://127.0.0.1:9/hook".to_owned()];
        configure(&mut settings);
        match runtime.block_on(chatgate::startup::Application::build(settings)) {
            Ok(_) => String::new(),
            Err(err) => err.to_string(),
        }
    };

    assert!(build(&|_| {}).contains("--webhook-secret"));
    let short = build(&|s| s.notify.webhook_secret = Some(SecretString::from("short".to_owned())));
    assert!(short.contains("at least 16"), "{short}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_kept_and_revoked_is_announced() {
    let receiver = Receiver::start().await;
    let dir = crate::tools::Workdir::new();
    let app = crate::tools::app_with_tools(&dir, "", hooked(&receiver)).await;
    let (mut stream, _) = app.open_paused("g-hook", "note hooked").await;
    let response = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:confirm", "session_id": "g-hook",
            "grant": {"scope": "session", "tools": ["note"], "max_calls": 3},
        }))
        .await;
    assert_eq!(response.status(), 200);
    stream.finish().await;
    let grants: serde_json::Value = app
        .client
        .get(format!("{}/api/v1/grants", app.address))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = grants["grants"][0]["id"].as_str().unwrap().to_owned();
    let revoked = app
        .client
        .delete(format!("{}/api/v1/grants/{id}", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(revoked.status(), 204);

    let seen = receiver.wait_for(5).await;
    let types: Vec<_> = seen.iter().map(|d| d.event.as_str()).collect();
    assert_eq!(
        types,
        [
            "interaction.requested",
            "interaction.decided",
            "grant.created",
            "run.ended",
            "grant.revoked"
        ]
    );
    let created = &seen[2].body;
    assert_eq!(created["data"]["id"], id.as_str());
    assert_eq!(created["data"]["tools"], json!(["note"]));
    assert_eq!(created["data"]["max_calls"], 3);
    assert_eq!(created["session_id"], "g-hook");
    assert!(created.get("decide_url").is_none());
    assert!(seen.iter().all(|d| d.signed));
    assert_eq!(seen[4].body["data"]["revoked_by"], "anonymous");
}
