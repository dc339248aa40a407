//! The inbox (`GET /api/v1/interactions`, #19): every pending pause a
//! caller may decide, oldest expiry first, paged; each namespace sees its
//! own; a listed pause is decided by the usual reply with no connection to
//! its run, and a re-attach shows the outcome.

use std::time::Duration;

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with, EventStream, TestApp};

const INBOX: &str = "/api/v1/interactions";

/// GETs the inbox with `query` (and `key`): its status and JSON body.
async fn inbox(app: &TestApp, key: Option<&str>, query: &str) -> (u16, Value) {
    let mut request = app.client.get(format!("{}{INBOX}{query}", app.address));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "{status}"
    );
    (status, response.json().await.unwrap())
}

/// Starts a run with `key` and reads it to its pause (`kind` of chunk),
/// then drops the connection: the run waits detached.
async fn pause_and_leave(
    app: &TestApp,
    key: Option<&str>,
    session: &str,
    message: &str,
    kind: ChunkType,
) {
    let mut request = app
        .client
        .post(app.url())
        .json(&json!({ "message": message, "session_id": session }));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), 200);
    let mut stream = EventStream::new(response);
    stream.until(kind).await;
}

fn ids(body: &Value, field: &str) -> Vec<String> {
    body["interactions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i[field].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn pending_confirmations_and_questions_are_listed_with_their_data() {
    let app = spawn_app().await;
    pause_and_leave(
        &app,
        None,
        "plan",
        "back up; drop old tables",
        ChunkType::ConfirmationRequest,
    )
    .await;
    pause_and_leave(
        &app,
        None,
        "ask",
        "ask region: where? eu | us; go to {region}",
        ChunkType::InputRequest,
    )
    .await;
    // A run at work or finished is not listed.
    app.open("done", "what is this?").await.finish().await;

    let (status, body) = inbox(&app, None, "").await;

    assert_eq!(status, 200, "{body}");
    let items = body["interactions"].as_array().unwrap();
    assert_eq!(items.len(), 2, "{body}");
    let plan = items.iter().find(|i| i["session_id"] == "plan").unwrap();
    assert_eq!(plan["kind"], "approval");
    assert_eq!(plan["risk_level"], "high");
    assert_eq!(plan["summary"], "Confirm the plan of 2 task(s)?");
    assert_eq!(plan["key"], "anonymous");
    assert_eq!(
        plan["confirmation_data"]["tasks"][1]["description"],
        "drop old tables"
    );
    assert_eq!(
        plan["confirmation_data"]["confirmation_id"],
        plan["confirmation_id"]
    );
    let ask = items.iter().find(|i| i["session_id"] == "ask").unwrap();
    assert_eq!(ask["kind"], "question");
    assert_eq!(ask["title"], "where?");
    assert!(ask.get("risk_level").is_none());
    assert_eq!(ask["confirmation_data"]["questions"][0]["id"], "region");
    for item in items {
        let created = humantime::parse_rfc3339(item["created_at"].as_str().unwrap()).unwrap();
        let expires = humantime::parse_rfc3339(item["expires_at"].as_str().unwrap()).unwrap();
        let timeout = expires.duration_since(created).unwrap();
        assert!(
            timeout >= Duration::from_secs(299) && timeout <= Duration::from_secs(301),
            "{timeout:?}"
        );
    }
}

#[tokio::test]
async fn a_listed_pause_is_decided_by_a_reply_alone_and_leaves_the_inbox() {
    // A short keep-alive: the server soon notices the client gone.
    let app = spawn_app_with(|s| s.server.keep_alive = Duration::from_millis(50)).await;
    pause_and_leave(
        &app,
        None,
        "later",
        "write the report",
        ChunkType::ConfirmationRequest,
    )
    .await;
    app.eventually("the run is detached", |app| app.logs.detached() == 1)
        .await;
    let (_, body) = inbox(&app, None, "").await;
    let item = &body["interactions"][0];

    let reply = json!({"message": "CONFIRM_ACTION:confirm", "session_id": item["session_id"],
                       "confirmation_id": item["confirmation_id"]});
    let decided = app.post_json(&reply).await;
    assert_eq!(decided.status(), 200);
    let (_, after) = inbox(&app, None, "").await;
    assert_eq!(after["interactions"], json!([]));
    let mut seen = EventStream::resumed(app.reattach("later", 0).await, 0);
    let last = seen.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion, "{last:?}");
}

