//! The right people decide, over real sockets: keys-file attributes
//! (labels, groups, `max_risk`, `namespaces`), scoped listing and 403s, a
//! tool's group, four-eyes quorums, no self-approval.

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::helpers::{one_chunk, EventStream, TestApp};
use crate::tools::{app_with_tools, Workdir};

/// Tools: `note` (low, one yes), `deploy` (high, two approvals), `page`
/// (decided by the group `oncall`).
const TOOLS: &str = r#"
[[tool]]
name = "deploy"
description = "Deploy to production"
risk = "high"
approvals = 2
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }

[[tool]]
name = "page"
description = "Page someone"
risk = "low"
approvers = "oncall"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

pub(crate) const KEYS: &str = "\
agent-key-000001 label=ci-bot
other-key-000002 label=web-app
approver lead-key-000001 label=lead-1 groups=leads
approver lead-key-000002 label=lead-2 groups=leads,oncall
approver low-key-0000003 label=junior max_risk=low
approver ci-only-key-0004 label=ci-watch namespaces=ci-bot
";

async fn app(dir: &Workdir) -> TestApp {
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    app_with_tools(dir, TOOLS, move |s| s.server.api_keys_file = Some(keys)).await
}

/// POSTs `body` with the bearer `key`.
pub(crate) async fn post(app: &TestApp, key: &str, body: Value) -> reqwest::Response {
    app.client
        .post(app.url())
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// A reply from `key`: its status, chunk type, error type (if any), chunk.
pub(crate) async fn decide(
    app: &TestApp,
    key: &str,
    session: &str,
    confirmation_id: &str,
    body: Value,
) -> (u16, chatgate::protocol::Chunk) {
    let mut body = body;
    body["session_id"] = json!(session);
    body["confirmation_id"] = json!(confirmation_id);
    let (status, chunk) = one_chunk(post(app, key, body).await).await;
    (status.as_u16(), chunk)
}

pub(crate) fn confirm() -> Value {
    json!({"message": "CONFIRM_ACTION:confirm"})
}

pub(crate) fn error_type(chunk: &chatgate::protocol::Chunk) -> &str {
    chunk.metadata["error_type"].as_str().unwrap_or("")
}

/// The agent pauses on `message`; its stream and the pause's id.
pub(crate) async fn paused(
    app: &TestApp,
    key: &str,
    session: &str,
    message: &str,
) -> (EventStream, String) {
    let mut stream =
        EventStream::new(post(app, key, json!({"message": message, "session_id": session})).await);
    let request = stream.until(ChunkType::ConfirmationRequest).await;
    let id = request.approval().unwrap().confirmation_id.clone();
    (stream, id)
}

pub(crate) async fn inbox(app: &TestApp, key: &str) -> Vec<Value> {
    let response = app
        .client
        .get(format!("{}/api/v1/interactions", app.address))
        .bearer_auth(key)
        .send()
        .await
        .unwrap();
    let body: Value = response.json().await.unwrap();
    body["interactions"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_quorum_of_two_needs_two_distinct_labels_and_the_requester_is_not_one() {
    let dir = Workdir::new();
    let app = app(&dir).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "q", "deploy web").await;

    let (status, chunk) = decide(&app, "agent-key-000001", "q", &id, confirm()).await;
    assert_eq!(
        (status, error_type(&chunk)),
        (403, "self_approval"),
        "{}",
        chunk.chunk
    );

    let (status, chunk) = decide(&app, "lead-key-000001", "q", &id, confirm()).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    assert_eq!(chunk.chunk_type, ChunkType::ApprovalRecorded);
    assert_eq!(chunk.metadata["approvals"], json!(["lead-1"]));
    assert_eq!(chunk.metadata["required"], 2);
    let progress = stream.until(ChunkType::Status).await;
    assert_eq!(progress.chunk, "1 of 2 approvals (lead-1)");
    let listed = inbox(&app, "lead-key-000002").await;
    assert_eq!(listed[0]["approvals"], json!(["lead-1"]));
    assert_eq!(listed[0]["required"], 2);

    let (status, chunk) = decide(&app, "lead-key-000001", "q", &id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (409, "already_approved"));
    let edit = json!({"message": "CONFIRM_ACTION:confirm",
        "decisions": [{"index": 1, "decision": "edit", "args": {"step": "deploy other"}}]});
    let (status, chunk) = decide(&app, "lead-key-000002", "q", &id, edit).await;
    assert_eq!((status, error_type(&chunk)), (422, "edit_needs_new_round"));

    let (status, chunk) = decide(&app, "lead-key-000002", "q", &id, confirm()).await;
    assert_eq!(status, 200);
    assert_eq!(chunk.chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(chunk.metadata["approved_by"], json!(["lead-1", "lead-2"]));
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let approved: Vec<Value> = dir
        .audit()
        .into_iter()
        .filter(|r| r["event"] == "approved")
        .collect();
    assert_eq!(approved.len(), 1);
    assert_eq!(approved[0]["key"], "lead-1");
}

#[tokio::test]
async fn a_cancel_during_a_partial_quorum_ends_the_pause_and_a_modify_starts_from_zero() {
    let dir = Workdir::new();
    let app = app(&dir).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "c", "deploy api").await;
    decide(&app, "lead-key-000001", "c", &id, confirm()).await;
    let modify = json!({"message": "CONFIRM_ACTION:modify:canary first"});
    let (status, _) = decide(&app, "lead-key-000002", "c", &id, modify).await;
    assert_eq!(status, 200);
    let request = stream.until(ChunkType::ConfirmationRequest).await;
    let second = request.approval().unwrap().confirmation_id.clone();
    let (status, chunk) = decide(&app, "lead-key-000001", "c", &second, confirm()).await;
    assert_eq!(status, 200, "the new round counts lead-1 again");
    assert_eq!(chunk.metadata["approvals"], json!(["lead-1"]));
    let cancel = json!({"message": "CONFIRM_ACTION:cancel"});
    let (status, _) = decide(&app, "agent-key-000001", "c", &second, cancel).await;
    assert_eq!(status, 200, "the requester may always cancel its run");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Cancelled);
}

#[tokio::test]
async fn scopes_hide_and_refuse_what_a_key_may_not_decide() {
    let dir = Workdir::new();
    let app = app(&dir).await;
    let (_web, web_id) = paused(&app, "other-key-000002", "w", "deploy site").await;
    let (_ci, ci_id) = paused(&app, "agent-key-000001", "n", "write notes").await;

    // ci-watch sees only ci-bot's namespace.
    let watched: Vec<String> = inbox(&app, "ci-only-key-0004")
        .await
        .iter()
        .map(|i| i["confirmation_id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(watched, std::slice::from_ref(&ci_id));
    let (status, chunk) = decide(&app, "ci-only-key-0004", "w", &web_id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (403, "forbidden_scope"));
    let reattach = app
        .client
        .post(app.url())
        .bearer_auth("ci-only-key-0004")
        .header("Last-Event-ID", "0")
        .json(&json!({"session_id": "w", "confirmation_id": web_id}))
        .send()
        .await
        .unwrap();
    assert_eq!(reattach.status(), 403);

    // junior decides up to low risk: the high-risk deploy is hidden and refused.
    let juniors: Vec<Value> = inbox(&app, "low-key-0000003").await;
    assert!(juniors
        .iter()
        .all(|i| i["confirmation_id"] != web_id.as_str()));
    let (status, chunk) = decide(&app, "low-key-0000003", "w", &web_id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (403, "forbidden_scope"));
    assert!(chunk.chunk.contains("junior"), "{}", chunk.chunk);
    let (status, _) = decide(&app, "low-key-0000003", "n", &ci_id, confirm()).await;
    assert_eq!(status, 200, "a low risk plan is junior's to decide");
}

#[tokio::test]
async fn a_group_s_tool_is_decided_by_its_members_only() {
    let dir = Workdir::new();
    let app = app(&dir).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "g", "page the oncall").await;

    let (status, chunk) = decide(&app, "agent-key-000001", "g", &id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (403, "self_approval"));
    let (status, chunk) = decide(&app, "lead-key-000001", "g", &id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (403, "forbidden_scope"));
    assert!(chunk.chunk.contains("oncall"), "{}", chunk.chunk);
    assert!(inbox(&app, "lead-key-000001")
        .await
        .iter()
        .all(|i| i["confirmation_id"] != id.as_str()));
    let (status, _) = decide(&app, "lead-key-000002", "g", &id, confirm()).await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let decided = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "decided")
        .unwrap();
    assert_eq!(decided["key"], "lead-2", "records name the label");
}

#[test]
fn a_bad_keys_file_line_or_an_allow_rule_for_a_quorum_tool_stops_the_start() {
    let dir = Workdir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, "k-1 label=a\napprover k-2 label=a\n").unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
        .args(["--bind", "127.0.0.1:0", "--api-keys-file"])
        .arg(&keys)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(&keys.display().to_string()), "{stderr}");
    assert!(stderr.contains("line 2"), "{stderr}");

    let tools = dir.tools(&format!(
        "{TOOLS}\n[[rule]]\nname = \"ship it\"\ntool = \"dep*\"\ndecision = \"allow\"\n"
    ));
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
        .args(["--bind", "127.0.0.1:0", "--tools"])
        .arg(&tools)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("rule \"ship it\""), "{stderr}");
    assert!(stderr.contains("deploy"), "{stderr}");
}

