//! Grants over real sockets: a confirm's `grant` lets later calls run
//! without asking, within its scope, matchers, time and budget; listed,
//! revoked, kept across a restart (sqlite), refused when it does not fit.

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::access::post_as;
use crate::durable::{chunks, read_raw, start, stream_url, terminate, Dir};
use crate::helpers::{error_type, one_chunk, EventStream, TestApp};
use crate::tools::{app_with_tools, outputs, Workdir};

/// `deploy` is high risk (not grantable), `note` low.
const EXTRA: &str = r#"
[[tool]]
name = "deploy"
description = "Deploy"
risk = "high"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }

[[rule]]
name = "no prod notes"
tool = "note"
args = { "/step" = "note prod*" }
decision = "deny"
"#;

/// A confirm carrying `grant`: its status and chunk.
async fn confirm_granting(app: &TestApp, session: &str, grant: Value) -> (u16, String, String) {
    let response = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:confirm",
            "session_id": session,
            "grant": grant,
        }))
        .await;
    let (status, chunk) = one_chunk(response).await;
    let kind = if chunk.chunk_type == ChunkType::Error {
        error_type(&chunk).to_owned()
    } else {
        String::new()
    };
    (status.as_u16(), kind, chunk.chunk)
}

/// Runs `message` on `session`: whether it paused, and its stream.
async fn run(app: &TestApp, session: &str, message: &str) -> (bool, EventStream) {
    let mut stream = app.open(session, message).await;
    let first_stop = stream.next_chunk_until_pause_or_end().await;
    (first_stop, stream)
}

trait PauseOrEnd {
    async fn next_chunk_until_pause_or_end(&mut self) -> bool;
}

impl PauseOrEnd for EventStream {
    /// Reads until the run pauses (`true`) or ends (`false`).
    async fn next_chunk_until_pause_or_end(&mut self) -> bool {
        while let Some(chunk) = self.next_chunk().await {
            if chunk.chunk_type == ChunkType::ConfirmationRequest {
                return true;
            }
            if chunk.finished {
                return false;
            }
        }
        false
    }
}

async fn grants(app: &TestApp) -> Vec<Value> {
    let (status, body) = app.get("/api/v1/grants").await;
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).unwrap();
    body["grants"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_grant_runs_later_calls_of_its_session_without_asking_until_spent() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, EXTRA, |_| {}).await;
    let (mut first, _) = app.open_paused("g", "note one").await;
    let grant = json!({"scope": "session", "tools": ["note"], "ttl": "30m", "max_calls": 2});
    let (status, _, _) = confirm_granting(&app, "g", grant).await;
    assert_eq!(status, 200);
    first.finish().await;
    let granted = first
        .chunks
        .iter()
        .find(|c| c.chunk.starts_with("Granted: note"))
        .expect("the stream shows the grant");
    let id = granted.metadata["grant"]["id"].as_str().unwrap().to_owned();

    let listed = grants(&app).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["id"], id.as_str());
    assert_eq!(listed[0]["calls_left"], 2);
    assert_eq!(listed[0]["scope"], "session");
    assert_eq!(listed[0]["granted_by"], "anonymous");
    assert_eq!(listed[0]["session_id"], "g");

    for n in ["two", "three"] {
        let (paused, mut stream) = run(&app, "g", &format!("note {n}")).await;
        assert!(!paused, "covered by the grant: not asked");
        stream.finish().await;
        assert_eq!(
            outputs(&stream)[0].metadata["approved_by"],
            json!({"grant": id})
        );
    }
    let (paused, _) = run(&app, "g", "note four").await;
    assert!(paused, "spent: asked again");
    assert_eq!(dir.notes(), ["note one", "note two", "note three"]);
    let audit = dir.audit();
    assert_eq!(audit.iter().filter(|r| r["event"] == "granted").count(), 1);
    let executed: Vec<&Value> = audit.iter().filter(|r| r["event"] == "executed").collect();
    assert_eq!(executed[1]["approved_by"], json!({"grant": id}));
    assert!(grants(&app).await.is_empty(), "a spent grant is not listed");
}

