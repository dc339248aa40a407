//! Who decides, set by `ask` rules as well as tools; when nobody answers:
//! an escalation that extends the expiry, the re-sent request that says
//! `escalated_to`, and timers that fire once across a restart.

use std::time::Duration;

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::approvers::{confirm, decide, error_type, inbox, paused, KEYS};
use crate::helpers::{EventStream, TestApp};
use crate::tools::{app_with_tools, Workdir};

/// Notes about prod need two leads (an `ask` rule); other notes one yes.
const GATED_NOTES: &str = r#"
[[rule]]
name = "prod notes"
tool = "note"
args = { "/step" = "note prod*" }
decision = "ask"
approvals = 2
approvers = "leads"
"#;

async fn app(dir: &Workdir, extra: &str) -> TestApp {
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    app_with_tools(dir, extra, move |s| s.server.api_keys_file = Some(keys)).await
}

#[tokio::test]
async fn an_ask_rule_names_the_group_and_the_approvals_for_the_calls_it_matches() {
    let dir = Workdir::new();
    let app = app(&dir, GATED_NOTES).await;

    // A note about dev: the tool's one yes, the requester's own.
    let (mut dev, id) = paused(&app, "agent-key-000001", "dev", "note dev one").await;
    let (status, chunk) = decide(&app, "agent-key-000001", "dev", &id, confirm()).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    assert_eq!(dev.finish().await.chunk_type, ChunkType::Completion);

    // A note about prod: two leads, the requester none of them.
    let (mut prod, id) = paused(&app, "agent-key-000001", "prod", "note prod one").await;
    let (status, chunk) = decide(&app, "agent-key-000001", "prod", &id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (403, "self_approval"));
    let (status, chunk) = decide(&app, "low-key-0000003", "prod", &id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (403, "forbidden_scope"));
    assert!(inbox(&app, "low-key-0000003").await.is_empty());
    let listed = inbox(&app, "lead-key-000001").await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0]["approvers"], json!(["leads"]));
    assert_eq!(listed[0]["required"], 2);

    // No grant covers what two people decide.
    let mut granting = confirm();
    granting["grant"] = json!({"scope": "session", "tools": ["note"], "ttl": "10m"});
    let (status, chunk) = decide(&app, "lead-key-000001", "prod", &id, granting).await;
    assert_eq!(
        (status, error_type(&chunk)),
        (422, "invalid_grant"),
        "{}",
        chunk.chunk
    );

    assert_eq!(listed[0]["may_approve"], true);
    let own = inbox(&app, "agent-key-000001").await;
    assert_eq!(own[0]["may_approve"], false);
    let why = own[0]["why_not"].as_str().unwrap();
    assert!(why.contains("the group leads"), "{why}");

    let (status, chunk) = decide(&app, "lead-key-000001", "prod", &id, confirm()).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ApprovalRecorded)
    );
    assert_eq!(chunk.metadata["required"], 2);
    assert_eq!(chunk.metadata["approvers"], json!(["leads"]));
    let listed = inbox(&app, "lead-key-000001").await;
    assert_eq!(listed[0]["approvals"], json!(["lead-1"]));
    assert_eq!(listed[0]["may_approve"], false);
    let why = listed[0]["why_not"].as_str().unwrap();
    assert!(why.starts_with("lead-1 approved it already"), "{why}");
    assert_eq!(inbox(&app, "lead-key-000002").await[0]["may_approve"], true);
    let (status, chunk) = decide(&app, "lead-key-000002", "prod", &id, confirm()).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    assert_eq!(chunk.metadata["approved_by"], json!(["lead-1", "lead-2"]));
    assert_eq!(prod.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note dev one", "note prod one"]);
}

#[test]
fn a_rule_that_names_who_decides_must_ask() {
    let dir = Workdir::new();
    let tools = dir.tools(
        r#"
[[rule]]
name = "prod"
tool = "note"
decision = "allow"
approvals = 2
"#,
    );
    let err = chatgate::tools::Tools::load(&tools)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rule \"prod\""), "{err}");
    assert!(err.contains("only an `ask` rule"), "{err}");
}

/// `restart` waits 4s for its group, `oncall`; after 1s the leads may
/// decide too, and the pause lives a minute longer.
const EXTENDING: &str = r#"
[[tool]]
name = "restart"
description = "Restart a service"
risk = "low"
approvers = "oncall"
timeout = "4s"
escalate_after = "1s"
escalate_to = "leads"
escalate_extends = "1m"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

