//! What the server writes, byte for byte, for one flow of each kind of
//! pause (#39: a refactoring changes no byte): the chunks of the run's
//! stream and of each reply, the webhook bodies queued, the audit lines,
//! and the stored record (at the pause, and at the end) in a SQLite store.
//! Ids, times and paths vary from run to run and are masked; everything
//! else must equal `tests/api/golden/<flow>.txt`, which the code before
//! the refactoring wrote (`GOLDEN_WRITE=1` writes it anew, for a change
//! that means to change the bytes).

use std::time::Duration;

use regex::Regex;
use reqwest::Response;
use serde_json::{json, Value};

use chatgate::store::compact;

use crate::helpers::{free_port, TestApp};
use crate::tools::{app_with_tools, Workdir};

/// Reads `response` until `until` (a regex) matches what was read, or its end.
async fn read_until(response: &mut Response, until: &str, seen: &mut String) {
    let pattern = Regex::new(until).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !pattern.is_match(seen) {
        let piece = tokio::time::timeout_at(deadline, response.chunk())
            .await
            .expect("in time")
            .expect("read");
        match piece {
            Some(bytes) => seen.push_str(&String::from_utf8_lossy(&bytes)),
            None => return,
        }
    }
}

async fn post(app: &TestApp, body: Value) -> Response {
    app.client
        .post(format!("{}/api/v1/chat/stream", app.address))
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// The stored rows of `runs.db`: each run's record, decision and end.
fn rows(dir: &Workdir) -> String {
    let db = rusqlite::Connection::open(dir.path("runs.db")).unwrap();
    let mut statement = db
        .prepare("SELECT record, decision, ended FROM paused_runs ORDER BY run")
        .unwrap();
    let rows = statement
        .query_map([], |row| {
            Ok(format!(
                "record {}\ndecision {}\nended {}\n",
                // The record as JSON, whether the row keeps it compressed
                // (#46) or as text.
                String::from_utf8(compact::json_of(row.get_ref(0)?.as_bytes()?).unwrap()).unwrap(),
                row.get::<_, Option<String>>(1)?.unwrap_or_default(),
                row.get::<_, Option<String>>(2)?.unwrap_or_default()
            ))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

/// The webhook bodies queued, in order.
fn outbox(dir: &Workdir) -> String {
    let db = rusqlite::Connection::open(dir.path("runs.db")).unwrap();
    let mut statement = db
        .prepare("SELECT event_type, body FROM webhook_outbox ORDER BY seq")
        .unwrap();
    let rows = statement
        .query_map([], |row| {
            Ok(format!(
                "{} {}\n",
                row.get::<_, String>(0)?,
                row.get::<_, String>(1)?
            ))
        })
        .unwrap();
    rows.map(Result::unwrap).collect()
}

/// Masks what differs from run to run: ids, times, durations, paths.
fn masked(text: &str, dir: &Workdir) -> String {
    let text = text.replace(&dir.path("").display().to_string(), "<dir>/");
    let masks = [
        (
            r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
            "<uuid>",
        ),
        (r"\b[0-9a-f]{32}\b", "<hex>"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", "<time>"),
        (r"\b1\d{12}\b", "<ms>"),
        (
            r#""(duration_ms|elapsed_ms|waited_ms|took_ms)":\d+"#,
            r#""$1":<n>"#,
        ),
        (r"127\.0\.0\.1:\d+", "127.0.0.1:<port>"),
        (r" in \d+ ms", " in <n> ms"),
        (r"\b[0-9a-f]{64}\b", "<sha256>"),
        // A receipt (a JWS): its key is made at start, its payload timed.
        (r#""receipt":"[A-Za-z0-9_.-]+""#, r#""receipt":"<jws>""#),
        // An idempotency key: a digest over the pause's id (#44).
        (
            r#""idempotency_key":"[A-Za-z0-9_-]{43}""#,
            r#""idempotency_key":"<key>""#,
        ),
        (r"(?m)^:.*\n", ""),
    ];
    let mut text = text;
    for (pattern, with) in masks {
        text = Regex::new(pattern)
            .unwrap()
            .replace_all(&text, with)
            .into_owned();
    }
    text
}

/// Runs a flow: `message` on a fresh server, then each reply in turn, each
/// after the run paused again; what was written, masked.
async fn flow(message: &str, replies: &[Value]) -> String {
    let dir = Workdir::new();
    let store = format!("sqlite:{}", dir.path("runs.db").display());
    let hook = format!("http://127.0.0.1:{}/hook", free_port());
    let app = app_with_tools(&dir, "", move |s| {
        s.cluster.store = store;
        s.notify.webhooks = vec![hook];
        s.notify.webhook_secret = Some("a-golden-webhook-secret".to_owned().into());
    })
    .await;
    let mut out = String::new();
    let mut stream = post(&app, json!({"message": message, "session_id": "g"})).await;
    let mut seen = String::new();
    for (n, reply) in replies.iter().enumerate() {
        let pauses = n + 1;
        let pattern = format!(r#"(?s)("stream_paused":true.*){{{pauses}}}"#);
        read_until(&mut stream, &pattern, &mut seen).await;
        out.push_str(&format!("== stored at pause {pauses}\n{}", rows(&dir)));
        let mut body = reply.clone();
        body["session_id"] = json!("g");
        let mut answer = post(&app, body).await;
        let mut answered = format!("status {}\n", answer.status());
        read_until(&mut answer, "$^", &mut answered).await;
        out.push_str(&format!("== reply {pauses}\n{answered}\n"));
    }
    read_until(&mut stream, r#""finished":true"#, &mut seen).await;
    out.push_str(&format!("== stream\n{seen}\n"));
    // The run's end is written to its row (with its events) as it ends.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !rows(&dir).contains("\nended {") && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out.push_str(&format!("== stored at the end\n{}", rows(&dir)));
    out.push_str(&format!("== webhooks\n{}", outbox(&dir)));
    // Its audit line `ended` is written around the same time.
    let audit_path = dir.path("audit.jsonl");
    let audit = loop {
        let audit = std::fs::read_to_string(&audit_path).unwrap_or_default();
        if audit.contains(r#""event":"ended""#) || tokio::time::Instant::now() > deadline {
            break audit;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    out.push_str(&format!("== audit\n{audit}"));
    masked(&out, &dir)
}

fn check(name: &str, written: &str) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/api/golden")
        .join(format!("{name}.txt"));
    if std::env::var_os("GOLDEN_WRITE").is_some() {
        std::fs::write(&path, written).unwrap();
        return;
    }
    let golden = std::fs::read_to_string(&path).expect("the golden file");
    if golden != written {
        let first = golden
            .lines()
            .zip(written.lines())
            .position(|(a, b)| a != b)
            .unwrap_or(golden.lines().count().min(written.lines().count()));
        panic!(
            "{name}: line {} differs\n golden: {:?}\nwritten: {:?}",
            first + 1,
            golden.lines().nth(first),
            written.lines().nth(first)
        );
    }
}

#[tokio::test]
async fn an_approval_flow_writes_the_same_bytes() {
    let written = flow(
        "note golden one; note golden two",
        &[json!({"message": "CONFIRM_ACTION:confirm",
                 "decisions": [{"index": 2, "decision": "reject", "reason": "not now"}]})],
    )
    .await;
    check("approval", &written);
}

#[tokio::test]
async fn a_question_flow_writes_the_same_bytes() {
    let written = flow(
        "ask region: which region? eu-west | us-east; note to {region}",
        &[
            json!({"message": "CONFIRM_ACTION:answer", "answers": {"region": "us-east"}}),
            json!({"message": "CONFIRM_ACTION:confirm"}),
        ],
    )
    .await;
    check("question", &written);
}
