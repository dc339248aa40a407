//! Rules on a call's arguments (`[[rule]]`) with the planner, over real
//! sockets: deny, allow, ask, shadow, keys, an edit a rule denies, and
//! `--explicit-decisions`.

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::access::post_as;
use crate::helpers::{error_type, one_chunk, EventStream};
use crate::tools::{app_with_tools, confirm_with, outputs, Workdir};

/// The rules most tests use: notes about prod are denied, notes about
/// staging allowed, notes about `shadow` watched by a shadow deny.
const RULES: &str = r#"
[[rule]]
name = "no prod"
tool = "note"
args = { "/step" = "note prod*" }
decision = "deny"
reason = "prod is frozen"

[[rule]]
name = "staging notes"
tool = "no?e"
args = { "/step" = { regex = "note staging( .*)?" } }
decision = "allow"

[[rule]]
name = "watch"
tool = "note"
args = { "/step" = "*shadow*" }
decision = "deny"
mode = "shadow"
"#;

/// The audit records of `event`.
fn records(dir: &Workdir, event: &str) -> Vec<Value> {
    dir.audit()
        .into_iter()
        .filter(|r| r["event"] == event)
        .collect()
}

#[tokio::test]
async fn a_denied_call_is_left_out_of_the_pause_and_reported_and_never_runs() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, RULES, |_| {}).await;

    let (mut stream, request) = app
        .open_paused("deny", "note prod deploy; note other thing")
        .await;
    let data = request.approval().unwrap();
    assert_eq!(data.tasks.len(), 1, "the denied task is not asked");
    assert_eq!(data.tasks[0].index, 2, "tasks keep their plan index");
    let denied = outputs(&stream)[0].clone();
    assert_eq!(denied.metadata["ok"], false);
    assert_eq!(denied.metadata["error_type"], "denied_by_rule");
    assert_eq!(denied.metadata["rule"], "no prod");
    assert_eq!(denied.metadata["reason"], "prod is frozen");
    assert_eq!(denied.metadata["step"], 1);

    // A decision naming the denied task is refused: it is not in the pause.
    let named = confirm_with(&app, "deny", json!([{"index": 1, "decision": "approve"}])).await;
    let (status, chunk) = one_chunk(named).await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (422, "invalid_decision")
    );
    let (status, _) =
        one_chunk(confirm_with(&app, "deny", json!([{"index": 2, "decision": "approve"}])).await)
            .await;
    assert_eq!(status, 200);
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.metadata["tasks_denied"], 1);
    assert_eq!(last.metadata["tasks_completed"], 1);
    assert_eq!(dir.notes(), ["note other thing"], "only the asked task ran");
    let policy = records(&dir, "policy");
    assert_eq!(policy.len(), 1, "{policy:?}");
    assert_eq!(policy[0]["rule"], "no prod");
    assert_eq!(policy[0]["mode"], "enforce");
    assert_eq!(policy[0]["decision"], "deny");
    assert_eq!(policy[0]["actual"], "deny");
    assert_eq!(policy[0]["key"], "anonymous");
    assert_eq!(policy[0]["args"]["step"], "note prod deploy");
    let text = app.get("/metrics").await.1;
    assert!(
        text.contains(
            r#"chatgate_policy_decisions_total{rule="no prod",decision="deny",mode="enforce"} 1"#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn a_plan_every_task_of_which_is_denied_asks_nothing_and_runs_nothing() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, RULES, |_| {}).await;

    let mut stream = app.open("all-denied", "note prod a; note prod b").await;
    let last = stream.finish().await;

    assert!(!stream.types().contains(&ChunkType::ConfirmationRequest));
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.metadata["tasks_denied"], 2);
    assert_eq!(last.metadata["tasks_completed"], 0);
    assert!(last.chunk.contains("2 denied by rules"), "{}", last.chunk);
    assert_eq!(outputs(&stream).len(), 2);
    assert!(dir.notes().is_empty());
}

#[tokio::test]
async fn a_plan_every_task_of_which_is_allowed_runs_without_a_pause_and_says_why() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, RULES, |_| {}).await;

    let mut stream = app
        .open("all-allowed", "note staging one; note staging")
        .await;
    let last = stream.finish().await;

    assert!(!stream.types().contains(&ChunkType::ConfirmationRequest));
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note staging one", "note staging"]);
    let ran = outputs(&stream);
    assert_eq!(
        ran[0].metadata["approved_by"],
        json!({"rule": "staging notes"})
    );
    let executed = records(&dir, "executed");
    assert_eq!(executed.len(), 2);
    assert_eq!(executed[0]["approved_by"], json!({"rule": "staging notes"}));
    assert!(records(&dir, "proposed").is_empty(), "nothing was asked");
    assert_eq!(records(&dir, "policy").len(), 2);
}

