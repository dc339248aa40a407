//! Slack over real sockets, with a local receiver that speaks Slack's
//! formats: the incoming webhook gets a Block Kit message per approval
//! pause; signed `block_actions` requests (and forged, stale and replayed
//! ones) press its buttons; the presser is mapped to an approver by
//! `slack=`; the message is updated through `response_url`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use chatgate::protocol::ChunkType;
use hmac::{Hmac, Mac};
use secrecy::SecretString;
use serde_json::{json, Value};
use sha2::Sha256;

use crate::approvers::paused;
use crate::helpers::TestApp;
use crate::tools::{app_with_tools, Workdir};

const SIGNING: &str = "8f742231b10e8888abcd99yyyzzz85a5";

const KEYS: &str = "\
agent-key-000001 label=ci-bot
approver lead-key-000001 label=lead-1 groups=leads slack=U0LEAD1
approver lead-key-000002 label=lead-2 groups=leads slack=U0LEAD2
approver low-key-0000003 label=junior max_risk=low slack=U0JUNIOR
";

const TOOLS: &str = r#"
[[tool]]
name = "deploy"
description = "Deploy to production"
risk = "high"
approvals = 2
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

/// What the local Slack was sent: the incoming webhook's messages and the
/// `response_url` updates.
#[derive(Clone, Default)]
struct Slack {
    messages: Arc<Mutex<Vec<Value>>>,
    responses: Arc<Mutex<Vec<Value>>>,
    url: String,
}

impl Slack {
    async fn start() -> Slack {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let slack = Slack {
            url: format!("http://127.0.0.1:{port}"),
            ..Slack::default()
        };
        let seen = slack.clone();
        let server = HttpServer::new(move || {
            let seen = seen.clone();
            let also = seen.clone();
            App::new()
                .route(
                    "/services/T0/B0/X",
                    web::post().to(move |body: web::Json<Value>| {
                        let seen = seen.clone();
                        async move {
                            seen.messages.lock().unwrap().push(body.into_inner());
                            HttpResponse::Ok().body("ok")
                        }
                    }),
                )
                .route(
                    "/response",
                    web::post().to(move |body: web::Json<Value>| {
                        let seen = also.clone();
                        async move {
                            seen.responses.lock().unwrap().push(body.into_inner());
                            HttpResponse::Ok().finish()
                        }
                    }),
                )
        })
        .workers(1)
        .disable_signals()
        .listen(listener)
        .unwrap()
        .run();
        tokio::spawn(server);
        slack
    }

