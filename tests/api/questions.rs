//! Questions, the second kind of pause (#16), over real sockets: the
//! planner's `ask` steps and an engine's own typed questions; answers as
//! text or as `answers`, skip, cancel, timeout, the 422s that leave the
//! pause intact, racing answers, re-attach, the audit log, and a restart
//! with `sqlite:`.

use std::sync::Arc;
use std::time::Duration;

use chatgate::protocol::question::Question;
use chatgate::protocol::{Action, Chunk, ChunkType, PauseKind};
use chatgate::run::{Answers, Completion, Engine, Questions, RunContext, RunError};
use futures_util::future::{join_all, BoxFuture};
use futures_util::FutureExt;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};

use crate::durable::{self, Dir};
use crate::helpers::{
    confirmation_id, error_type, one_chunk, reason, spawn_app, spawn_app_with,
    spawn_app_with_engine, EventStream, TestApp,
};

/// Starts a run and reads until its `input_request`.
async fn open_asked(app: &TestApp, session: &str, message: &str) -> (EventStream, Chunk) {
    let mut stream = app.open(session, message).await;
    let request = stream.until(ChunkType::InputRequest).await;
    (stream, request)
}

/// Sends a reply with extra body fields (`answers`, `confirmation_id`).
async fn reply_with(
    app: &TestApp,
    session: &str,
    message: &str,
    extra: Value,
) -> (StatusCode, Chunk) {
    let mut body = json!({"message": message, "session_id": session});
    body.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    one_chunk(app.post_json(&body).await).await
}

const REGION: &str = "ask region: which region? eu-west | us-east; deploy to {region}";