#[tokio::test]
async fn allowed_tasks_beside_asked_ones_are_marked_and_may_still_be_rejected() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, RULES, |_| {}).await;

    let (mut stream, request) = app
        .open_paused("mixed", "note staging a; note other; note staging b")
        .await;
    let data = request.approval().unwrap();
    assert_eq!(data.tasks.len(), 3);
    let by = |i: usize| serde_json::to_value(&data.tasks[i].approved_by).unwrap();
    assert_eq!(by(0), json!({"rule": "staging notes"}));
    assert_eq!(by(1), Value::Null, "the asked task has no approved_by");
    assert_eq!(by(2), json!({"rule": "staging notes"}));
    let decisions = json!([{"index": 3, "decision": "reject", "reason": "not now"}]);
    let (status, _) = one_chunk(confirm_with(&app, "mixed", decisions).await).await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);

    assert_eq!(dir.notes(), ["note staging a", "note other"]);
    let executed = records(&dir, "executed");
    assert_eq!(executed[0]["approved_by"], json!({"rule": "staging notes"}));
    assert!(
        executed[1].get("approved_by").is_none(),
        "a person approved it"
    );
}

#[tokio::test]
async fn an_edit_whose_new_arguments_a_deny_rule_matches_is_refused_and_the_pause_stays() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, RULES, |_| {}).await;
    let (mut stream, _) = app.open_paused("edit", "note harmless").await;

    let edit = json!([{"index": 1, "decision": "edit", "args": {"step": "note prod now"}}]);
    let (status, chunk) = one_chunk(confirm_with(&app, "edit", edit).await).await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (422, "denied_by_rule")
    );
    assert!(chunk.chunk.contains("no prod"), "{}", chunk.chunk);

    let edit = json!([{"index": 1, "decision": "edit", "args": {"step": "note fine"}}]);
    let (status, _) = one_chunk(confirm_with(&app, "edit", edit).await).await;
    assert_eq!(status, 200, "the pause stayed");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note fine"]);
}

#[tokio::test]
async fn a_shadow_rule_changes_nothing_and_records_what_it_would_have_done() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, RULES, |_| {}).await;

    let (mut stream, request) = app.open_paused("shadow", "note shadow test").await;
    assert_eq!(request.approval().unwrap().tasks.len(), 1, "asked as usual");
    app.reply("shadow", "CONFIRM_ACTION:confirm").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);

    assert_eq!(
        dir.notes(),
        ["note shadow test"],
        "it ran: the rule is a shadow"
    );
    let policy = records(&dir, "policy");
    assert_eq!(policy.len(), 1);
    assert_eq!(policy[0]["rule"], "watch");
    assert_eq!(policy[0]["mode"], "shadow");
    assert_eq!(policy[0]["decision"], "deny");
    assert_eq!(policy[0]["actual"], "ask");
    let text = app.get("/metrics").await.1;
    assert!(
        text.contains(
            r#"chatgate_policy_decisions_total{rule="watch",decision="deny",mode="shadow"} 1"#
        ),
        "{text}"
    );
}

#[tokio::test]
async fn keys_limit_a_rule_to_the_requesters_they_name() {
    let dir = Workdir::new();
    let extra = r#"
[[rule]]
name = "bob may"
tool = "note"
keys = ["key-2"]
decision = "allow"
"#;
    let app = app_with_tools(&dir, extra, |s| {
        s.server.api_keys = vec!["alice".into(), "bob".into()];
    })
    .await;

    let mut bob = EventStream::new(post_as(&app, Some("bob"), "b", "note from bob").await);
    assert_eq!(bob.finish().await.chunk_type, ChunkType::Completion);
    assert!(!bob.types().contains(&ChunkType::ConfirmationRequest));
    let mut alice = EventStream::new(post_as(&app, Some("alice"), "a", "note from alice").await);
    alice.until(ChunkType::ConfirmationRequest).await;

    assert_eq!(dir.notes(), ["note from bob"]);
    assert_eq!(records(&dir, "policy")[0]["key"], "key-2");
}