#[tokio::test]
async fn a_session_grant_covers_no_other_session_and_a_key_grant_every_one_of_its_key() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, EXTRA, |s| {
        s.server.api_keys = vec!["alice".into(), "bob".into()];
    })
    .await;
    let mut first = EventStream::new(post_as(&app, Some("alice"), "a1", "note one").await);
    first.until(ChunkType::ConfirmationRequest).await;
    let reply = |grant: Value, session: &str| json!({"message": "CONFIRM_ACTION:confirm", "session_id": session, "grant": grant});
    let grant = json!({"scope": "session", "tools": ["note"]});
    let response = app
        .client
        .post(app.url())
        .bearer_auth("alice")
        .json(&reply(grant, "a1"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    first.finish().await;

    let mut other = EventStream::new(post_as(&app, Some("alice"), "a2", "note two").await);
    assert!(
        other.next_chunk_until_pause_or_end().await,
        "another session asks"
    );
    app.client
        .post(app.url())
        .bearer_auth("alice")
        .json(&reply(json!({"scope": "key", "tools": ["note"]}), "a2"))
        .send()
        .await
        .unwrap();
    other.finish().await;

    let mut third = EventStream::new(post_as(&app, Some("alice"), "a3", "note three").await);
    assert!(
        !third.next_chunk_until_pause_or_end().await,
        "the key's grant covers it"
    );
    let mut bob = EventStream::new(post_as(&app, Some("bob"), "b1", "note bob").await);
    assert!(
        bob.next_chunk_until_pause_or_end().await,
        "another key's session asks"
    );
    let bobs = app
        .client
        .get(format!("{}/api/v1/grants", app.address))
        .bearer_auth("bob")
        .send()
        .await
        .unwrap();
    let bobs: Value = bobs.json().await.unwrap();
    assert_eq!(bobs["grants"], json!([]), "grants are per namespace");
}

#[tokio::test]
async fn a_grant_s_matchers_bound_what_it_covers_and_a_deny_rule_beats_it() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, EXTRA, |_| {}).await;
    let (mut first, _) = app.open_paused("m", "note ok one").await;
    let grant = json!({"scope": "session", "tools": ["note"], "args": {"/step": "note ok*"}});
    assert_eq!(confirm_granting(&app, "m", grant).await.0, 200);
    first.finish().await;

    let (paused, mut covered) = run(&app, "m", "note ok two").await;
    assert!(!paused);
    covered.finish().await;
    let (paused, mut asked) = run(&app, "m", "note other").await;
    assert!(paused, "the matcher does not accept it");
    app.reply("m", "CONFIRM_ACTION:cancel").await;
    asked.finish().await; // ended, so the next message starts a run
    let (paused, mut denied) = run(&app, "m", "note prod push").await;
    assert!(!paused);
    denied.finish().await;
    assert_eq!(outputs(&denied)[0].metadata["error_type"], "denied_by_rule");
    assert_eq!(dir.notes(), ["note ok one", "note ok two"]);
}

#[tokio::test]
async fn a_revoked_or_expired_grant_covers_nothing() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, EXTRA, |_| {}).await;
    let (mut first, _) = app.open_paused("r", "note one").await;
    confirm_granting(&app, "r", json!({"scope": "session", "tools": ["note"]})).await;
    first.finish().await;
    let id = grants(&app).await[0]["id"].as_str().unwrap().to_owned();

    let delete = |id: String| {
        app.client
            .delete(format!("{}/api/v1/grants/{id}", app.address))
            .send()
    };
    assert_eq!(delete(id.clone()).await.unwrap().status(), 204);
    let again = delete(id.clone()).await.unwrap();
    assert_eq!(again.status(), 404);
    let body: Value = again.json().await.unwrap();
    assert_eq!(body["error_type"], "no_such_grant");
    let (paused, _) = run(&app, "r", "note two").await;
    assert!(paused, "revoked: asked");
    let revoked = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "grant_revoked")
        .expect("on the record");
    assert_eq!(revoked["grant_id"], id.as_str());

    confirm_granting(
        &app,
        "r",
        json!({"scope": "session", "tools": ["note"], "ttl": "1s"}),
    )
    .await;
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let (paused, _) = run(&app, "r", "note three").await;
    assert!(paused, "expired: asked");
}

#[tokio::test]
async fn a_grant_that_does_not_fit_the_pause_is_refused_and_the_pause_stays() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, EXTRA, |s| {
        s.pauses.max_grant_ttl = std::time::Duration::from_secs(600);
    })
    .await;
    let (mut stream, _) = app.open_paused("bad", "note one; deploy it").await;
    let cases = [
        json!({"scope": "forever", "tools": ["note"]}),
        json!({"scope": "session", "tools": ["email"]}),
        json!({"scope": "session", "tools": ["note*"]}),
        json!({"scope": "session", "tools": ["deploy"]}),
        json!({"scope": "session", "tools": ["note"], "ttl": "11m"}),
        json!({"scope": "session", "tools": ["note"], "ttl": "0s"}),
        json!({"scope": "session", "tools": ["note"], "max_calls": 0}),
        json!({"scope": "session", "tools": ["note"], "max_calls": 1001}),
        json!({"scope": "session", "tools": ["note"], "args": {"step": "x"}}),
        json!({"scope": "session", "tools": ["note"], "colour": "red"}),
    ];
    for grant in cases {
        let (status, kind, text) = confirm_granting(&app, "bad", grant.clone()).await;
        assert_eq!(
            (status, kind.as_str()),
            (422, "invalid_grant"),
            "{grant}: {text}"
        );
    }
    // A rejected tool is not granted.
    let response = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:confirm", "session_id": "bad",
            "decisions": [{"index": 1, "decision": "reject"}],
            "grant": {"scope": "session", "tools": ["note"]},
        }))
        .await;
    let (status, chunk) = one_chunk(response).await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (422, "invalid_grant")
    );
    // With a cancel: not a confirm.
    let response = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:cancel", "session_id": "bad",
            "grant": {"scope": "session", "tools": ["note"]},
        }))
        .await;
    assert_eq!(one_chunk(response).await.0, 422);
    let (status, _, _) =
        confirm_granting(&app, "bad", json!({"scope": "session", "tools": ["note"]})).await;
    assert_eq!(status, 200, "the pause stayed");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