#[tokio::test]
async fn an_escalation_extends_the_expiry_and_a_re_attach_is_told_where_it_went() {
    let dir = Workdir::new();
    let app = app(&dir, EXTENDING).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "ext", "restart api").await;
    let escalated = stream.until(ChunkType::Status).await;
    assert!(
        escalated.chunk.starts_with("Escalated to leads"),
        "{}",
        escalated.chunk
    );
    let expires_at = escalated.metadata["expires_at"].as_str().unwrap();
    let expires_at = humantime::parse_rfc3339(expires_at).unwrap();
    let left = expires_at
        .duration_since(std::time::SystemTime::now())
        .unwrap();
    assert!(
        left > Duration::from_secs(30),
        "extended by a minute: {left:?}"
    );

    // Past the 4s it was asked with: still pending.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let listed = inbox(&app, "lead-key-000001").await;
    assert_eq!(listed.len(), 1, "still pending after its first expiry");
    assert_eq!(listed[0]["escalated_to"], "leads");

    // A re-attach is sent the request as it stands: escalated.
    let again = app
        .client
        .post(app.url())
        .bearer_auth("agent-key-000001")
        .header("Last-Event-ID", "0")
        .json(&json!({"session_id": "ext"}))
        .send()
        .await
        .unwrap();
    let mut again = EventStream::new(again);
    let request = again.until(ChunkType::ConfirmationRequest).await;
    assert_eq!(request.metadata["escalated_to"], "leads");

    let (status, chunk) = decide(&app, "lead-key-000001", "ext", &id, confirm()).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    assert_eq!(again.finish().await.chunk_type, ChunkType::Completion);
}

/// `restart` reminds after 1s and escalates to the leads after 4s.
pub(crate) const TIMED: &str = r#"
[[tool]]
name = "restart"
description = "Restart a service"
risk = "low"
approvers = "oncall"
remind_after = "1s"
escalate_after = "4s"
escalate_to = "leads"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

/// The distinct events (by id: a delivery may be repeated, at least
/// once) `seen` of type `event`.
pub(crate) fn count(seen: &[crate::webhooks::Delivery], event: &str) -> usize {
    let ids: std::collections::HashSet<&str> = seen
        .iter()
        .filter(|d| d.event == event)
        .map(|d| d.body["id"].as_str().unwrap_or(""))
        .collect();
    ids.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_fire_once_across_a_restart_and_what_came_due_meanwhile_fires_on_restore() {
    let receiver = crate::webhooks::Receiver::start().await;
    let dir = crate::durable::Dir::new();
    std::fs::write(dir.path("keys.txt"), KEYS).unwrap();
    std::fs::write(dir.path("tools.toml"), TIMED).unwrap();
    let keys = dir.path("keys.txt").display().to_string();
    let tools = dir.path("tools.toml").display().to_string();
    let args = [
        "--api-keys-file",
        keys.as_str(),
        "--tools",
        tools.as_str(),
        "--webhook",
        receiver.url.as_str(),
        "--webhook-secret",
        crate::webhooks::SECRET,
        "--public-url",
        "https://gate.example",
    ];
    let client = reqwest::Client::new();
    let post_to = |url: String, key: &'static str, body: Value| {
        client.post(url).bearer_auth(key).json(&body).send()
    };
    let mut server = crate::durable::start(&dir, &args);
    let url = crate::durable::stream_url(&server);
    let started = post_to(
        url.clone(),
        "agent-key-000001",
        json!({"message": "restart api", "session_id": "tr"}),
    )
    .await
    .unwrap();
    let asked = std::time::Instant::now();
    let raw = crate::durable::read_raw(started, Some("\"stream_paused\":true")).await;
    let request = crate::durable::chunks(&raw)
        .into_iter()
        .find(|c| c.chunk_type == ChunkType::ConfirmationRequest)
        .unwrap();
    let id = request.approval().unwrap().confirmation_id.clone();

    // The reminder fires; then the process stops before the escalation.
    let seen = receiver.wait_for(2).await;
    assert_eq!(count(&seen, "interaction.reminder"), 1);
    crate::durable::terminate(&mut server);
    // (On a slow machine the escalation may have fired before the stop:
    // what follows holds either way, each timer exactly once.)

    // Down past the escalation's time: the next process fires it at once.
    let due = Duration::from_millis(4_500).saturating_sub(asked.elapsed());
    tokio::time::sleep(due).await;
    let server = crate::durable::start(&dir, &args);
    let url = crate::durable::stream_url(&server);
    // Deliveries are at least once: one cut by the stop may come again,
    // so wait for the escalation itself, not for a number of deliveries.
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    let seen = loop {
        let seen = receiver.wait_for(3).await;
        if count(&seen, "interaction.escalated") > 0 || tokio::time::Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let types: Vec<&str> = seen.iter().map(|d| d.event.as_str()).collect();
    assert_eq!(count(&seen, "interaction.escalated"), 1, "{types:?}");
    let body =
        json!({"message": "CONFIRM_ACTION:confirm", "session_id": "tr", "confirmation_id": id});
    let decided = post_to(url.clone(), "lead-key-000001", body).await.unwrap();
    let (status, chunk) = crate::helpers::one_chunk(decided).await;
    assert_eq!(
        status, 200,
        "the leads decide after the escalation: {}",
        chunk.chunk
    );
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    while count(&receiver.wait_for(4).await, "interaction.decided") == 0
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A moment for anything more to arrive (nothing should).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let seen = receiver.seen();
    let types: Vec<&str> = seen.iter().map(|d| d.event.as_str()).collect();
    assert_eq!(count(&seen, "interaction.decided"), 1, "{types:?}");
    assert_eq!(
        count(&seen, "interaction.reminder"),
        1,
        "the reminder fired once"
    );
    assert_eq!(
        count(&seen, "interaction.escalated"),
        1,
        "the escalation fired once"
    );
}

/// `restart` and `purge` are oncall's; only `restart` escalates to the
/// leads, after a second.
const ONE_ESCALATES: &str = r#"
[[tool]]
name = "restart"
description = "Restart a service"
risk = "low"
approvers = "oncall"
escalate_after = "1s"
escalate_to = "leads"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }

