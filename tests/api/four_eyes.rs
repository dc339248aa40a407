//! Four eyes means four eyes (#40), over real sockets: a reject of another
//! task, a `respond`, an edit, an escalation, a rule and a restored plan
//! never let a call run on fewer or other people than it needs.

use std::path::Path;

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::approvers::{confirm, decide, error_type, paused, post, KEYS};
use crate::helpers::TestApp;
use crate::tools::{app_with_tools, Workdir};

/// `deploy` (high risk, two approvals) writes its step to the notes, as
/// `note` (one yes) does: what ran is what the notes hold.
pub(crate) fn deploy(dir: &Workdir, keys: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/tools/write_note.py");
    std::fs::write(dir.path("keys.txt"), keys).unwrap();
    format!(
        r#"
[[tool]]
name = "deploy"
description = "Deploy (writes a note)"
risk = "high"
approvals = 2
command = ["python3", "{script}", "{notes}"]
parameters = {{ type = "object", properties = {{ step = {{ type = "string" }} }} }}
"#,
        script = script.display(),
        notes = dir.path("notes").display(),
    )
}

pub(crate) async fn app(dir: &Workdir, extra: &str) -> TestApp {
    let keys = dir.path("keys.txt");
    if !keys.exists() {
        std::fs::write(&keys, KEYS).unwrap();
    }
    app_with_tools(dir, extra, move |s| s.server.api_keys_file = Some(keys)).await
}

fn with_decisions(decisions: Value) -> Value {
    json!({"message": "CONFIRM_ACTION:confirm", "decisions": decisions})
}

#[tokio::test]
async fn a_reject_of_another_task_is_one_approval_and_the_reject_is_carried() {
    let dir = Workdir::new();
    let app = app(&dir, &deploy(&dir, KEYS)).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "r1", "deploy web; note thing").await;

    let reject_note = with_decisions(json!([{"index": 2, "decision": "reject", "reason": "no"}]));
    let (status, chunk) = decide(&app, "lead-key-000001", "r1", &id, reject_note).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    assert_eq!(
        chunk.chunk_type,
        ChunkType::ApprovalRecorded,
        "one approval of two: {}",
        chunk.chunk
    );
    assert!(dir.notes().is_empty(), "nothing ran on one approval");

    let (status, chunk) = decide(&app, "lead-key-000002", "r1", &id, confirm()).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    assert_eq!(chunk.chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(chunk.metadata["approved_by"], json!(["lead-1", "lead-2"]));
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion, "{}", last.chunk);
    assert_eq!(last.metadata["tasks_rejected"], 1);
    assert_eq!(
        dir.notes(),
        ["deploy web"],
        "the deploy ran on two approvals; lead-1's reject of the note stood"
    );
    let decided = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "decided")
        .unwrap();
    assert_eq!(decided["key"], "lead-2");
    assert_eq!(decided["approved_by"], json!(["lead-1", "lead-2"]));
    assert_eq!(decided["decisions"][1]["decision"], "reject", "{decided}");

    // The run's record names both approvers too (#41 item 8).
    let outcome: Value = app
        .client
        .get(format!(
            "{}/api/v1/runs/r1?confirmation_id={id}",
            app.address
        ))
        .bearer_auth("lead-key-000001")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(outcome["pauses"][0]["decided_by"], "lead-2", "{outcome}");
    assert_eq!(
        outcome["pauses"][0]["approved_by"],
        json!(["lead-1", "lead-2"])
    );
}

#[tokio::test]
async fn a_reject_of_the_quorum_task_decides_what_one_yes_suffices_for() {
    let dir = Workdir::new();
    let app = app(&dir, &deploy(&dir, KEYS)).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "r2", "deploy web; note thing").await;
    let reject_deploy = with_decisions(json!([{"index": 1, "decision": "reject"}]));
    let (status, chunk) = decide(&app, "lead-key-000001", "r2", &id, reject_deploy).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ConfirmationReceived),
        "{}",
        chunk.chunk
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note thing"], "the deploy never ran");
}