#[tokio::test]
async fn a_planner_question_is_answered_then_its_plan_is_confirmed_with_the_answer() {
    let app = spawn_app().await;
    let (mut stream, request) = open_asked(&app, "q", REGION).await;

    assert!(request.requires_response && request.stream_paused && !request.finished);
    assert_eq!(request.chunk, "which region?");
    let data = request.questions().expect("question data").clone();
    assert_eq!(data.kind, PauseKind::Question);
    assert_eq!(data.options, Action::QUESTION);
    assert_eq!(data.title, "which region?");
    assert_eq!(data.questions.len(), 1);
    let q = &data.questions[0];
    assert_eq!(q.id, "region");
    assert!(q.allow_other && q.required && !q.multi_select);
    assert_eq!(q.options.len(), 2);
    assert_eq!(request.metadata["kind"], "question");
    assert_eq!(request.metadata["total_questions"], 1);
    assert_eq!(request.metadata["timeout_seconds"], 300);
    assert_eq!(request.metadata["confirmation_id"], data.confirmation_id);
    let raw: Value = serde_json::to_value(&request).unwrap();
    assert_eq!(raw["confirmation_data"]["kind"], "question");
    assert_eq!(
        raw["confirmation_data"]["options"],
        json!(["answer", "skip", "cancel"])
    );

    let (status, ack) = app.reply("q", "CONFIRM_ACTION:answer: EU-West ").await;
    assert_eq!(status, 200, "{ack:?}");
    assert!(ack.finished);
    assert_eq!(ack.chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(ack.metadata["action"], "answer");
    assert_eq!(ack.metadata["answers"], json!({"region": "eu-west"}));
    assert_eq!(ack.metadata["confirmation_id"], data.confirmation_id);

    let shown = stream.until(ChunkType::ConfirmationReceived).await;
    assert!(!shown.finished);
    assert_eq!(shown.metadata["answers"], json!({"region": "eu-west"}));
    let plan = stream.until(ChunkType::ConfirmationRequest).await;
    let tasks = &plan.approval().unwrap().tasks;
    assert_eq!(tasks.len(), 1);
    assert_eq!(tasks[0].description, "deploy to eu-west");
    let (status, _) = app.reply("q", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(stream.types()[0], ChunkType::InputRequest, "asked first");
    app.registry_drains().await;
}

#[tokio::test]
async fn multi_select_other_text_and_free_text_are_normalized() {
    let app = spawn_app().await;
    let message = "ask checks: which checks? [multi] Lint | Unit tests | Fuzz; \
                   ask region: which region? eu-west | us-east; \
                   ask note: anything else?; \
                   run {checks} in {region} noting {note}";
    let (mut stream, request) = open_asked(&app, "multi", message).await;
    assert_eq!(request.questions().unwrap().questions.len(), 3);
    assert_eq!(request.chunk, "3 questions before the plan");

    let answers = json!({"answers": {
        "checks": ["fuzz", "LINT"], "region": "ap-south", "note": "  be quick "
    }});
    let (status, ack) = reply_with(&app, "multi", "CONFIRM_ACTION:answer", answers).await;

    assert_eq!(status, 200, "{ack:?}");
    assert_eq!(
        ack.metadata["answers"],
        json!({"checks": ["Lint", "Fuzz"], "region": "ap-south", "note": "be quick"}),
        "labels in option order, other text, trimmed free text"
    );
    let plan = stream.until(ChunkType::ConfirmationRequest).await;
    assert_eq!(
        plan.approval().unwrap().tasks[0].description,
        "run Lint, Fuzz in ap-south noting be quick"
    );
}

#[tokio::test]
async fn a_multi_select_answer_as_text_is_a_comma_separated_list() {
    let app = spawn_app().await;
    let (_stream, _) = open_asked(&app, "m", "ask which? [multi] a | b | c; use {q1}").await;

    let (status, ack) = app.reply("m", "CONFIRM_ACTION:answer:c, A").await;

    assert_eq!(status, 200, "{ack:?}");
    assert_eq!(ack.metadata["answers"], json!({"q1": ["a", "c"]}));
}

#[tokio::test]
async fn skip_drops_the_steps_that_need_the_answer_and_says_so() {
    let app = spawn_app().await;
    let (mut stream, _) = open_asked(
        &app,
        "s",
        "ask region: where? a | b; build; deploy to {region}",
    )
    .await;

    let (status, ack) = app.reply("s", "CONFIRM_ACTION:skip").await;

    assert_eq!(status, 200);
    assert_eq!(ack.metadata["action"], "skip");
    assert!(ack.metadata.get("answers").is_none());
    let status_chunk = stream.until(ChunkType::Status).await;
    assert!(
        status_chunk.chunk.contains("deploy to {region}"),
        "{status_chunk:?}"
    );
    let plan = stream.until(ChunkType::ConfirmationRequest).await;
    let steps: Vec<&str> = plan
        .approval()
        .unwrap()
        .tasks
        .iter()
        .map(|t| t.description.as_str())
        .collect();
    assert_eq!(steps, ["build"]);
}

#[tokio::test]
async fn a_skip_that_leaves_no_step_completes_with_nothing_run() {
    let app = spawn_app().await;
    let (mut stream, _) = open_asked(&app, "e", "ask region: where?; deploy to {region}").await;

    app.reply("e", "CONFIRM_ACTION:skip").await;
    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.metadata["tasks_completed"], 0);
    assert!(!stream.types().contains(&ChunkType::ConfirmationRequest));
}

#[tokio::test]
async fn cancel_ends_the_run_cancelled_by_the_user() {
    let app = spawn_app().await;
    let (mut stream, _) = open_asked(&app, "c", REGION).await;

    let (status, ack) = app.reply("c", "CONFIRM_ACTION:cancel").await;
    let last = stream.finish().await;

    assert_eq!(status, 200);
    assert_eq!(ack.metadata["action"], "cancel");
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(reason(&last), "user");
    app.registry_drains().await;
}

#[tokio::test]
async fn an_unanswered_question_times_out_cancelled() {
    let app = spawn_app_with(|s| s.pauses.confirm_timeout = Duration::from_millis(300)).await;
    let (mut stream, request) = open_asked(&app, "t", REGION).await;
    assert_eq!(request.questions().unwrap().timeout_seconds, 1);

    let last = stream.finish().await;

    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(reason(&last), "timeout");
    let (status, late) = app.reply("t", "CONFIRM_ACTION:answer:eu-west").await;
    assert_eq!(status, 404, "{late:?}");
}

#[tokio::test]
async fn an_answer_holding_marks_is_put_in_once_and_a_plan_too_large_ends_the_run() {
    // The hostile review's message: a 32 KiB plan of `{a}` marks, and one
    // reply whose `a` is `{b}` x 1365 and whose `b` is 4,000 bytes. Put in
    // again and again it built a ~60 GB step and the process aborted.
    let app = spawn_app().await;
    let head = "ask a: first?; ask b: second?; ";
    let marks = "{a}".repeat((32 * 1024 - head.len()) / 3);
    let (mut stream, _) = open_asked(&app, "bomb", &format!("{head}{marks}")).await;
    let answers = json!({"answers": {"a": "{b}".repeat(1365), "b": "x".repeat(4000)}});

    let (status, ack) = reply_with(&app, "bomb", "CONFIRM_ACTION:answer", answers).await;

    assert_eq!(status, 200, "{ack:?}");
    let last = stream.finish().await;
    assert_eq!(error_type(&last), "plan_too_large", "{last:?}");
    // Once, over the step as written: an answer's `{b}` stays as typed.
    let (mut stream, _) =
        open_asked(&app, "once", "ask a: first?; ask b: second?; go {a} {b}").await;
    let answers = json!({"answers": {"a": "{b}", "b": "B"}});
    let (status, _) = reply_with(&app, "once", "CONFIRM_ACTION:answer", answers).await;
    assert_eq!(status, 200);
    let plan = stream.until(ChunkType::ConfirmationRequest).await;
    assert_eq!(plan.approval().unwrap().tasks[0].description, "go {b} B");
    let (status, _) = app.reply("once", "CONFIRM_ACTION:cancel").await;
    assert_eq!(status, 200);
    stream.finish().await;
}

#[tokio::test]
async fn answers_that_do_not_fit_get_422_and_leave_the_pause_intact() {
    let app = spawn_app().await;
    let (mut stream, request) = open_asked(
        &app,
        "bad",
        "ask region: where? a | b; ask who: owner?; go to {region}",
    )
    .await;
    let id = confirmation_id(&request);

    let cases: Vec<(&str, Value, &str, &str)> = vec![
        // A text answer needs a pause of one question.
        (
            "CONFIRM_ACTION:answer:a",
            json!({}),
            "invalid_answer",
            "2 questions",
        ),
        (
            "CONFIRM_ACTION:answer",
            json!({}),
            "invalid_answer",
            "answers",
        ),
        (
            "CONFIRM_ACTION:answer",
            json!({"answers": {"region": "a"}}),
            "invalid_answer",
            "`who` is required",
        ),
        (
            "CONFIRM_ACTION:answer",
            json!({"answers": {"region": "a", "who": "x", "extra": "y"}}),
            "invalid_answer",
            "no question `extra`",
        ),
        (
            "CONFIRM_ACTION:answer",
            json!({"answers": {"region": ["a"], "who": "x"}}),
            "invalid_answer",
            "`region` expects one of a (a), b (b)",
        ),
        (
            "CONFIRM_ACTION:answer:a",
            json!({"answers": {"region": "a", "who": "x"}}),
            "invalid_answer",
            "not both",
        ),
        (
            "CONFIRM_ACTION:answer",
            json!({"answers": {"region": "a", "who": "x".repeat(5000)}}),
            "invalid_answer",
            "over 4096 bytes",
        ),
        (
            "CONFIRM_ACTION:skip",
            json!({"answers": {"region": "a"}}),
            "invalid_answer",
            "answer only",
        ),
        (
            "CONFIRM_ACTION:confirm",
            json!({}),
            "invalid_confirm_action",
            "answer, skip, cancel",
        ),
        (
            "CONFIRM_ACTION:modify:x",
            json!({}),
            "invalid_confirm_action",
            "answer, skip, cancel",
        ),
        (
            "CONFIRM_ACTION:answer",
            json!({"decisions": [{"index": 1, "decision": "approve"}],
                   "answers": {"region": "a", "who": "x"}}),
            "invalid_decision",
            "confirm only",
        ),
    ];
    for (message, extra, expected_type, says) in cases {
        let (status, chunk) = reply_with(&app, "bad", message, extra.clone()).await;
        assert_eq!(status, 422, "{message} {extra}: {chunk:?}");
        assert_eq!(error_type(&chunk), expected_type, "{message} {extra}");
        assert!(
            chunk.chunk.contains(says),
            "{message} {extra}: {}",
            chunk.chunk
        );
        if expected_type == "invalid_confirm_action" {
            assert_eq!(
                chunk.metadata["options"],
                json!(["answer", "skip", "cancel"])
            );
        }
    }
    let (stale, _) = reply_with(
        &app,
        "bad",
        "CONFIRM_ACTION:skip",
        json!({"confirmation_id": "not-this-one"}),
    )
    .await;
    assert_eq!(stale, 409);

    let answers = json!({"answers": {"region": "B", "who": "Ana"}, "confirmation_id": id});
    let (status, ack) = reply_with(&app, "bad", "CONFIRM_ACTION:answer", answers).await;
    assert_eq!(status, 200, "the pause was intact: {ack:?}");
    assert_eq!(
        ack.metadata["answers"],
        json!({"region": "b", "who": "Ana"})
    );
    let plan = stream.until(ChunkType::ConfirmationRequest).await;
    assert_eq!(plan.approval().unwrap().tasks[0].description, "go to b");
}

#[tokio::test]
async fn answer_skip_and_answers_on_a_confirmation_are_refused() {
    let app = spawn_app().await;
    let (_stream, _) = app.open_paused("p", "one; two").await;

    for message in ["CONFIRM_ACTION:answer:x", "CONFIRM_ACTION:skip"] {
        let (status, chunk) = app.reply("p", message).await;
        assert_eq!(status, 422, "{message}");
        assert_eq!(error_type(&chunk), "invalid_confirm_action");
        assert_eq!(
            chunk.metadata["options"],
            json!(["confirm", "modify", "cancel"])
        );
    }
    let (status, chunk) = reply_with(
        &app,
        "p",
        "CONFIRM_ACTION:confirm",
        json!({"answers": {"a": "b"}}),
    )
    .await;
    assert_eq!(status, 422);
    assert_eq!(error_type(&chunk), "invalid_answer");
    let (status, _) = app.reply("p", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn answers_that_are_not_an_object_are_a_bad_request() {
    let app = spawn_app().await;
    let (_stream, _) = open_asked(&app, "o", REGION).await;

    let (status, chunk) = reply_with(
        &app,
        "o",
        "CONFIRM_ACTION:answer",
        json!({"answers": ["eu-west"]}),
    )
    .await;

    assert_eq!(status, 400);
    assert_eq!(error_type(&chunk), "invalid_request");
    assert!(app
        .manager
        .is_paused(&chatgate::session::SessionKey::new(None, "o")));
}

#[tokio::test]
async fn fifty_racing_answers_have_one_winner() {
    let app = spawn_app().await;
    let (mut stream, _) = open_asked(&app, "race", REGION).await;

    let replies = (0..50).map(|i| {
        let message = match i % 3 {
            0 => "CONFIRM_ACTION:answer:eu-west",
            1 => "CONFIRM_ACTION:answer:us-east",
            _ => "CONFIRM_ACTION:skip",
        };
        app.reply("race", message)
    });
    let answered = join_all(replies).await;

    let winners: Vec<&Chunk> = answered
        .iter()
        .filter(|(status, _)| *status == 200)
        .map(|(_, chunk)| chunk)
        .collect();
    assert_eq!(winners.len(), 1, "{answered:?}");
    for (status, chunk) in &answered {
        match status.as_u16() {
            200 => {}
            409 => assert_eq!(error_type(chunk), "already_decided"),
            // Late enough to meet the plan the winner led to: not its options.
            422 => assert_eq!(
                chunk.metadata["options"],
                json!(["confirm", "modify", "cancel"])
            ),
            other => panic!("{other}: {chunk:?}"),
        }
    }
    let shown = stream.until(ChunkType::ConfirmationReceived).await;
    assert_eq!(shown.metadata["action"], winners[0].metadata["action"]);
    assert_eq!(
        shown.metadata.get("answers"),
        winners[0].metadata.get("answers")
    );
}

#[tokio::test]
async fn a_re_attach_replays_the_question() {
    let app = spawn_app().await;
    let (stream, request) = open_asked(&app, "re", REGION).await;
    drop(stream);

    let response = app.reattach("re", 0).await;
    assert_eq!(response.status(), 200);
    let mut again = EventStream::resumed(response, 0);
    let replayed = again.until(ChunkType::InputRequest).await;

    assert_eq!(replayed.questions(), request.questions());
    let (status, _) = app.reply("re", "CONFIRM_ACTION:answer:us-east").await;
    assert_eq!(status, 200);
    let plan = again.until(ChunkType::ConfirmationRequest).await;
    assert_eq!(
        plan.approval().unwrap().tasks[0].description,
        "deploy to us-east"
    );
}

/// An engine of its own: asks one typed question and one closed choice
/// through [`RunContext::ask`], and reports what it heard.
struct TypedEngine;

impl Engine for TypedEngine {
    fn run<'a>(&'a self, ctx: &'a mut RunContext) -> BoxFuture<'a, Result<Completion, RunError>> {
        async move {
            let questions: Vec<Question> = serde_json::from_value(json!([
                {"id": "count", "header": "Count", "question": "How many replicas?",
                 "required": true, "schema": {"type": "integer", "minimum": 1, "maximum": 9}},
                {"id": "color", "question": "Which color?", "allow_other": false,
                 "options": [{"id": "red", "label": "Red"}, {"id": "blue", "label": "Blue"}]},
                {"id": "go", "question": "Go now?", "schema": {"type": "boolean"}}
            ]))
            .expect("questions");
            let answers = ctx
                .ask(Questions {
                    title: "A few details".into(),
                    questions,
                    state: None,
                })
                .await?;
            let text = match answers {
                Answers::Given(given) => Value::Object(given).to_string(),
                Answers::Skipped => "skipped".to_owned(),
            };
            Ok(Completion {
                text,
                metadata: Map::new(),
            })
        }
        .boxed()
    }
}

#[tokio::test]
async fn typed_answers_are_parsed_and_checked_by_their_schema() {
    let app = spawn_app_with_engine(|_| {}, Arc::new(TypedEngine)).await;
    let (mut stream, request) = open_asked(&app, "typed", "hello").await;
    assert_eq!(request.chunk, "A few details");
    let schema = request.questions().unwrap().questions[0].schema.clone();
    assert_eq!(schema.unwrap()["type"], "integer");

    let refused = [
        (json!({"count": "3.5"}), "`count`"),
        (json!({"count": 12}), "`count`"),
        (
            json!({"count": "3", "color": "green"}),
            "`color` expects one of red (Red), blue (Blue)",
        ),
        (json!({"count": 3, "go": "perhaps"}), "`go`"),
    ];
    for (answers, says) in refused {
        let (status, chunk) = reply_with(
            &app,
            "typed",
            "CONFIRM_ACTION:answer",
            json!({ "answers": answers }),
        )
        .await;
        assert_eq!(status, 422, "{answers}: {chunk:?}");
        assert_eq!(error_type(&chunk), "invalid_answer");
        assert!(chunk.chunk.contains(says), "{answers}: {}", chunk.chunk);
    }

    let answers = json!({"answers": {"count": " 3 ", "color": "BLUE", "go": "yes"}});
    let (status, ack) = reply_with(&app, "typed", "CONFIRM_ACTION:answer", answers).await;
    let last = stream.finish().await;

    assert_eq!(status, 200, "{ack:?}");
    let expected = json!({"count": 3, "color": "Blue", "go": true});
    assert_eq!(ack.metadata["answers"], expected);
    assert_eq!(
        serde_json::from_str::<Value>(&last.chunk).unwrap(),
        expected
    );
}

#[tokio::test]
async fn an_engine_hears_a_skip_as_skipped() {
    let app = spawn_app_with_engine(|_| {}, Arc::new(TypedEngine)).await;
    let (mut stream, _) = open_asked(&app, "sk", "hello").await;

    let (status, _) = app.reply("sk", "CONFIRM_ACTION:skip").await;
    let last = stream.finish().await;

    assert_eq!(status, 200);
    assert_eq!(last.chunk, "skipped");
}

#[tokio::test]
async fn questions_and_answers_are_audited_before_the_run_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let path = audit.clone();
    let app = spawn_app_with(move |s| s.tooling.audit_log = Some(path)).await;
    let (mut stream, request) = open_asked(&app, "aud", REGION).await;

    app.reply("aud", "CONFIRM_ACTION:answer:us-east").await;
    stream.until(ChunkType::ConfirmationRequest).await;
    app.reply("aud", "CONFIRM_ACTION:confirm").await;
    stream.finish().await;

    let records: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let events: Vec<&str> = records
        .iter()
        .map(|r| r["event"].as_str().unwrap())
        .collect();
    assert_eq!(events[..4], ["asked", "answered", "proposed", "decided"]);
    assert_eq!(records[0]["confirmation_id"], confirmation_id(&request));
    assert_eq!(records[0]["questions"][0]["id"], "region");
    assert_eq!(records[0]["title"], "which region?");
    assert_eq!(records[1]["action"], "answer");
    assert_eq!(records[1]["answers"], json!({"region": "us-east"}));
    assert!(records[1]["client"]
        .as_str()
        .unwrap()
        .starts_with("127.0.0.1"));
}

#[tokio::test]
async fn pauses_are_counted_by_kind_and_outcome() {
    let app = spawn_app().await;
    let (mut stream, _) = open_asked(&app, "met", REGION).await;
    app.reply("met", "CONFIRM_ACTION:answer:eu-west").await;
    stream.until(ChunkType::ConfirmationRequest).await;
    app.reply("met", "CONFIRM_ACTION:cancel").await;
    stream.finish().await;

    let (_, text) = app.get("/metrics").await;

    assert!(
        text.contains(r#"chatgate_pauses_total{kind="question",outcome="answer"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"chatgate_pauses_total{kind="approval",outcome="cancel"} 1"#));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_pause_survives_kill_9_and_is_answered_after_the_restart() {
    let dir = Dir::new();
    let audit = dir.path("audit.jsonl").display().to_string();
    let mut first = durable::start(&dir, &["--audit-log", &audit]);
    let opened = durable::post(
        &durable::stream_url(&first),
        json!({"message": REGION, "session_id": "k9q"}),
        None,
    )
    .await;
    let raw = durable::read_raw(opened, Some("input_request")).await;
    let request = durable::chunks(&raw).pop().unwrap();
    assert_eq!(request.chunk_type, ChunkType::InputRequest);

    first.child.kill().unwrap(); // SIGKILL: no shutdown at all
    first.child.wait().unwrap();
    let second = durable::start(&dir, &["--audit-log", &audit]);
    let url = durable::stream_url(&second);
    let back = durable::post(&url, json!({"session_id": "k9q"}), Some(0)).await;
    assert_eq!(back.status(), 200);
    let rest = tokio::spawn(durable::read_raw(back, Some("confirmation_request")));
    let (status, ack) = durable::reply(&url, "k9q", "CONFIRM_ACTION:answer:us-east").await;
    let after = durable::chunks(&rest.await.unwrap());

    assert_eq!(status, 200, "{ack:?}");
    assert_eq!(
        ack.metadata["confirmation_id"],
        request.metadata["confirmation_id"]
    );
    assert_eq!(after[0].chunk_type, ChunkType::InputRequest, "replayed");
    let plan = after.last().unwrap();
    assert_eq!(plan.chunk_type, ChunkType::ConfirmationRequest);
    assert_eq!(
        plan.approval().unwrap().tasks[0].description,
        "deploy to us-east"
    );
    let (status, _) = durable::reply(&url, "k9q", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    let (events, stored) = durable::ended_trail(&dir.path("audit.jsonl"), "k9q").await;
    assert_eq!(
        events,
        ["asked", "answered", "proposed", "decided", "ended"],
        "one trail across both processes"
    );
    assert_eq!(stored.len(), 1, "{stored:?}");
}