    async fn wait(list: &Mutex<Vec<Value>>, n: usize) -> Vec<Value> {
        for _ in 0..500 {
            if list.lock().unwrap().len() >= n {
                return list.lock().unwrap().clone();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("{} of {n} arrived", list.lock().unwrap().len());
    }
}

async fn app(dir: &Workdir, slack: &Slack) -> TestApp {
    app_with(dir, slack, TOOLS).await
}

async fn app_with(dir: &Workdir, slack: &Slack, tools: &str) -> TestApp {
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    let hook = format!("{}/services/T0/B0/X", slack.url);
    app_with_tools(dir, tools, move |s| {
        s.notify.public_url = Some("https://gate.example".to_owned());
        s.notify.link_secret = Some(SecretString::from(
            "a-link-secret-for-slack-tests-000001".to_owned(),
        ));
        s.notify.slack_webhook = Some(hook);
        s.notify.slack_signing_secret = Some(SecretString::from(SIGNING.to_owned()));
        s.server.api_keys_file = Some(keys);
    })
    .await
}

/// A `block_actions` request body: `user` pressed `button` carrying `value`
/// on the first message the local Slack got (Slack sends the message with
/// its blocks along).
fn press(slack: &Slack, user: &str, button: &str, value: &str) -> String {
    let message = slack.messages.lock().unwrap().first().cloned();
    let payload = json!({
        "type": "block_actions",
        "user": {"id": user, "username": user.to_lowercase()},
        "actions": [{"action_id": button, "block_id": "chatgate_decision", "value": value,
                     "type": "button"}],
        "message": message,
        "response_url": format!("{}/response", slack.url),
    });
    serde_urlencoded::to_string([("payload", payload.to_string())]).unwrap()
}

fn signature(timestamp: u64, body: &str) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(SIGNING.as_bytes()).unwrap();
    mac.update(format!("v0:{timestamp}:{body}").as_bytes());
    format!("v0={}", hex::encode(mac.finalize().into_bytes()))
}

async fn send(app: &TestApp, body: &str, timestamp: u64, signature: &str) -> u16 {
    app.client
        .post(format!("{}/api/v1/slack/actions", app.address))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("x-slack-request-timestamp", timestamp.to_string())
        .header("x-slack-signature", signature)
        .body(body.to_owned())
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

fn now() -> u64 {
    chatgate::clock::now_secs()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slack_message_s_buttons_decide_as_the_mapped_approvers() {
    let slack = Slack::start().await;
    let dir = Workdir::new();
    let app = app(&dir, &slack).await;
    let (mut stream, _) = paused(&app, "agent-key-000001", "sl", "deploy web").await;

    // The message: a header, the summary, the task, the expiry, two buttons.
    let message = Slack::wait(&slack.messages, 1).await.remove(0);
    let blocks = message["blocks"].as_array().unwrap();
    assert_eq!(blocks[0]["type"], "header");
    let task = blocks[2]["text"]["text"].as_str().unwrap();
    assert!(task.contains("*1. deploy* (high risk)"), "{task}");
    assert!(task.contains("deploy web"), "{task}");
    let actions = blocks.last().unwrap();
    assert_eq!(actions["type"], "actions");
    let (approve, reject) = (&actions["elements"][0], &actions["elements"][1]);
    assert_eq!(
        (approve["action_id"].as_str(), reject["action_id"].as_str()),
        (Some("approve"), Some("reject"))
    );
    let token = approve["value"].as_str().unwrap().to_owned();

    // Forged, stale: 401, nothing decided.
    let body = press(&slack, "U0LEAD1", "approve", &token);
    assert_eq!(send(&app, &body, now(), "v0=00").await, 401);
    let stale = now() - 301;
    assert_eq!(
        send(&app, &body, stale, &signature(stale, &body)).await,
        401
    );
    assert_eq!(
        send(&app, &body, now(), &signature(now() - 1, &body)).await,
        401
    );

    // An unknown presser is told, only them.
    let nobody = press(&slack, "U0NOBODY", "approve", &token);
    let at = now();
    assert_eq!(send(&app, &nobody, at, &signature(at, &nobody)).await, 200);
    let told = Slack::wait(&slack.responses, 1).await.remove(0);
    assert_eq!(told["response_type"], "ephemeral");
    assert!(
        told["text"].as_str().unwrap().contains("not an approver"),
        "{told}"
    );

    // lead-1 approves (1 of 2): the message keeps its buttons and shows the
    // progress; the same request again counts once, told to lead-1 alone.
    let at = now();
    assert_eq!(send(&app, &body, at, &signature(at, &body)).await, 200);
    let update = Slack::wait(&slack.responses, 2).await.remove(1);
    assert_eq!(update["replace_original"], true);
    assert_eq!(update["text"], "Approval recorded: 1 of 2 (lead-1)");
    let kept = update["blocks"].as_array().unwrap();
    assert_eq!(kept.last().unwrap()["type"], "actions", "the buttons stay");
    assert!(
        kept.iter().any(|b| b["block_id"] == "chatgate_progress"
            && b["elements"][0]["text"] == "Approval recorded: 1 of 2 (lead-1)"),
        "{update}"
    );
    assert_eq!(send(&app, &body, at, &signature(at, &body)).await, 200);
    let again = Slack::wait(&slack.responses, 3).await.remove(2);
    assert_eq!(again["response_type"], "ephemeral", "{again}");
    assert_eq!(again["replace_original"], false);
    assert!(
        again["text"]
            .as_str()
            .unwrap()
            .starts_with("Nothing was decided"),
        "{again}"
    );

    // junior may not decide a high-risk pause: told alone, buttons kept.
    let junior = press(&slack, "U0JUNIOR", "reject", &token);
    let at = now();
    assert_eq!(send(&app, &junior, at, &signature(at, &junior)).await, 200);
    let refused = Slack::wait(&slack.responses, 4).await.remove(3);
    assert_eq!(refused["response_type"], "ephemeral", "{refused}");
    assert_eq!(refused["replace_original"], false);
    assert!(
        refused["text"].as_str().unwrap().contains("junior"),
        "{refused}"
    );

    // lead-2 approves: the pause is decided, the run completes.
    let second = press(&slack, "U0LEAD2", "approve", &token);
    let at = now();
    assert_eq!(send(&app, &second, at, &signature(at, &second)).await, 200);
    let update = Slack::wait(&slack.responses, 5).await.remove(4);
    assert_eq!(update["text"], "Approved by lead-1, lead-2");
    assert_eq!(update["replace_original"], true);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);

    // A press after the decision: who decided first.
    let late = press(&slack, "U0LEAD1", "reject", &token);
    let at = now();
    assert_eq!(send(&app, &late, at, &signature(at, &late)).await, 200);
    let update = Slack::wait(&slack.responses, 6).await.remove(5);
    assert_eq!(update["text"], "Already decided: confirm by lead-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reject_button_cancels_the_run_and_without_a_signing_secret_there_is_no_endpoint() {
    let slack = Slack::start().await;
    let dir = Workdir::new();
    let app = app(&dir, &slack).await;
    let (mut stream, _) = paused(&app, "agent-key-000001", "rj", "deploy web").await;
    let message = Slack::wait(&slack.messages, 1).await.remove(0);
    let token = message["blocks"].as_array().unwrap().last().unwrap()["elements"][1]["value"]
        .as_str()
        .unwrap()
        .to_owned();
    let body = press(&slack, "U0LEAD1", "reject", &token);
    let at = now();
    assert_eq!(send(&app, &body, at, &signature(at, &body)).await, 200);
    let update = Slack::wait(&slack.responses, 1).await.remove(0);
    assert_eq!(update["text"], "Rejected by lead-1");
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Cancelled);

    let plain = crate::helpers::spawn_app().await;
    let status = plain
        .client
        .post(format!("{}/api/v1/slack/actions", plain.address))
        .body(body)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plan_s_task_buttons_decide_each_task_alone() {
    let slack = Slack::start().await;
    let dir = Workdir::new();
    let app = app(&dir, &slack).await;
    let (mut stream, _) = paused(&app, "agent-key-000001", "each", "note a; note b").await;
    let message = Slack::wait(&slack.messages, 1).await.remove(0);
    let blocks = message["blocks"].as_array().unwrap();
    let first = blocks
        .iter()
        .find(|b| b["block_id"] == "chatgate_task_1")
        .expect("task 1's buttons");
    assert_eq!(first["elements"][0]["action_id"], "approve_task_1");
    let token = first["elements"][0]["value"].as_str().unwrap().to_owned();

    // junior approves task 1 alone: it runs, and the message keeps the
    // buttons with where the plan stands.
    let body = press(&slack, "U0JUNIOR", "approve_task_1", &token);
    let at = now();
    assert_eq!(send(&app, &body, at, &signature(at, &body)).await, 200);
    let update = Slack::wait(&slack.responses, 1).await.remove(0);
    assert_eq!(update["replace_original"], true, "{update}");
    assert_eq!(
        update["text"],
        "task 1 approved by junior; still pending: 2"
    );
    assert!(update["blocks"]
        .as_array()
        .unwrap()
        .iter()
        .any(|b| b["block_id"] == "chatgate_task_2"));
    crate::as_decided::waiting(&mut stream).await;
    assert_eq!(dir.notes(), ["note a"]);

    // lead-1 rejects task 2, the last: the pause is decided.
    let body = press(&slack, "U0LEAD1", "reject_task_2", &token);
    let at = now();
    assert_eq!(send(&app, &body, at, &signature(at, &body)).await, 200);
    let update = Slack::wait(&slack.responses, 2).await.remove(1);
    assert_eq!(update["text"], "Approved by junior, lead-1", "{update}");
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(last.metadata["tasks_rejected"], 1);
    assert_eq!(dir.notes(), ["note a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_shows_the_preview_and_its_approve_names_the_digest_it_showed() {
    let slack = Slack::start().await;
    let dir = Workdir::new();
    let tools = format!(
        "{TOOLS}\n[[tool]]\nname = \"peek\"\ndescription = \"Peeks\"\nrisk = \"low\"\n\
         command = [\"true\"]\npreview = [\"sh\", \"-c\", \"echo would touch 2 files\"]\n\
         parameters = {{ type = \"object\" }}\n"
    );
    let app = app_with(&dir, &slack, &tools).await;
    let (mut stream, _) = paused(&app, "agent-key-000001", "pk", "peek at it").await;
    let message = Slack::wait(&slack.messages, 1).await.remove(0);
    let blocks = message["blocks"].as_array().unwrap();
    assert!(blocks[2]["text"]["text"]
        .as_str()
        .unwrap()
        .contains("Preview\n```would touch 2 files"));
    let actions = &blocks.last().unwrap()["elements"];
    let value = actions[0]["value"].as_str().unwrap().to_owned();
    let (token, digest) = value
        .split_once(' ')
        .expect("Approve carries the digest it showed");
    assert!(digest.starts_with("1:"), "{value}");

    // A digest it did not show: refused, the pause waits on.
    let body = press(
        &slack,
        "U0JUNIOR",
        "approve",
        &format!("{token} 1:{}", "0".repeat(64)),
    );
    let at = now();
    assert_eq!(send(&app, &body, at, &signature(at, &body)).await, 200);
    let refused = Slack::wait(&slack.responses, 1).await.remove(0);
    assert!(
        refused.to_string().contains("is not its preview now"),
        "{refused}"
    );

    let body = press(&slack, "U0JUNIOR", "approve", &value);
    let at = now();
    assert_eq!(send(&app, &body, at, &signature(at, &body)).await, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}
