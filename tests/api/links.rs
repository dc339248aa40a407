//! Decision links (`--public-url` with `--link-secret`) over real sockets:
//! one link per person who may decide, in the `interaction.requested`
//! event; a GET decides nothing; a POST decides once, as the link's label
//! (a quorum counts people, self-approval holds); a pause already decided
//! says by whom; forged, altered, expired and other-secret tokens are 404.

use chatgate::notify::links::{Links, Token};
use chatgate::protocol::ChunkType;
use secrecy::SecretString;
use serde_json::{json, Value};

use crate::approvers::{inbox, paused, KEYS};
use crate::helpers::TestApp;
use crate::tools::{app_with_tools, Workdir};
use crate::webhooks::Receiver;

const SECRET: &str = "a-link-secret-that-is-long-enough-0123";
const PUBLIC: &str = "https://gate.example";

/// `deploy` (high risk) needs two approvals.
const TOOLS: &str = r#"
[[tool]]
name = "deploy"
description = "Deploy to production"
risk = "high"
approvals = 2
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

async fn app(dir: &Workdir, receiver: &Receiver) -> TestApp {
    app_with(dir, receiver, TOOLS).await
}

/// A server with links, keys and webhooks to `receiver`, and `tools`.
pub(crate) async fn app_with(dir: &Workdir, receiver: &Receiver, tools: &str) -> TestApp {
    let keys = dir.path("keys.txt");
    std::fs::write(&keys, KEYS).unwrap();
    let hook = crate::webhooks::hooked(receiver);
    app_with_tools(dir, tools, move |s| {
        hook(s);
        s.notify.public_url = Some(PUBLIC.to_owned());
        s.notify.link_secret = Some(SecretString::from(SECRET.to_owned()));
        s.server.api_keys_file = Some(keys);
    })
    .await
}

/// The links of the `interaction.requested` event of pause `id`: label to
/// URL on `app`.
pub(crate) async fn links_of(
    receiver: &Receiver,
    app: &TestApp,
    id: &str,
) -> Vec<(String, String)> {
    let mut n = 1;
    let requested = loop {
        let seen = receiver.wait_for(n).await;
        let found = seen
            .into_iter()
            .find(|d| d.event == "interaction.requested" && d.body["confirmation_id"] == id);
        match found {
            Some(found) => break found,
            None => n += 1,
        }
    };
    requested.body["links"]
        .as_array()
        .expect("links")
        .iter()
        .map(|link| {
            let url = link["url"].as_str().unwrap().replace(PUBLIC, &app.address);
            (link["label"].as_str().unwrap().to_owned(), url)
        })
        .collect()
}

pub(crate) fn link<'a>(links: &'a [(String, String)], label: &str) -> &'a str {
    &links.iter().find(|(l, _)| l == label).expect(label).1
}

async fn get(app: &TestApp, url: &str) -> (u16, String, reqwest::header::HeaderMap) {
    let response = app.client.get(url).send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    (status, response.text().await.unwrap(), headers)
}