#[tokio::test]
async fn a_respond_on_the_way_to_a_quorum_is_refused_not_counted() {
    let dir = Workdir::new();
    let app = app(&dir, &deploy(&dir, KEYS)).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "r3", "deploy web").await;
    let respond = with_decisions(json!([{"index": 1, "decision": "respond", "result": "done"}]));
    let (status, chunk) = decide(&app, "lead-key-000001", "r3", &id, respond).await;
    assert_eq!(
        (status, error_type(&chunk)),
        (422, "edit_needs_new_round"),
        "{}",
        chunk.chunk
    );
    // Not counted: lead-1 may still approve, and one approval is not enough.
    let (status, chunk) = decide(&app, "lead-key-000001", "r3", &id, confirm()).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ApprovalRecorded)
    );
    assert_eq!(chunk.metadata["approvals"], json!(["lead-1"]));
    let (status, chunk) = decide(&app, "lead-key-000002", "r3", &id, confirm()).await;
    assert_eq!(status, 200);
    assert_eq!(chunk.metadata["approved_by"], json!(["lead-1", "lead-2"]));
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["deploy web"]);
}

#[tokio::test]
async fn a_grant_on_an_approval_that_does_not_decide_is_refused() {
    let dir = Workdir::new();
    let app = app(&dir, &deploy(&dir, KEYS)).await;
    let (_stream, id) = paused(&app, "agent-key-000001", "r4", "deploy web; note thing").await;
    let mut granting = confirm();
    granting["grant"] = json!({"scope": "session", "tools": ["note"], "ttl": "10m"});
    let (status, chunk) = decide(&app, "lead-key-000001", "r4", &id, granting).await;
    assert_eq!(
        (status, error_type(&chunk)),
        (422, "invalid_grant"),
        "{}",
        chunk.chunk
    );
    let (status, chunk) = decide(&app, "lead-key-000001", "r4", &id, confirm()).await;
    assert_eq!(
        (status, chunk.chunk_type),
        (200, ChunkType::ApprovalRecorded),
        "the refused reply counted nothing"
    );
}

/// Notes about prod need two leads (an `ask` rule).
const PROD_NOTES: &str = r#"
[[rule]]
name = "prod notes"
tool = "note"
args = { "/step" = "note prod*" }
decision = "ask"
approvals = 2
approvers = "leads"
"#;

#[tokio::test]
async fn an_edit_into_an_ask_rule_s_call_goes_to_its_people_not_the_requester() {
    let dir = Workdir::new();
    let app = app(&dir, PROD_NOTES).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "e1", "note dev one").await;
    let edit = with_decisions(json!([
        {"index": 1, "decision": "edit", "args": {"step": "note prod one"}}
    ]));
    let (status, chunk) = decide(&app, "agent-key-000001", "e1", &id, edit).await;
    assert_eq!(
        (status, error_type(&chunk)),
        (422, "edit_needs_new_round"),
        "{}",
        chunk.chunk
    );
    assert!(chunk.chunk.contains("leads"), "{}", chunk.chunk);
    // An edit the pause's people suffice for is taken.
    let edit = with_decisions(json!([
        {"index": 1, "decision": "edit", "args": {"step": "note dev two"}}
    ]));
    let (status, chunk) = decide(&app, "agent-key-000001", "e1", &id, edit).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note dev two"], "the prod note never ran");
}

#[tokio::test]
async fn after_an_escalation_the_requester_still_may_not_approve_a_group_s_pause() {
    let dir = Workdir::new();
    let keys = format!("{KEYS}oncall-agent-0009 label=paging-bot groups=oncall\n");
    std::fs::write(dir.path("keys.txt"), keys).unwrap();
    let extra = r#"
[[tool]]
name = "restart"
description = "Restart a service"
risk = "low"
approvers = "leads"
escalate_after = "1s"
escalate_to = "oncall"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;
    let app = app(&dir, extra).await;
    let (mut stream, id) = paused(&app, "oncall-agent-0009", "x1", "restart api").await;
    let (status, chunk) = decide(&app, "oncall-agent-0009", "x1", &id, confirm()).await;
    assert_eq!((status, error_type(&chunk)), (403, "self_approval"));
    let escalated = stream.until(ChunkType::Status).await;
    assert!(
        escalated.chunk.starts_with("Escalated to oncall"),
        "{}",
        escalated.chunk
    );
    let (status, chunk) = decide(&app, "oncall-agent-0009", "x1", &id, confirm()).await;
    assert_eq!(
        (status, error_type(&chunk)),
        (403, "self_approval"),
        "escalated or not, the requester never approves: {}",
        chunk.chunk
    );
    // The inbox (and so the page's Confirm button) says the same: one rule.
    let listed = crate::approvers::inbox(&app, "oncall-agent-0009").await;
    assert_eq!(listed[0]["may_approve"], false, "{listed:?}");
    assert!(
        listed[0]["why_not"].as_str().unwrap().contains("requester"),
        "{listed:?}"
    );
    // The on-call approver (lead-2 is in oncall) decides it.
    let (status, _) = decide(&app, "lead-key-000002", "x1", &id, confirm()).await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test]
