//! Rules with the `openai` engine, against the scripted model server: the
//! model's calls are routed by the tools file's rules, never by the model.

use chatgate::protocol::ChunkType;
use serde_json::json;

use crate::model_server::{fake_model, tokens};
use crate::openai::app_with_model;
use crate::openai_tools::{answer, call, tool_messages, Tooling};

const RULES: &str = r#"
[[rule]]
name = "never danger"
tool = "danger"
decision = "deny"
reason = "not from a model"

[[rule]]
name = "peek asks"
tool = "peek"
decision = "ask"

[[rule]]
name = "ok notes"
tool = "note"
args = { "/step" = "ok*" }
decision = "allow"
"#;

fn one_call(id: &str, tool: &str, args: serde_json::Value) -> String {
    answer(
        &[call(Some(0), Some(id), Some(tool), json!(args.to_string()))],
        "tool_calls",
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_call_goes_back_to_the_model_as_denied_and_is_never_asked() {
    let tooling = Tooling::with_rules(RULES);
    let model = fake_model(vec![
        one_call("c1", "danger", json!({"step": "wipe"})),
        tokens(&["Understood."]),
    ])
    .await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let mut stream = app.open("deny", "wipe it").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert!(!stream.types().contains(&ChunkType::ConfirmationRequest));
    let output = stream
        .chunks
        .iter()
        .find(|c| c.chunk_type == ChunkType::ToolOutput)
        .expect("the denial is reported");
    assert_eq!(output.metadata["error_type"], "denied_by_rule");
    assert_eq!(output.metadata["rule"], "never danger");
    assert_eq!(output.metadata["ok"], false);
    let told = tool_messages(&model.requests()[1]);
    let told = told[0]["content"].as_str().unwrap();
    assert!(told.contains("denied_by_rule"), "{told}");
    assert!(told.contains("not from a model"), "{told}");
    assert!(tooling.notes().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_rule_asks_for_a_tool_that_needs_no_confirmation() {
    let tooling = Tooling::with_rules(RULES);
    let model = fake_model(vec![one_call("c1", "peek", json!({})), tokens(&["ok"])]).await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let (mut stream, request) = app.open_paused("ask", "look").await;
    assert_eq!(request.approval().unwrap().tasks[0].tool, "peek");
    assert!(
        !stream.types().contains(&ChunkType::ToolOutput),
        "nothing ran before the yes"
    );
    app.reply("ask", "CONFIRM_ACTION:confirm").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_call_runs_at_once_alone_and_is_listed_beside_one_that_asks() {
    let tooling = Tooling::with_rules(RULES);
    let both = answer(
        &[
            call(
                Some(0),
                Some("c1"),
                Some("note"),
                json!("{\"step\":\"ok one\"}"),
            ),
            call(
                Some(1),
                Some("c2"),
                Some("note"),
                json!("{\"step\":\"other\"}"),
            ),
        ],
        "tool_calls",
    );
    let model = fake_model(vec![
        one_call("c0", "note", json!({"step": "ok alone"})),
        tokens(&["noted"]),
        both,
        tokens(&["both noted"]),
    ])
    .await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let mut alone = app.open("allow-1", "note it").await;
    assert_eq!(alone.finish().await.chunk_type, ChunkType::Completion);
    assert!(!alone.types().contains(&ChunkType::ConfirmationRequest));
    assert_eq!(tooling.notes(), ["ok alone"]);
    let ran = alone
        .chunks
        .iter()
        .find(|c| c.chunk_type == ChunkType::ToolOutput)
        .unwrap();
    assert_eq!(ran.metadata["approved_by"], json!({"rule": "ok notes"}));

    let (mut stream, request) = app.open_paused("allow-2", "note both").await;
    let tasks = &request.approval().unwrap().tasks;
    assert_eq!(tasks.len(), 2);
    assert_eq!(
        serde_json::to_value(&tasks[0].approved_by).unwrap(),
        json!({"rule": "ok notes"})
    );
    assert!(tasks[1].approved_by.is_none());
    app.reply("allow-2", "CONFIRM_ACTION:confirm").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(tooling.notes(), ["ok alone", "ok one", "other"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_nobody_answers_whose_tools_say_reject_tells_the_model_it_was_rejected() {
    let tooling = Tooling::with_rules(
        r#"
[[tool]]
name = "nudge"
description = "A nudge nobody has to answer"
risk = "low"
timeout = "1s"
on_timeout = "reject"
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#,
    );
    let model = fake_model(vec![
        one_call("c1", "nudge", json!({"step": "them"})),
        tokens(&["Nobody answered; moving on."]),
    ])
    .await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let (mut stream, _) = app.open_paused("silence", "nudge them").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion, "{}", last.chunk);
    let told = tool_messages(&model.requests()[1]);
    let told = told[0]["content"].as_str().unwrap();
    assert!(told.contains("rejected"), "{told}");
    assert!(told.contains("no answer in time"), "{told}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_routed_call_asked_beside_another_runs_as_the_grant_s() {
    let tooling = Tooling::with_rules(RULES);
    let both = answer(
        &[
            call(
                Some(0),
                Some("c2"),
                Some("note"),
                json!("{\"step\":\"two\"}"),
            ),
            call(Some(1), Some("c3"), Some("peek"), json!("{}")),
        ],
        "tool_calls",
    );
    let model = fake_model(vec![
        one_call("c1", "note", json!({"step": "one"})),
        tokens(&["noted"]),
        both,
        tokens(&["both done"]),
    ])
    .await;
    let app = app_with_model(&model.url, tooling.configure()).await;

    let (mut first, _) = app.open_paused("gr", "note one").await;
    let granting = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "gr",
        "grant": {"scope": "session", "tools": ["note"], "ttl": "10m"}});
    let (status, chunk) = crate::helpers::one_chunk(app.post_json(&granting).await).await;
    assert_eq!(status, 200, "{}", chunk.chunk);
    assert_eq!(first.finish().await.chunk_type, ChunkType::Completion);

    let (mut second, request) = app.open_paused("gr", "note two and peek").await;
    let tasks = &request.approval().unwrap().tasks;
    let by = serde_json::to_value(&tasks[0].approved_by).unwrap();
    assert!(by["grant"].is_string(), "listed as the grant's: {by}");
    app.reply("gr", "CONFIRM_ACTION:confirm").await;
    assert_eq!(second.finish().await.chunk_type, ChunkType::Completion);
    let ran = second
        .chunks
        .iter()
        .find(|c| c.chunk_type == ChunkType::ToolOutput)
        .unwrap();
    assert_eq!(ran.metadata["approved_by"], by, "it ran as the grant's");
}