#[tokio::test]
async fn a_tool_s_timeout_shortens_the_pause_and_on_timeout_reject_lets_the_run_go_on() {
    let dir = Workdir::new();
    let extra = r#"
[[tool]]
name = "nudge"
description = "A nudge nobody has to answer"
risk = "low"
timeout = "1s"
on_timeout = "reject"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }

[[tool]]
name = "ping"
description = "A ping that waits one second"
risk = "low"
timeout = "1s"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;
    let app = app_with_tools(&dir, extra, |_| {}).await;

    let (mut rejected, request) = app.open_paused("silent", "nudge them").await;
    assert_eq!(request.approval().unwrap().timeout_seconds, 1);
    let last = rejected.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion, "{}", last.chunk);
    assert_eq!(last.metadata["tasks_rejected"], 1);
    let output = crate::tools::outputs(&rejected)[0].clone();
    assert!(
        output.metadata["error"]
            .as_str()
            .unwrap()
            .contains("no answer in time"),
        "{:?}",
        output.metadata
    );

    let (mut cancelled, _) = app.open_paused("timed", "ping them").await;
    let last = cancelled.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(last.metadata["reason"], "timeout");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unanswered_pause_reminds_once_then_escalates_to_its_group() {
    let receiver = crate::webhooks::Receiver::start().await;
    let dir = Workdir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    let extra = r#"
[[tool]]
name = "restart"
description = "Restart a service"
risk = "low"
approvers = "oncall"
remind_after = "1s"
escalate_after = "2s"
escalate_to = "leads"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;
    let hook = crate::webhooks::hooked(&receiver);
    let app = app_with_tools(&dir, extra, move |s| {
        hook(s);
        s.server.api_keys_file = Some(keys);
    })
    .await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "esc", "restart api").await;
    // lead-1 is in leads, not oncall: it waits for the escalation.
    let (status, chunk) = decide(&app, "lead-key-000001", "esc", &id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (403, "forbidden_scope"));
    // The refusal says when it escalates to lead-1's group.
    assert!(
        chunk.chunk.contains("it escalates to leads at "),
        "{}",
        chunk.chunk
    );
    assert!(inbox(&app, "lead-key-000001").await.is_empty());

    let escalated = stream.until(ChunkType::Status).await;
    assert!(
        escalated.chunk.starts_with("Escalated to leads"),
        "{}",
        escalated.chunk
    );
    let seen = receiver.wait_for(3).await;
    let types: Vec<&str> = seen.iter().map(|d| d.event.as_str()).collect();
    assert_eq!(
        types,
        [
            "interaction.requested",
            "interaction.reminder",
            "interaction.escalated"
        ]
    );
    assert_eq!(seen[2].body["data"]["escalated_to"], "leads");
    // The requester as the keys file labels it.
    assert!(seen.iter().all(|d| d.body["key"] == "ci-bot"), "{seen:?}");
    let listed = inbox(&app, "lead-key-000001").await;
    assert_eq!(listed[0]["escalated_to"], "leads");
    let (status, _) = decide(&app, "lead-key-000001", "esc", &id, confirm()).await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    // Each timer fired once.
    let all = receiver.wait_for(5).await;
    let reminders = all
        .iter()
        .filter(|d| d.event == "interaction.reminder")
        .count();
    assert_eq!(reminders, 1);
}