async fn a_rule_s_requester_may_approve_never_loosens_a_tool_s_quorum() {
    let dir = Workdir::new();
    let extra = format!(
        "{}\n[[rule]]\nname = \"loose\"\ntool = \"deploy\"\ndecision = \"ask\"\n\
         requester_may_approve = true\n",
        deploy(&dir, KEYS)
    );
    let app = app(&dir, &extra).await;
    let (_stream, id) = paused(&app, "agent-key-000001", "l1", "deploy web").await;
    let (status, chunk) = decide(&app, "agent-key-000001", "l1", &id, confirm()).await;
    assert_eq!(
        (status, error_type(&chunk)),
        (403, "self_approval"),
        "the tool keeps the requester out; the rule alone cannot let it in: {}",
        chunk.chunk
    );
}

#[tokio::test]
async fn a_grant_revoked_by_an_approver_names_its_label_and_a_scoped_approver_sees_its_own() {
    let dir = Workdir::new();
    let app = app(&dir, "").await;
    // web-app grants itself notes for ten minutes.
    let (_stream, id) = paused(&app, "other-key-000002", "g1", "note one").await;
    let mut granting = confirm();
    granting["grant"] = json!({"scope": "session", "tools": ["note"], "ttl": "10m"});
    let (status, chunk) = decide(&app, "other-key-000002", "g1", &id, granting).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    let grants = |key: &'static str| {
        let (client, url) = (app.client.clone(), format!("{}/api/v1/grants", app.address));
        async move {
            let listed: Value = client
                .get(url)
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            listed["grants"].as_array().unwrap().clone()
        }
    };
    // The run keeps the grant once it has the decision, just after the
    // reply's 200: wait for it to be listed.
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    let listed = loop {
        let listed = grants("lead-key-000001").await;
        if !listed.is_empty() || tokio::time::Instant::now() > deadline {
            break listed;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    };
    assert_eq!(listed.len(), 1, "{listed:?}");
    let grant_id = listed[0]["id"].as_str().unwrap().to_owned();
    let revoke = |key: &'static str| {
        app.client
            .delete(format!("{}/api/v1/grants/{grant_id}", app.address))
            .bearer_auth(key)
            .send()
    };

    // ci-watch is scoped to ci-bot's namespace, as in its inbox.
    assert!(grants("ci-only-key-0004").await.is_empty());
    assert_eq!(revoke("ci-only-key-0004").await.unwrap().status(), 404);

    assert_eq!(revoke("lead-key-000001").await.unwrap().status(), 204);
    let revoked = dir
        .audit()
        .into_iter()
        .find(|r| r["event"] == "grant_revoked")
        .expect("a grant_revoked record");
    assert_eq!(revoked["key"], "lead-1", "{revoked}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_plan_never_runs_a_task_that_was_not_in_its_pause() {
    use crate::durable::{chunks, open_paused, post, read_raw, reply, start, stream_url};
    let work = Workdir::new();
    let deny = "[[rule]]\nname = \"no wipes\"\ntool = \"note\"\n\
                args = { \"/step\" = \"note wipe*\" }\ndecision = \"deny\"\n";
    let tools = work.tools(deny).display().to_string();
    let dir = crate::durable::Dir::new();
    let mut first = start(&dir, &["--tools", &tools]);
    let reading = open_paused(
        &stream_url(&first),
        json!({"message": "note wipe all; note keep", "session_id": "rp"}),
    )
    .await;
    crate::durable::terminate(&mut first);
    let seen = chunks(&reading.finish().await);
    let request = seen
        .iter()
        .find(|c| c.chunk_type == ChunkType::ConfirmationRequest)
        .unwrap();
    assert_eq!(
        request.approval().unwrap().tasks.len(),
        1,
        "the wipe is not asked"
    );

    // The operator drops the rule; the restarted server restores the plan.
    let tools = work.tools("").display().to_string();
    let second = start(&dir, &["--tools", &tools]);
    let url = stream_url(&second);
    let last_seen = seen.last().unwrap().sequence;
    let back = post(&url, json!({"session_id": "rp"}), Some(last_seen)).await;
    let rest = tokio::spawn(read_raw(back, None));
    let (status, ack) = reply(&url, "rp", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200, "{ack:?}");
    let after = chunks(&rest.await.unwrap());
    let last = after.last().unwrap();
    assert_eq!(last.chunk_type, ChunkType::Completion, "{}", last.chunk);
    assert_eq!(
        work.notes(),
        ["note keep"],
        "the wipe nobody saw was never run"
    );
}