pub(crate) async fn post(app: &TestApp, url: &str, form: &[(&str, &str)]) -> (u16, String) {
    let response = app.client.post(url).form(form).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_is_decided_by_two_links_each_once_and_a_get_decides_nothing() {
    let receiver = Receiver::start().await;
    let dir = Workdir::new();
    let app = app(&dir, &receiver).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "lk", "deploy web").await;
    let links = links_of(&receiver, &app, &id).await;
    let labels: Vec<&str> = links.iter().map(|(l, _)| l.as_str()).collect();
    // The requester, then every approver whose scope takes a high-risk
    // pause of ci-bot in (not junior: low risk only).
    assert_eq!(labels, ["ci-bot", "lead-1", "lead-2", "ci-watch"]);

    // A GET shows the pause and decides nothing.
    let (status, page, headers) = get(&app, link(&links, "lead-1")).await;
    assert_eq!(status, 200);
    assert!(page.contains("deploy web"), "{page}");
    assert!(page.contains("You decide as <b>lead-1</b>"), "{page}");
    assert!(
        !page.contains("Approve only this"),
        "a quorum counts the plan: no task is decided alone"
    );
    let csp = headers["content-security-policy"].to_str().unwrap();
    assert!(csp.starts_with("default-src 'none'"), "{csp}");
    assert_eq!(
        inbox(&app, "lead-key-000001").await.len(),
        1,
        "still pending"
    );

    // The requester's own link may not approve a quorum pause.
    let (status, page) = post(&app, link(&links, "ci-bot"), &[("action", "confirm")]).await;
    assert_eq!(status, 403, "{page}");
    assert!(page.contains("may not approve"), "{page}");

    let (status, page) = post(&app, link(&links, "lead-1"), &[("action", "confirm")]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("1 of 2 approvals, as lead-1"), "{page}");
    let (status, page) = post(&app, link(&links, "lead-1"), &[("action", "confirm")]).await;
    assert_eq!(
        status, 409,
        "the same person twice counts once, told as the API tells it: {page}"
    );
    assert!(page.contains("You approved it already"), "{page}");
    let (status, page) = post(&app, link(&links, "lead-2"), &[("action", "confirm")]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Confirmed"), "{page}");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);

    // A link past its pause's decision: who decided, nothing more.
    let (status, page) = post(&app, link(&links, "ci-watch"), &[("action", "cancel")]).await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("Already decided"), "{page}");
    let (status, page, _) = get(&app, link(&links, "lead-1")).await;
    assert_eq!(status, 409, "{page}");
    assert!(page.contains("confirm</b> by <b>lead-2"), "{page}");
    // Its webhook is on its way (the sender runs on its own threads).
    let decided = || -> Vec<Value> {
        receiver
            .seen()
            .into_iter()
            .filter(|d| d.event == "interaction.decided")
            .map(|d| d.body)
            .collect()
    };
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    while decided().is_empty() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let decided = decided();
    assert_eq!(decided.len(), 1);
    assert_eq!(
        decided[0]["data"]["approved_by"],
        json!(["lead-1", "lead-2"])
    );
    // The audit log names who decided through each link.
    let audit = dir.audit();
    let approved: Vec<&Value> = audit.iter().filter(|r| r["event"] == "approved").collect();
    assert_eq!(approved.len(), 1);
    assert_eq!(approved[0]["key"], "lead-1");
    let last = audit
        .iter()
        .find(|r| r["event"] == "decided")
        .expect("decided");
    assert_eq!(last["key"], "lead-2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_rejects_one_task_and_a_cancel_link_ends_the_run() {
    let receiver = Receiver::start().await;
    let dir = Workdir::new();
    let app = app(&dir, &receiver).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "rj", "note one; note two").await;
    let links = links_of(&receiver, &app, &id).await;
    let (status, page) = post(
        &app,
        link(&links, "ci-bot"),
        &[("action", "confirm"), ("reject", "1")],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note two"], "task 1 was rejected on the page");

    let (mut stream, id) = paused(&app, "agent-key-000001", "cx", "note three").await;
    let links = links_of(&receiver, &app, &id).await;
    let (status, _) = post(&app, link(&links, "lead-1"), &[("action", "cancel")]).await;
    assert_eq!(status, 200);
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_decides_task_by_task_and_the_last_one_confirms_the_plan() {
    let receiver = Receiver::start().await;
    let dir = Workdir::new();
    let app = app(&dir, &receiver).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "tt", "note one; note two").await;
    let links = links_of(&receiver, &app, &id).await;
    let url = link(&links, "ci-bot");
    let (status, page, _) = get(&app, url).await;
    assert_eq!(status, 200);
    assert_eq!(page.matches("Approve only this").count(), 2, "{page}");

    let (status, page) = post(&app, url, &[("task", "reject:1")]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Still pending: task(s) 2"), "{page}");
    let (_, page, _) = get(&app, url).await;
    assert_eq!(page.matches("Approve only this").count(), 1, "{page}");
    assert!(page.contains("<b>rejected</b>"), "{page}");
    assert!(
        dir.notes().is_empty(),
        "nothing runs before the pause is decided"
    );

    let (status, page) = post(&app, url, &[("task", "approve:2")]).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert_eq!(dir.notes(), ["note two"], "task 1 was rejected on its own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_altered_expired_and_foreign_tokens_are_404_and_counted() {
    let receiver = Receiver::start().await;
    let dir = Workdir::new();
    let app = app(&dir, &receiver).await;
    let (_stream, id) = paused(&app, "agent-key-000001", "fg", "deploy web").await;
    let links = links_of(&receiver, &app, &id).await;
    let good = link(&links, "lead-1").to_owned();
    let mine = Links::new(PUBLIC, SecretString::from(SECRET.to_owned()), vec![]).unwrap();
    let theirs = Links::new(
        PUBLIC,
        SecretString::from("another-secret-entirely-0123456789".to_owned()),
        vec![],
    )
    .unwrap();
    let token = |label: &str, expires_at_ms: u64| Token {
        confirmation_id: id.clone(),
        label: label.to_owned(),
        expires_at_ms,
    };
    let local = |url: String| url.replace(PUBLIC, &app.address);
    let bad = [
        good.replace("lead-1", "lead-2"),
        format!("{good}0"),
        format!(
            "{}/d/{id}.lead-1.99999999999999.00000000000000000000000000000000",
            app.address
        ),
        local(mine.url(&token("lead-1", 1))),
        local(theirs.url(&token("lead-1", u64::MAX / 2))),
    ];
    let before = app.metric("chatgate_link_refusals_total").await;
    for url in &bad {
        let (status, page, _) = get(&app, url).await;
        assert_eq!(status, 404, "{url}");
        assert!(!page.contains("lead"), "no detail: {page}");
        let (status, _) = post(&app, url, &[("action", "confirm")]).await;
        assert_eq!(status, 404, "{url}");
    }
    let after = app.metric("chatgate_link_refusals_total").await;
    assert_eq!(after - before, 2 * bad.len() as i64);
    assert_eq!(
        inbox(&app, "lead-key-000001").await[0]["approvals"],
        json!([])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_question_is_answered_through_its_link_and_a_bad_answer_decides_nothing() {
    let receiver = Receiver::start().await;
    let dir = Workdir::new();
    let app = app(&dir, &receiver).await;
    let body = json!({"message": "ask region: which region? eu-west | us-east; deploy to {region}",
                      "session_id": "qa"});
    let response = crate::approvers::post(&app, "agent-key-000001", body).await;
    let mut stream = crate::helpers::EventStream::new(response);
    let asked = stream.until(ChunkType::InputRequest).await;
    let id = asked.questions().unwrap().confirmation_id.clone();
    let links = links_of(&receiver, &app, &id).await;

    let (status, page, _) = get(&app, link(&links, "lead-1")).await;
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("name=\"a.region\" value=\"eu-west\""),
        "{page}"
    );
    let (status, page) = post(&app, link(&links, "lead-1"), &[("action", "answer")]).await;
    assert_eq!(status, 403, "a required question unanswered: {page}");
    let (status, page) = post(
        &app,
        link(&links, "lead-1"),
        &[("action", "answer"), ("a.region", "eu-west")],
    )
    .await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Answered"), "{page}");
    let plan = stream.until(ChunkType::ConfirmationRequest).await;
    assert_eq!(
        plan.approval().unwrap().tasks[0].description,
        "deploy to eu-west"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_escalation_s_event_carries_links_for_the_group_it_widens_to() {
    let receiver = Receiver::start().await;
    let dir = Workdir::new();
    let keys = dir.path("keys.txt");
    std::fs::write(
        &keys,
        "agent-key-000001 label=ci-bot\n\
         approver lead-key-000001 label=lead-1 groups=leads\n\
         approver oncall-key-0001 label=oncall-1 groups=oncall\n",
    )
    .unwrap();
    let tools = r#"
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
    let hook = crate::webhooks::hooked(&receiver);
    let app = app_with_tools(&dir, tools, move |s| {
        hook(s);
        s.notify.public_url = Some(PUBLIC.to_owned());
        s.notify.link_secret = Some(SecretString::from(SECRET.to_owned()));
        s.server.api_keys_file = Some(keys);
    })
    .await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "esc", "restart api").await;
    let asked = links_of(&receiver, &app, &id).await;
    let labels: Vec<&str> = asked.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(labels, ["ci-bot", "lead-1"], "oncall-1 may not decide yet");

    let mut seen = Vec::new();
    for _ in 0..400 {
        seen = receiver.wait_for(2).await;
        if seen.iter().any(|d| d.event == "interaction.escalated") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let escalated = seen
        .iter()
        .find(|d| d.event == "interaction.escalated")
        .unwrap();
    let links: Vec<(String, String)> = escalated.body["links"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            let url = l["url"].as_str().unwrap().replace(PUBLIC, &app.address);
            (l["label"].as_str().unwrap().to_owned(), url)
        })
        .collect();
    let labels: Vec<&str> = links.iter().map(|(l, _)| l.as_str()).collect();
    assert_eq!(labels, ["lead-1", "oncall-1"]);
    let (status, page) = post(&app, link(&links, "oncall-1"), &[("action", "confirm")]).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_never_reaches_the_access_log_however_its_path_is_spelt() {
    let server = crate::common::start_binary(&["--link-secret", SECRET, "--public-url", PUBLIC]);
    let secret_part = "lead-1.99999999999999.0123456789abcdef0123456789abcdef";
    let token = format!("5d0c0000-0000-4000-8000-000000000001.{secret_part}");
    let paths = [
        format!("/d/{token}"),
        format!("//d/{token}"),
        format!("/%64/{token}"),
        format!("/%64/{}", token.replace('.', "%2E")),
    ];
    let client = reqwest::Client::new();
    for path in &paths {
        let url = format!("{}{path}", server.url);
        client.get(url).send().await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    let lines = loop {
        let lines: Vec<String> = server
            .logs
            .lock()
            .unwrap()
            .iter()
            .filter(|line| line.contains("\"GET "))
            .cloned()
            .collect();
        if lines.len() >= paths.len() || tokio::time::Instant::now() > deadline {
            break lines;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    };
    assert_eq!(lines.len(), paths.len(), "{lines:?}");
    for line in &lines {
        assert!(line.contains("<token>"), "{line}");
        assert!(
            !line.contains("lead-1"),
            "the token reached the log: {line}"
        );
        assert!(!line.contains("0123456789abcdef"), "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_counts_an_approval_of_one_task_towards_that_task_s_quorum() {
    let receiver = Receiver::start().await;
    let dir = Workdir::new();
    let app = app(&dir, &receiver).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "tq", "deploy web; deploy api").await;
    let links = links_of(&receiver, &app, &id).await;
    let (status, page, _) = get(&app, link(&links, "lead-1")).await;
    assert_eq!(status, 200);
    assert_eq!(page.matches("Approve only this").count(), 2, "{page}");

    let (status, page) = post(&app, link(&links, "lead-1"), &[("task", "approve:1")]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("task 1: 1 of 2 approvals (lead-1)"), "{page}");
    let (status, page) = post(&app, link(&links, "lead-2"), &[("task", "approve:1")]).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("task 1: approve"), "{page}");
    assert!(page.contains("Still pending: task(s) 2"), "{page}");

    // The whole plan needs the second task's two approvals too.
    let (status, _) = post(&app, link(&links, "lead-1"), &[("action", "confirm")]).await;
    assert_eq!(status, 200);
    let (status, _) = post(&app, link(&links, "lead-2"), &[("action", "confirm")]).await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
}