#[tokio::test]
async fn a_partial_quorum_survives_a_restart_with_sqlite() {
    let dir = crate::durable::Dir::new();
    std::fs::write(dir.path("keys.txt"), KEYS).unwrap();
    std::fs::write(dir.path("tools.toml"), TOOLS).unwrap();
    let keys = dir.path("keys.txt").display().to_string();
    let tools = dir.path("tools.toml").display().to_string();
    let args = ["--api-keys-file", keys.as_str(), "--tools", tools.as_str()];
    let client = reqwest::Client::new();
    let post = |url: String, key: &'static str, body: Value| {
        client.post(url).bearer_auth(key).json(&body).send()
    };
    let mut server = crate::durable::start(&dir, &args);
    let url = crate::durable::stream_url(&server);
    let started = post(
        url.clone(),
        "agent-key-000001",
        json!({"message": "deploy web", "session_id": "dq"}),
    )
    .await
    .unwrap();
    let raw = crate::durable::read_raw(started, Some("\"stream_paused\":true")).await;
    let request = crate::durable::chunks(&raw)
        .into_iter()
        .find(|c| c.chunk_type == ChunkType::ConfirmationRequest)
        .unwrap();
    let id = request.approval().unwrap().confirmation_id.clone();
    let body =
        json!({"message": "CONFIRM_ACTION:confirm", "session_id": "dq", "confirmation_id": id});
    let first = post(url.clone(), "lead-key-000001", body.clone())
        .await
        .unwrap();
    let (status, chunk) = one_chunk(first).await;
    assert_eq!(status, 200);
    assert_eq!(chunk.chunk_type, ChunkType::ApprovalRecorded);
    crate::durable::terminate(&mut server);

    let server = crate::durable::start(&dir, &args);
    let url = crate::durable::stream_url(&server);
    let again = post(url.clone(), "lead-key-000001", body.clone())
        .await
        .unwrap();
    let (status, chunk) = one_chunk(again).await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (409, "already_approved"),
        "lead-1's approval was kept: {}",
        chunk.chunk
    );
    let second = post(url.clone(), "lead-key-000002", body).await.unwrap();
    let (status, chunk) = one_chunk(second).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    assert_eq!(chunk.chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(chunk.metadata["approved_by"], json!(["lead-1", "lead-2"]));
}

#[tokio::test]
async fn a_quorum_of_three_counts_three_distinct_labels() {
    let dir = Workdir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    let extra = r#"
[[tool]]
name = "migrate"
description = "Migrate the database"
risk = "high"
approvals = 3
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;
    let app = app_with_tools(&dir, extra, move |s| s.server.api_keys_file = Some(keys)).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "m3", "migrate db").await;
    for (n, key) in ["lead-key-000001", "lead-key-000002"].iter().enumerate() {
        let (status, chunk) = decide(&app, key, "m3", &id, confirm()).await;
        assert_eq!(status, 200);
        assert_eq!(chunk.chunk_type, ChunkType::ApprovalRecorded);
        assert_eq!(chunk.metadata["approvals"].as_array().unwrap().len(), n + 1);
        assert_eq!(chunk.metadata["required"], 3);
    }
    let (status, chunk) = decide(&app, "lead-key-000002", "m3", &id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (409, "already_approved"));
    let (status, chunk) = decide(&app, "ci-only-key-0004", "m3", &id, confirm()).await;
    assert_eq!(status, 200);
    assert_eq!(
        chunk.metadata["approved_by"],
        json!(["lead-1", "lead-2", "ci-watch"])
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}