#[tokio::test]
async fn the_oldest_expiry_comes_first_and_pages_follow_after() {
    let app = spawn_app_with(|s| s.pauses.confirm_timeout = Duration::from_secs(60)).await;
    for i in 0..5 {
        pause_and_leave(
            &app,
            None,
            &format!("s{i}"),
            "step",
            ChunkType::ConfirmationRequest,
        )
        .await;
        // Whole seconds on the wire; the order is by the exact expiry.
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let (_, all) = inbox(&app, None, "").await;
    let (_, first) = inbox(&app, None, "?limit=2").await;
    let after = ids(&first, "confirmation_id")[1].clone();
    let (_, second) = inbox(&app, None, &format!("?limit=2&after={after}")).await;
    let after = ids(&second, "confirmation_id")[1].clone();
    let (_, third) = inbox(&app, None, &format!("?limit=2&after={after}")).await;

    assert_eq!(ids(&all, "session_id"), ["s0", "s1", "s2", "s3", "s4"]);
    assert_eq!(ids(&first, "session_id"), ["s0", "s1"]);
    assert_eq!(ids(&second, "session_id"), ["s2", "s3"]);
    assert_eq!(ids(&third, "session_id"), ["s4"]);
}

#[tokio::test]
async fn a_bad_limit_is_a_400_and_an_unknown_after_starts_over() {
    let app = spawn_app().await;
    pause_and_leave(&app, None, "one", "step", ChunkType::ConfirmationRequest).await;

    for query in ["?limit=0", "?limit=501", "?limit=ten", "?limit=-1"] {
        let (status, body) = inbox(&app, None, query).await;
        assert_eq!(status, 400, "{query}");
        assert_eq!(body["error_type"], "invalid_request");
        assert!(
            body["message"].as_str().unwrap().contains("1 to 500"),
            "{body}"
        );
    }
    let (status, body) = inbox(&app, None, "?limit=500&after=no-such-pause").await;
    assert_eq!(status, 200);
    assert_eq!(ids(&body, "session_id"), ["one"]);
}

#[tokio::test]
async fn each_key_sees_its_own_namespace_and_no_key_gets_401() {
    let app = spawn_app_with(|s| s.server.api_keys = vec!["alice".into(), "bob".into()]).await;
    pause_and_leave(
        &app,
        Some("alice"),
        "demo-1",
        "alice's step",
        ChunkType::ConfirmationRequest,
    )
    .await;
    pause_and_leave(
        &app,
        Some("bob"),
        "demo-1",
        "bob's step",
        ChunkType::ConfirmationRequest,
    )
    .await;
    pause_and_leave(
        &app,
        Some("bob"),
        "demo-2",
        "ask where?; go {q1}",
        ChunkType::InputRequest,
    )
    .await;

    let (_, alice) = inbox(&app, Some("alice"), "").await;
    let (_, bob) = inbox(&app, Some("bob"), "").await;
    let (status, refused) = inbox(&app, None, "").await;
    let (wrong, _) = inbox(&app, Some("mallory"), "").await;

    let tasks = |body: &Value| -> Vec<String> {
        body["interactions"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|i| {
                i["confirmation_data"]["tasks"][0]["description"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    };
    assert_eq!(tasks(&alice), ["alice's step"]);
    assert_eq!(ids(&alice, "key"), ["key-1"]);
    assert_eq!(tasks(&bob), ["bob's step"]);
    assert_eq!(ids(&bob, "session_id").len(), 2);
    assert_eq!(ids(&bob, "key"), ["key-2", "key-2"]);
    assert_eq!(status, 401);
    assert_eq!(refused["error_type"], "unauthorized");
    assert_eq!(wrong, 401);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_sqlite_the_inbox_lists_pauses_restored_after_a_restart() {
    use crate::durable::{self, Dir};
    let dir = Dir::new();
    let mut first = durable::start(&dir, &[]);
    let url = durable::stream_url(&first);
    let opened = durable::post(
        &url,
        json!({"message": "one; two", "session_id": "kept"}),
        None,
    )
    .await;
    durable::read_raw(opened, Some("confirmation_request")).await;

    durable::terminate(&mut first);
    let second = durable::start(&dir, &[]);
    let body: Value = reqwest::get(format!("{}{INBOX}", second.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    let items = body["interactions"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{body}");
    assert_eq!(items[0]["session_id"], "kept");
    assert_eq!(items[0]["summary"], "Confirm the plan of 2 task(s)?");
    let reply = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "kept",
                       "confirmation_id": items[0]["confirmation_id"]});
    let decided = reqwest::Client::new()
        .post(durable::stream_url(&second))
        .json(&reply)
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status(), 200);
}

/// POSTs `body` to the chat endpoint with `key`: its status and one chunk.
async fn post_as(app: &TestApp, key: &str, body: Value) -> (u16, chatgate::protocol::Chunk) {
    let response = app
        .client
        .post(app.url())
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap();
    let (status, chunk) = crate::helpers::one_chunk(response).await;
    (status.as_u16(), chunk)
}

#[tokio::test]
async fn an_approver_lists_and_decides_every_namespace_s_pauses_by_confirmation_id() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let path = audit.clone();
    let app = spawn_app_with(move |s| {
        s.server.api_keys = vec!["alice".into(), "bob".into()];
        s.server.approver_keys = vec!["boss".into()];
        s.tooling.audit_log = Some(path);
        // The server soon notices a client gone: the runs wait detached.
        s.server.keep_alive = Duration::from_millis(50);
    })
    .await;
    pause_and_leave(
        &app,
        Some("alice"),
        "demo-1",
        "alice's step",
        ChunkType::ConfirmationRequest,
    )
    .await;
    pause_and_leave(
        &app,
        Some("bob"),
        "demo-1",
        "bob's step",
        ChunkType::ConfirmationRequest,
    )
    .await;

    app.eventually("both runs detached", |app| app.logs.detached() == 2)
        .await;
    let (status, listing) = inbox(&app, Some("boss"), "").await;
    assert_eq!(status, 200);
    let items = listing["interactions"].as_array().unwrap().clone();
    assert_eq!(items.len(), 2, "{listing}");
    let bobs = items.iter().find(|i| i["key"] == "key-2").unwrap();
    assert_eq!(bobs["session_id"], "demo-1");

    let (status, refused) = post_as(
        &app,
        "boss",
        json!({"message": "CONFIRM_ACTION:confirm", "session_id": "demo-1"}),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(crate::helpers::error_type(&refused), "invalid_request");
    assert!(
        refused.chunk.contains("confirmation_id"),
        "{}",
        refused.chunk
    );
    // A namespace's own key cannot reach another's pause by its id.
    let (status, _) = post_as(
        &app,
        "alice",
        json!({"message": "CONFIRM_ACTION:confirm",
        "session_id": "demo-1", "confirmation_id": bobs["confirmation_id"]}),
    )
    .await;
    assert_eq!(status, 409, "alice's own demo-1 is another pause: stale");
    let (status, ack) = post_as(
        &app,
        "boss",
        json!({"message": "CONFIRM_ACTION:confirm",
        "session_id": "demo-1", "confirmation_id": bobs["confirmation_id"]}),
    )
    .await;
    assert_eq!(status, 200, "{ack:?}");

    let (_, alice) = inbox(&app, Some("alice"), "").await;
    assert_eq!(ids(&alice, "key"), ["key-1"], "alice's still waits");
    let (_, bob) = inbox(&app, Some("bob"), "").await;
    assert_eq!(bob["interactions"], json!([]));
    // The approver reads the run it decided, named by the pause.
    let response = app
        .client
        .post(app.url())
        .bearer_auth("boss")
        .header("Last-Event-ID", "0")
        .json(&json!({"session_id": "demo-1", "confirmation_id": bobs["confirmation_id"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut run = EventStream::resumed(response, 0);
    let received = run.until(ChunkType::ConfirmationReceived).await;
    assert_eq!(
        received.metadata["confirmation_id"],
        bobs["confirmation_id"]
    );
    // On the record: requested by key-2, approved by approver-1.
    let records: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let proposed = records
        .iter()
        .find(|r| r["event"] == "proposed" && r["confirmation_id"] == bobs["confirmation_id"])
        .unwrap();
    let decided = records.iter().find(|r| r["event"] == "decided").unwrap();
    assert_eq!(proposed["key"], "key-2");
    assert_eq!(decided["key"], "approver-1");
}

#[tokio::test]
async fn an_approver_may_not_start_a_run_nor_re_attach_without_a_pause_s_id() {
    let app = spawn_app_with(|s| {
        s.server.api_keys = vec!["alice".into()];
        s.server.approver_keys = vec!["boss".into()];
    })
    .await;

    let (status, chunk) = post_as(
        &app,
        "boss",
        json!({"message": "deploy", "session_id": "x"}),
    )
    .await;
    assert_eq!(status, 403);
    assert_eq!(crate::helpers::error_type(&chunk), "forbidden_role");
    let response = app
        .client
        .post(app.url())
        .bearer_auth("boss")
        .header("Last-Event-ID", "0")
        .json(&json!({"session_id": "x"}))
        .send()
        .await
        .unwrap();
    let (status, chunk) = crate::helpers::one_chunk(response).await;
    assert_eq!(status, 400);
    assert!(chunk.chunk.contains("confirmation_id"));
    let (status, chunk) = post_as(
        &app,
        "boss",
        json!({"message": "CONFIRM_ACTION:confirm",
        "session_id": "x", "confirmation_id": "no-such-pause"}),
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(
        crate::helpers::error_type(&chunk),
        "no_pending_confirmation"
    );
}

#[tokio::test]
async fn approver_lines_in_the_keys_file_are_approver_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keys");
    std::fs::write(&path, "alice\napprover boss\n").unwrap();
    let app = spawn_app_with(move |s| s.server.api_keys_file = Some(path)).await;
    pause_and_leave(
        &app,
        Some("alice"),
        "a",
        "step",
        ChunkType::ConfirmationRequest,
    )
    .await;

    let (status, listing) = inbox(&app, Some("boss"), "").await;
    let (refused, _) = post_as(&app, "boss", json!({"message": "go", "session_id": "b"})).await;

    assert_eq!(status, 200);
    assert_eq!(ids(&listing, "key"), ["key-1"]);
    assert_eq!(refused, 403);
}

#[tokio::test]
async fn an_approval_lists_each_task_with_its_risk_and_a_preview_and_its_time_left() {
    let app = spawn_app().await;
    let long = "x".repeat(300);
    let message = format!("rm -rf /srv/data; note {long}");
    pause_and_leave(
        &app,
        None,
        "danger",
        &message,
        ChunkType::ConfirmationRequest,
    )
    .await;

    let (status, body) = inbox(&app, None, "").await;

    assert_eq!(status, 200);
    let item = &body["interactions"][0];
    assert_eq!(item["risk_level"], "high");
    let left = item["expires_in_seconds"].as_u64().unwrap();
    assert!(left > 0 && left <= 300, "{left}");
    let tasks = item["tasks"].as_array().unwrap();
    assert_eq!(tasks.len(), 2);
    assert_eq!(tasks[0]["index"], 1);
    assert_eq!(tasks[0]["tool"], "rm");
    assert_eq!(tasks[0]["risk_level"], "high");
    assert_eq!(tasks[0]["simulated"], true);
    assert_eq!(tasks[0]["description"], "rm -rf /srv/data");
    assert_eq!(tasks[0]["args"], r#"{"step":"rm -rf /srv/data"}"#);
    // A long task is cut, and says so.
    let cut = tasks[1]["description"].as_str().unwrap();
    assert_eq!(cut.chars().count(), 121);
    assert!(cut.ends_with('…'));
}

#[tokio::test]
async fn an_approver_reads_how_a_run_it_decided_ended_by_the_pause_s_id() {
    let app = spawn_app_with(|s| {
        s.server.api_keys = vec!["alice".into()];
        s.server.approver_keys = vec!["boss".into()];
        s.pauses.detach_grace = Duration::ZERO;
    })
    .await;
    pause_and_leave(
        &app,
        Some("alice"),
        "job",
        "build",
        ChunkType::ConfirmationRequest,
    )
    .await;
    let (_, listed) = inbox(&app, Some("boss"), "").await;
    let id = listed["interactions"][0]["confirmation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let decided = app
        .client
        .post(app.url())
        .bearer_auth("boss")
        .json(&json!({"message": "CONFIRM_ACTION:confirm", "session_id": "job", "confirmation_id": id}))
        .send()
        .await
        .unwrap();
    assert_eq!(decided.status(), 200);
    let read = |query: String| {
        app.client
            .get(format!("{}/api/v1/runs/job{query}", app.address))
            .bearer_auth("boss")
            .send()
    };

    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    let outcome: Value = loop {
        let response = read(format!("?confirmation_id={id}")).await.unwrap();
        if response.status() == 200 {
            break response.json().await.unwrap();
        }
        assert_eq!(response.status(), 404);
        assert!(
            tokio::time::Instant::now() < deadline,
            "the run never ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(outcome["outcome"], "completion");
    assert_eq!(outcome["pauses"][0]["decided_by"], "approver-1");
    // An approver names the run by a pause: without one, 400.
    assert_eq!(read(String::new()).await.unwrap().status(), 400);
    assert_eq!(
        read("?confirmation_id=other".into())
            .await
            .unwrap()
            .status(),
        404
    );
}

#[tokio::test]
async fn a_reply_sent_again_after_the_run_s_grace_is_told_who_decided_from_its_kept_outcome() {
    let app = spawn_app_with(|s| {
        s.server.api_keys = vec!["alice".into()];
        s.server.approver_keys = vec!["boss".into()];
        s.pauses.detach_grace = Duration::ZERO;
    })
    .await;
    pause_and_leave(
        &app,
        Some("alice"),
        "late",
        "build",
        ChunkType::ConfirmationRequest,
    )
    .await;
    let (_, listed) = inbox(&app, Some("boss"), "").await;
    let id = listed["interactions"][0]["confirmation_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let send = |key: &'static str| {
        app.client
            .post(app.url())
            .bearer_auth(key)
            .json(&json!({"message": "CONFIRM_ACTION:confirm", "session_id": "late", "confirmation_id": id}))
            .send()
    };
    assert_eq!(send("boss").await.unwrap().status(), 200);
    // The run ends and, with no grace, its log goes: only its outcome is kept.
    app.registry_drains().await;
    app.eventually("the log is forgotten", |app| app.logs.is_empty())
        .await;

    for key in ["boss", "alice"] {
        let (status, again) = crate::helpers::one_chunk(send(key).await.unwrap()).await;
        assert_eq!(status, 409, "{key}: {again:?}");
        assert_eq!(again.metadata["error_type"], "already_decided");
        assert_eq!(again.metadata["decided_by"], "approver-1");
        assert_eq!(again.metadata["action"], "confirm");
    }
}