/// The tools file of the restart test: `note` writing marks, with
/// `parameters` as given.
fn restart_tools(dir: &Dir, parameters: &str) -> String {
    let path = dir.path("tools.toml");
    std::fs::write(
        &path,
        format!(
            "[[tool]]\nname = \"note\"\ndescription = \"d\"\nrisk = \"low\"\ncommand = [\"true\"]\nparameters = {parameters}\n"
        ),
    )
    .unwrap();
    path.display().to_string()
}

async fn paused_on(url: &str, session: &str, message: &str) -> bool {
    let response = crate::durable::post(
        url,
        json!({"message": message, "session_id": session}),
        None,
    )
    .await;
    let raw = read_raw(response, Some("\"chunk_type\":\"confirmation_request\"")).await;
    chunks(&raw)
        .iter()
        .any(|c| c.chunk_type == ChunkType::ConfirmationRequest)
}

#[tokio::test]
async fn a_grant_and_its_calls_left_survive_a_restart_but_not_a_changed_schema() {
    let dir = Dir::new();
    let schema = "{ type = \"object\" }";
    let tools = restart_tools(&dir, schema);
    let mut server = start(&dir, &["--tools", &tools, "--detach-grace", "0s"]);
    let url = stream_url(&server);
    let reading =
        crate::durable::open_paused(&url, json!({"message": "note a", "session_id": "k"})).await;
    let body = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "k",
        "grant": {"scope": "session", "tools": ["note"], "max_calls": 3}});
    let response = crate::durable::post(&url, body, None).await;
    assert_eq!(response.status(), 200);
    reading.finish().await;
    assert!(!paused_on(&url, "k", "note b").await, "one call used");
    terminate(&mut server);

    let mut server = start(&dir, &["--tools", &tools, "--detach-grace", "0s"]);
    let listed: Value = reqwest::get(format!("{}/api/v1/grants", server.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        listed["grants"][0]["calls_left"], 2,
        "kept with its calls left"
    );
    assert!(!paused_on(&stream_url(&server), "k", "note c").await);
    terminate(&mut server);

    let changed = restart_tools(
        &dir,
        "{ type = \"object\", properties = { x = { type = \"string\" } } }",
    );
    let server = start(&dir, &["--tools", &changed, "--detach-grace", "0s"]);
    assert!(
        paused_on(&stream_url(&server), "k", "note d").await,
        "the schema changed: not covered"
    );
}

#[tokio::test]
async fn a_namespace_holding_a_thousand_live_grants_refuses_the_next_one() {
    let dir = Dir::new();
    let tools = restart_tools(&dir, "{ type = \"object\" }");
    let mut server = start(&dir, &["--tools", &tools]);
    terminate(&mut server);
    // A thousand live grants of the namespace without keys, as the store
    // keeps them (written straight into its file while no server runs).
    let db = rusqlite::Connection::open(dir.path("runs.db")).unwrap();
    let far = chatgate::clock::now_ms() + 3_600_000;
    for n in 0..1000 {
        let grant = json!({
            "id": format!("g{n}"), "scope": "session", "namespace": "-", "key": "anonymous",
            "session_id": "other", "tools": ["note"], "args": {}, "schemas": ["x"],
            "created_at_ms": 1, "expires_at_ms": far, "max_calls": 1, "calls_left": 1,
            "granted_by": "anonymous",
        });
        db.execute(
            "INSERT INTO grants (id, namespace, expires_at, calls_left, grant_json) \
             VALUES (?1, '-', ?2, 1, ?3)",
            rusqlite::params![format!("g{n}"), far as i64, grant.to_string()],
        )
        .unwrap();
    }
    drop(db);

    let server = start(&dir, &["--tools", &tools]);
    let url = stream_url(&server);
    let reading =
        crate::durable::open_paused(&url, json!({"message": "note a", "session_id": "full"})).await;
    let body = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "full",
        "grant": {"scope": "session", "tools": ["note"]}});
    let response = crate::durable::post(&url, body, None).await;
    let status = response.status().as_u16();
    let chunk = chunks(&read_raw(response, None).await).remove(0);
    assert_eq!((status, error_type(&chunk)), (422, "too_many_grants"));
    let (status, _) = crate::durable::reply(&url, "full", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200, "the pause stayed");
    reading.finish().await;
}