[[tool]]
name = "purge"
description = "Purge a cache"
risk = "low"
approvers = "oncall"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

#[tokio::test]
async fn an_escalation_is_per_task_it_names_its_tasks_and_admits_its_group_to_those_alone() {
    let dir = Workdir::new();
    let app = app(&dir, ONE_ESCALATES).await;
    let (mut stream, id) =
        paused(&app, "agent-key-000001", "per", "restart api; purge cache").await;
    let escalated = stream.until(ChunkType::Status).await;
    assert!(
        escalated.chunk.starts_with("Escalated to leads"),
        "{}",
        escalated.chunk
    );
    assert_eq!(escalated.metadata["tasks"], json!([1]));

    // lead-1 is in leads, not oncall: the restart is its to decide now,
    // the purge is not, nor the whole plan.
    let lead = "lead-key-000001";
    let listed = inbox(&app, lead).await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["escalated_tasks"], json!([1]));
    assert_eq!(listed[0]["may_decide_tasks"], json!([1]));
    let (status, chunk) = decide(&app, lead, "per", &id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (403, "forbidden_scope"));
    let purge = json!({"message": "CONFIRM_ACTION:decide",
                       "decisions": [{"index": 2, "decision": "approve"}]});
    let (status, chunk) = decide(&app, lead, "per", &id, purge.clone()).await;
    assert_eq!((status, error_type(&chunk)), (403, "forbidden_scope"));
    let restart = json!({"message": "CONFIRM_ACTION:decide",
                         "decisions": [{"index": 1, "decision": "approve"}]});
    let (status, chunk) = decide(&app, lead, "per", &id, restart).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::DecisionRecorded)
    );

    // oncall (lead-2) decides the purge.
    let (status, chunk) = decide(&app, "lead-key-000002", "per", &id, purge).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived)
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

/// `alpha` reminds and escalates to the leads after 1s; `beta` reminds
/// and escalates to oncall after 2s.
const OWN_TIMES: &str = r#"
[[tool]]
name = "alpha"
description = "First"
risk = "low"
approvers = "oncall"
remind_after = "1s"
escalate_after = "1s"
escalate_to = "leads"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }

[[tool]]
name = "beta"
description = "Second"
risk = "low"
approvers = "leads"
remind_after = "2s"
escalate_after = "2s"
escalate_to = "oncall"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_task_s_reminder_and_escalation_fire_at_its_own_time_naming_it() {
    let receiver = crate::webhooks::Receiver::start().await;
    let dir = Workdir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    let hook = crate::webhooks::hooked(&receiver);
    let app = app_with_tools(&dir, OWN_TIMES, move |s| {
        hook(s);
        s.server.api_keys_file = Some(keys);
    })
    .await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "own", "alpha x; beta y").await;

    // requested, then two reminders and two escalations.
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    let seen = loop {
        let seen = receiver.wait_for(5).await;
        let fired = count(&seen, "interaction.reminder") + count(&seen, "interaction.escalated");
        if fired >= 4 || tokio::time::Instant::now() > deadline {
            break seen;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let of = |event: &str| -> Vec<Value> {
        let mut bodies: Vec<Value> = seen
            .iter()
            .filter(|d| d.event == event)
            .map(|d| d.body["data"].clone())
            .collect();
        bodies.dedup();
        bodies
    };
    let reminders: Vec<Value> = of("interaction.reminder")
        .iter()
        .map(|d| d["tasks"].clone())
        .collect();
    assert_eq!(reminders, [json!([1]), json!([2])], "{seen:?}");
    let escalations: Vec<(Value, Value)> = of("interaction.escalated")
        .iter()
        .map(|d| (d["escalated_to"].clone(), d["tasks"].clone()))
        .collect();
    assert_eq!(
        escalations,
        [(json!("leads"), json!([1])), (json!("oncall"), json!([2]))]
    );

    // Each group is admitted to its own task: the leads to alpha (and
    // beta, theirs anyway), lead-2 (oncall too) to both.
    let listed = inbox(&app, "lead-key-000001").await;
    assert_eq!(listed[0]["may_decide_tasks"], json!([1, 2]));
    assert_eq!(listed[0]["escalated_tasks"], json!([1, 2]));
    let (status, chunk) = decide(&app, "lead-key-000001", "own", &id, confirm()).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived),
        "{}",
        chunk.chunk
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}