#[tokio::test]
async fn explicit_decisions_refuse_a_reply_that_leaves_a_task_undecided() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |s| s.pauses.explicit_decisions = true).await;
    let (mut stream, _) = app.open_paused("explicit", "note a; note b").await;

    let partial = json!([{"index": 1, "decision": "approve"}]);
    let (status, chunk) = one_chunk(confirm_with(&app, "explicit", partial).await).await;
    assert_eq!(
        (status.as_u16(), error_type(&chunk)),
        (422, "undecided_tasks")
    );
    assert!(chunk.chunk.contains("task(s) 2"), "{}", chunk.chunk);

    let full = json!([
        {"index": 1, "decision": "approve"},
        {"index": 2, "decision": "reject"}
    ]);
    let (status, _) = one_chunk(confirm_with(&app, "explicit", full).await).await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note a"]);
}

#[test]
fn a_bad_rule_stops_the_start_with_one_line_naming_file_rule_and_key() {
    let dir = Workdir::new();
    let cases = [
        (
            "[[rule]]\nname = \"r\"\ntool = \"note\"\ndecision = \"allow\"\nargs = { \"/step\" = { regex = \"(\" } }\n",
            "rule \"r\"",
            "regex",
        ),
        (
            "[[rule]]\nname = \"typo\"\ntool = \"noet\"\ndecision = \"deny\"\n",
            "rule \"typo\"",
            "key `tool`",
        ),
    ];
    for (extra, place, key) in cases {
        let path = dir.tools(extra);
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
            .args(["--bind", "127.0.0.1:0", "--tools"])
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(&path.display().to_string()), "{stderr}");
        assert!(stderr.contains(place), "{stderr}");
        assert!(stderr.contains(key), "{stderr}");
    }
}

#[tokio::test]
async fn every_matcher_kind_decides_over_a_socket() {
    let dir = Workdir::new();
    let extra = r#"
[[tool]]
name = "probe"
description = "Takes structured arguments"
risk = "low"
command = ["true"]
parameters = { type = "object", properties = { env = { type = "string" }, n = { type = "number" }, tags = { type = "array" }, note = { type = "string" } } }

[[rule]]
name = "equals"
tool = "probe"
args = { "/env" = { equals = "prod" } }
decision = "deny"

[[rule]]
name = "one_of"
tool = "probe"
args = { "/env" = { one_of = ["qa", "dev"] } }
decision = "deny"

[[rule]]
name = "range"
tool = "probe"
args = { "/n" = { min = 10, max = 20 } }
decision = "deny"

[[rule]]
name = "regex"
tool = "probe"
args = { "/note" = { regex = "(?i)secret.*" } }
decision = "deny"

[[rule]]
name = "glob"
tool = "probe"
args = { "/tags/0" = "urgent-*" }
decision = "deny"

[[rule]]
name = "exists"
tool = "probe"
args = { "/env" = { exists = false } }
decision = "deny"
"#;
    let app = app_with_tools(&dir, extra, |_| {}).await;
    let cases = [
        (r#"{"env": "prod"}"#, Some("equals")),
        (r#"{"env": "dev"}"#, Some("one_of")),
        (r#"{"env": "stage", "n": 15}"#, Some("range")),
        (r#"{"env": "stage", "n": 25}"#, None),
        (r#"{"env": "stage", "note": "Secret plan"}"#, Some("regex")),
        (r#"{"env": "stage", "note": "a secret"}"#, None),
        (r#"{"env": "stage", "tags": ["urgent-1"]}"#, Some("glob")),
        (r#"{"n": 1}"#, Some("exists")),
        (r#"{"env": "stage"}"#, None),
    ];
    for (n, (args, rule)) in cases.into_iter().enumerate() {
        let session = format!("m{n}");
        let mut stream = app.open(&session, &format!("probe {args}")).await;
        let mut paused = false;
        while let Some(chunk) = stream.next_chunk().await {
            if chunk.chunk_type == ChunkType::ConfirmationRequest {
                paused = true;
                break;
            }
            if chunk.finished {
                break;
            }
        }
        match rule {
            Some(rule) => {
                assert!(!paused, "{args}: denied, so nothing is asked");
                let denied = outputs(&stream)[0];
                assert_eq!(denied.metadata["rule"], rule, "{args}");
            }
            None => {
                assert!(paused, "{args}: no rule matches, so it is asked");
                app.reply(&session, "CONFIRM_ACTION:cancel").await;
            }
        }
    }
}
