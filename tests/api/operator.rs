//! What an operator hit setting up approvals (#41), over real sockets: a
//! timeout's reject is its own outcome everywhere, an escalation's mail
//! and a run's record say who.

use chatgate::protocol::ChunkType;
use serde_json::json;

use crate::tools::{app_with_tools, outputs, Workdir};
use crate::webhooks::{hooked, Receiver};

/// `nudge` waits two seconds; nobody answering rejects it.
const NUDGE: &str = r#"
[[tool]]
name = "nudge"
description = "A nudge nobody has to answer"
risk = "low"
timeout = "2s"
on_timeout = "reject"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_s_reject_is_its_own_outcome_on_the_stream_the_metrics_the_audit_and_the_webhook()
{
    let receiver = Receiver::start().await;
    let dir = Workdir::new();
    let hook = hooked(&receiver);
    let app = app_with_tools(&dir, NUDGE, hook).await;

    let (mut stream, request) = app.open_paused("silent", "nudge them").await;
    assert_eq!(request.approval().unwrap().timeout_seconds, 2);
    let received = stream.until(ChunkType::ConfirmationReceived).await;
    assert_eq!(
        received.metadata["action"], "timeout_reject",
        "{received:?}"
    );
    assert!(
        received.chunk.starts_with("No answer in time"),
        "{}",
        received.chunk
    );
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion, "{}", last.chunk);
    assert_eq!(last.metadata["tasks_rejected"], 1);
    assert!(outputs(&stream).iter().all(|o| o.metadata["ok"] == false));

    let (_, metrics) = app.get("/metrics").await;
    let line = |needle: &str| {
        metrics
            .lines()
            .find(|l| l.contains(needle) && !l.starts_with('#'))
            .map(str::to_owned)
    };
    let pauses = line("chatgate_pauses_total{").unwrap_or_default();
    assert!(
        pauses.contains("outcome=\"timeout_reject\"") && pauses.ends_with(" 1"),
        "{metrics}"
    );
    assert!(
        line("outcome=\"confirm\"").is_none(),
        "nobody confirmed: {metrics}"
    );

    let audited = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "timeout_rejected")
        .expect("a timeout_rejected record");
    assert_eq!(audited["decisions"][0]["decision"], "reject", "{audited}");
    assert_eq!(audited["timeout_seconds"], 2);
    assert!(dir.audit().iter().all(|r| r["event"] != "decided"));

    let seen = receiver.wait_for(2).await;
    let expired = seen
        .iter()
        .find(|d| d.event == "interaction.expired")
        .expect("interaction.expired");
    assert_eq!(
        expired.body["data"],
        json!({"action": "timeout_reject", "reason": "timeout", "timeout_seconds": 2,
               "decisions": [{"index": 1, "decision": "reject", "reason": "no answer in time"}]})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_that_expired_while_nobody_held_it_still_rejects_as_its_tools_say() {
    use crate::durable::{chunks, open_paused, post, read_raw, start, stream_url, terminate};
    let work = Workdir::new();
    let tools = work.tools(NUDGE).display().to_string();
    let dir = crate::durable::Dir::new();
    let mut first = start(&dir, &["--tools", &tools]);
    let reading = open_paused(
        &stream_url(&first),
        json!({"message": "nudge them", "session_id": "gone"}),
    )
    .await;
    terminate(&mut first);
    let seen = chunks(&reading.finish().await);
    // Down past the pause's two seconds: nobody holds it when it expires.
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;

    let second = start(&dir, &["--tools", &tools]);
    let last_seen = seen.last().unwrap().sequence;
    let back = post(
        &stream_url(&second),
        json!({"session_id": "gone"}),
        Some(last_seen),
    )
    .await;
    let after = chunks(&read_raw(back, None).await);
    let received = after
        .iter()
        .find(|c| c.chunk_type == ChunkType::ConfirmationReceived)
        .expect("the timeout's decision on the stream");
    assert_eq!(received.metadata["action"], "timeout_reject");
    let last = after.last().unwrap();
    assert_eq!(
        last.chunk_type,
        ChunkType::Completion,
        "the run went on, its task rejected: {}",
        last.chunk
    );
    assert_eq!(last.metadata["tasks_rejected"], 1);
}

#[tokio::test]
async fn the_tools_say_who_approves_and_the_rules_in_force_are_listed() {
    let dir = Workdir::new();
    let extra = format!(
        "{NUDGE}
[[tool]]
name = \"deploy\"
description = \"Deploy\"
risk = \"high\"
approvals = 2
approvers = \"leads\"
escalate_after = \"10m\"
escalate_to = \"oncall\"
command = [\"true\"]
parameters = {{ type = \"object\" }}

[[rule]]
name = \"no prod notes\"
tool = \"note\"
args = {{ \"/step\" = {{ regex = \"note prod.*\" }} }}
decision = \"deny\"
reason = \"prod is frozen\"

[[rule]]
name = \"watch\"
tool = \"*\"
decision = \"deny\"
mode = \"shadow\"
"
    );
    let app = app_with_tools(&dir, &extra, |_| {}).await;
    let (status, body) = app.get("/api/v1/tools").await;
    assert_eq!(status, 200, "{body}");
    let tools: serde_json::Value = serde_json::from_str(&body).unwrap();
    let tool = |name: &str| {
        tools["tools"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["name"] == name)
            .unwrap()
            .clone()
    };
    let deploy = tool("deploy");
    assert_eq!(deploy["approvals"], 2);
    assert_eq!(deploy["approvers"], json!(["leads"]));
    assert_eq!(deploy["requester_may_approve"], false);
    assert_eq!(deploy["grantable"], false);
    assert_eq!(deploy["on_timeout"], "cancel");
    assert_eq!(deploy["escalate_to"], "oncall");
    assert_eq!(deploy["escalate_after_seconds"], 600);
    let nudge = tool("nudge");
    assert_eq!(nudge["timeout_seconds"], 2);
    assert_eq!(nudge["on_timeout"], "reject");
    assert_eq!(tool("note")["grantable"], true);

    let (status, body) = app.get("/api/v1/rules").await;
    assert_eq!(status, 200, "{body}");
    let rules: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        rules["rules"][0],
        json!({"name": "no prod notes", "tool": "note", "args": {"/step": {"regex": "note prod.*"}},
               "decision": "deny", "mode": "enforce", "reason": "prod is frozen", "keys": null})
    );
    assert_eq!(rules["rules"][1]["mode"], "shadow");

    let (status, body) = app.get("/api/v1/runs/never-started").await;
    assert_eq!(status, 404, "{body}");
    let refused: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(refused["error_type"], "no_such_run");
    let text = refused["message"].as_str().unwrap();
    assert!(text.contains("no ended run"), "{text}");
    assert!(!text.contains("re-attach to on"), "its own text: {text}");
}

#[tokio::test]
async fn a_step_s_first_word_names_its_tool_in_any_letter_case() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (mut stream, request) = app
        .open_paused("cased", "Note one; NOTE {\"step\": \"two\"}")
        .await;
    let tasks = &request.approval().unwrap().tasks;
    assert_eq!(tasks[0].tool, "note");
    assert_eq!(tasks[1].tool, "note");
    assert!(!tasks[0].simulated && !tasks[1].simulated, "{tasks:?}");
    app.reply("cased", "CONFIRM_ACTION:confirm").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["Note one", "two"]);
}

#[tokio::test]
async fn every_policy_record_says_what_the_rule_set_would_decide_were_it_all_enforced() {
    let dir = Workdir::new();
    let rules = r#"
[[rule]]
name = "trial deny"
tool = "note"
args = { "/step" = "note x*" }
decision = "deny"
mode = "shadow"

[[rule]]
name = "x notes"
tool = "note"
args = { "/step" = "note x*" }
decision = "allow"
"#;
    let app = app_with_tools(&dir, rules, |_| {}).await;
    let mut stream = app.open("shadowed", "note xyz").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note xyz"], "allowed by the enforcing rule");
    let policy: Vec<serde_json::Value> = dir
        .audit()
        .into_iter()
        .filter(|r| r["event"] == "policy")
        .collect();
    assert_eq!(policy.len(), 2, "{policy:?}");
    for record in &policy {
        assert_eq!(record["actual"], "allow");
        assert_eq!(
            record["if_enforced"],
            json!({"rule": "trial deny", "decision": "deny"}),
            "{record}"
        );
    }
}