#[test]
fn a_label_that_is_another_key_s_place_label_stops_the_start() {
    let dir = Workdir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(
        &keys,
        "agent-key-000001\napprover lead-key-000001\napprover lead-key-000002 label=approver-1\n",
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
        .args(["--bind", "127.0.0.1:0", "--api-keys-file"])
        .arg(&keys)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("line 3"), "{stderr}");
    assert!(stderr.contains("`approver-1`"), "{stderr}");
}

#[tokio::test]
async fn an_edited_task_spends_no_second_call_of_the_grant_that_routed_it() {
    let dir = Workdir::new();
    let extra = r#"
[[tool]]
name = "deploy"
description = "Deploy"
risk = "high"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;
    let app = app_with_tools(&dir, extra, |_| {}).await;
    let (mut first, _) = app.open_paused("gr", "note one").await;
    let granting = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "gr",
        "grant": {"scope": "session", "tools": ["note"], "ttl": "10m", "max_calls": 3}});
    let (status, chunk) = crate::helpers::one_chunk(app.post_json(&granting).await).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    assert_eq!(first.finish().await.chunk_type, ChunkType::Completion);
    let calls_left = || async {
        let listed: Value = app
            .client
            .get(format!("{}/api/v1/grants", app.address))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        listed["grants"][0]["calls_left"].as_u64().unwrap()
    };
    assert_eq!(
        calls_left().await,
        3,
        "the call confirmed with it spends none"
    );

    // The grant routes `note two` (a call spent); the deploy is asked; the
    // person edits the note: the edit spends nothing more.
    let (mut second, request) = app.open_paused("gr", "note two; deploy web").await;
    assert_eq!(request.approval().unwrap().tasks.len(), 2);
    assert_eq!(calls_left().await, 2, "routing note two spent one");
    let edit = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "gr",
        "decisions": [{"index": 1, "decision": "edit", "args": {"step": "note edited"}}]});
    let (status, chunk) = crate::helpers::one_chunk(app.post_json(&edit).await).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    assert_eq!(second.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note one", "note edited"]);
    assert_eq!(calls_left().await, 2, "the edit spent no second call");
}

#[tokio::test]
async fn a_grant_covers_no_call_above_what_its_granting_key_may_decide() {
    let dir = Workdir::new();
    let app = app(&dir, "").await;
    // junior (max_risk=low) allows notes for every session of ci-bot.
    let (mut first, id) = paused(&app, "agent-key-000001", "gk", "note one").await;
    let mut granting = confirm();
    granting["grant"] = json!({"scope": "key", "tools": ["note"], "ttl": "10m"});
    let (status, chunk) = decide(&app, "low-key-0000003", "gk", &id, granting).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    assert_eq!(first.finish().await.chunk_type, ChunkType::Completion);

    // A low-risk note runs on the grant, unasked.
    let started = post(
        &app,
        "agent-key-000001",
        json!({"message": "note two", "session_id": "gk2"}),
    )
    .await;
    let mut second = crate::helpers::EventStream::new(started);
    assert_eq!(second.finish().await.chunk_type, ChunkType::Completion);
    assert!(!second.types().contains(&ChunkType::ConfirmationRequest));

    // A high-risk one ("delete") is above what junior may decide: asked.
    let (_third, _) = paused(&app, "agent-key-000001", "gk3", "note delete old drafts").await;
    assert_eq!(
        dir.notes(),
        ["note one", "note two"],
        "the delete waits for a person"
    );
}
