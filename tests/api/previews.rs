//! Effect previews bound to the approval (#43), over real sockets: a
//! command tool's preview shows what its call would change, on the card
//! and in the inbox; an approval names the digest it saw (a stale one is
//! 409); `recheck` stops a call whose effect changed and asks again; an
//! edit of a previewed call is asked again, never run unseen.

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::helpers::{confirmation_id, error_type, one_chunk, EventStream, TestApp};
use crate::tools::{app_with_tools, outputs, Workdir};

/// `put` replaces target.txt with its arguments (JSON); its preview shows
/// what target.txt holds now. `extra_keys` go into its table.
fn put(dir: &Workdir, extra_keys: &str) -> String {
    let target = dir.path("target.txt");
    format!(
        r#"
[[tool]]
name = "put"
description = "Replaces target.txt"
risk = "medium"
command = ["sh", "-c", "cat > \"$0\"", "{target}"]
preview = ["sh", "-c", "cat \"$0\"", "{target}"]
parameters = {{ type = "object", properties = {{ step = {{ type = "string" }} }} }}
{extra_keys}
"#,
        target = target.display(),
    )
}

fn target(dir: &Workdir) -> String {
    std::fs::read_to_string(dir.path("target.txt")).unwrap_or_default()
}

/// The digest a preview is named by, computed here by hand: SHA-256 of
/// `{"args":...,"body":...,"tool":...}` with keys sorted and no spaces.
fn digest(tool: &str, step: &str, body: &str) -> String {
    let text = format!(
        r#"{{"args":{{"step":{}}},"body":{},"tool":{}}}"#,
        json!(step),
        json!(body),
        json!(tool)
    );
    hex::encode(Sha256::digest(text.as_bytes()))
}

async fn confirm_seen(app: &TestApp, session: &str, id: &str, digest: &str) -> (u16, String) {
    let response = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:confirm",
            "session_id": session,
            "confirmation_id": id,
            "decisions": [{"index": 1, "decision": "approve", "preview_digest": digest}],
        }))
        .await;
    let (status, chunk) = one_chunk(response).await;
    let kind = if chunk.chunk_type == ChunkType::Error {
        error_type(&chunk).to_owned()
    } else {
        String::new()
    };
    (status.as_u16(), kind)
}

fn task_preview(request: &chatgate::protocol::Chunk) -> Value {
    serde_json::to_value(&request.approval().unwrap().tasks[0].preview).unwrap()
}

#[tokio::test]
async fn the_card_and_the_inbox_show_the_preview_and_a_stale_digest_is_refused() {
    let dir = Workdir::new();
    std::fs::write(dir.path("target.txt"), "old content").unwrap();
    let app = app_with_tools(&dir, &put(&dir, ""), |_| {}).await;
    let (mut stream, request) = app.open_paused("p", "put new content").await;
    let id = confirmation_id(&request);
    let seen = digest("put", "put new content", "old content");
    assert_eq!(
        task_preview(&request),
        json!({"ok": true, "body": "old content", "truncated": false, "digest": seen})
    );
    let (status, body) = app.get("/api/v1/interactions").await;
    assert_eq!(status, 200, "{body}");
    let inbox: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        inbox["interactions"][0]["tasks"][0]["preview"]["digest"],
        seen.as_str()
    );
    assert_eq!(
        inbox["interactions"][0]["tasks"][0]["preview"]["body"],
        "old content"
    );

    // A digest the card did not show: 409, nothing kept, nothing ran.
    let other = digest("put", "put new content", "something else");
    assert_eq!(
        confirm_seen(&app, "p", &id, &other).await,
        (409, "preview_stale".to_owned())
    );
    let decide = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:decide", "session_id": "p", "confirmation_id": id,
            "decisions": [{"index": 1, "decision": "approve", "preview_digest": "00"}],
        }))
        .await;
    assert_eq!(decide.status(), 409);
    assert_eq!(target(&dir), "old content");

    // The digest it showed: taken, and the receipt names it.
    assert_eq!(
        confirm_seen(&app, "p", &id, &seen).await,
        (200, String::new())
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert!(target(&dir).contains("put new content"));
    let receipt = outputs(&stream)[0].metadata["receipt"]
        .as_str()
        .unwrap()
        .to_owned();
    let payload = receipt.split('.').nth(1).unwrap();
    use base64::Engine;
    let claims: Value = serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(payload)
            .unwrap(),
    )
    .unwrap();
    assert_eq!(claims["task"]["preview_digest"], seen.as_str());
}

#[tokio::test]
async fn with_recheck_a_changed_effect_stops_the_call_and_asks_again() {
    let dir = Workdir::new();
    std::fs::write(dir.path("target.txt"), "v1").unwrap();
    let app = app_with_tools(&dir, &put(&dir, "recheck = true"), |_| {}).await;
    let (mut stream, first) = app.open_paused("r", "put v2; then rest").await;
    let approved = digest("put", "put v2", "v1");
    assert_eq!(task_preview(&first)["digest"], approved.as_str());

    // Someone else changes the file between the approval and the run.
    std::fs::write(dir.path("target.txt"), "v1 changed by someone").unwrap();
    let (status, _) = app.reply("r", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    let again = stream.until(ChunkType::ConfirmationRequest).await;
    assert_eq!(target(&dir), "v1 changed by someone", "nothing ran");
    let stopped = outputs(&stream)[0].clone();
    let now = digest("put", "put v2", "v1 changed by someone");
    assert_eq!(stopped.metadata["ok"], false);
    assert_eq!(stopped.metadata["skipped"], true);
    assert_eq!(stopped.metadata["error_type"], "precondition_changed");
    assert_eq!(stopped.metadata["approved_digest"], approved.as_str());
    assert_eq!(stopped.metadata["current_digest"], now.as_str());
    // The new round shows the task (and the one after it) with its new preview.
    let data = again.approval().unwrap();
    assert_eq!(data.confirmation_round, 2);
    assert_eq!(data.tasks.len(), 2);
    assert_eq!(task_preview(&again)["body"], "v1 changed by someone");
    assert_eq!(task_preview(&again)["digest"], now.as_str());

    let (status, _) = app.reply("r", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    let last = stream.finish().await;
    assert_eq!(last.chunk_type, ChunkType::Completion, "{}", last.chunk);
    assert!(target(&dir).contains("put v2"));
    let changed: Vec<Value> = dir
        .audit()
        .into_iter()
        .filter(|r| r["event"] == "precondition_changed")
        .collect();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0]["approved_digest"], approved.as_str());
    assert_eq!(changed[0]["current_digest"], now.as_str());
    assert_eq!(changed[0]["task"], 1);
}

#[tokio::test]
async fn an_edit_of_a_previewed_call_is_asked_again_with_its_own_preview() {
    let dir = Workdir::new();
    std::fs::write(dir.path("target.txt"), "before").unwrap();
    let app = app_with_tools(&dir, &put(&dir, ""), |_| {}).await;
    let (mut stream, request) = app.open_paused("e", "put first").await;
    let response = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:confirm", "session_id": "e",
            "confirmation_id": confirmation_id(&request),
            "decisions": [{"index": 1, "decision": "edit", "args": {"step": "put second"}}],
        }))
        .await;
    assert_eq!(response.status(), 200);
    let again = stream.until(ChunkType::ConfirmationRequest).await;
    assert_eq!(target(&dir), "before", "the edit did not run unseen");
    let task = &again.approval().unwrap().tasks[0];
    assert_eq!(task.args.as_ref().unwrap()["step"], "put second");
    assert_eq!(
        task_preview(&again)["digest"],
        digest("put", "put second", "before").as_str()
    );

    app.reply("e", "CONFIRM_ACTION:confirm").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert!(target(&dir).contains("put second"));
}

#[tokio::test]
async fn a_preview_is_bounded_in_time_and_size_and_a_failed_one_shows_its_error() {
    let dir = Workdir::new();
    let tools = r#"
[[tool]]
name = "slow"
description = "A preview that never ends"
risk = "low"
command = ["true"]
preview = ["sleep", "30"]
preview_timeout = "300ms"
parameters = { type = "object" }

[[tool]]
name = "big"
description = "A preview of 100 KiB"
risk = "low"
command = ["true"]
preview = ["sh", "-c", "head -c 102400 /dev/zero | tr '\\0' 'x'"]
parameters = { type = "object" }

[[tool]]
name = "broken"
description = "A preview that fails"
risk = "low"
command = ["true"]
preview = ["sh", "-c", "echo no such thing >&2; exit 2"]
parameters = { type = "object" }
"#;
    let app = app_with_tools(&dir, tools, |_| {}).await;
    let (_stream, request) = app.open_paused("b", "slow it; big it; broken it").await;
    let tasks = &request.approval().unwrap().tasks;
    let slow = tasks[0].preview.as_ref().unwrap();
    assert!(!slow.ok);
    // Killed at its own timeout, which its error names.
    assert!(slow.body.contains("timed out after 300ms"), "{}", slow.body);
    let big = tasks[1].preview.as_ref().unwrap();
    assert!(big.ok && big.truncated);
    assert_eq!(big.body.len(), 64 * 1024);
    let broken = tasks[2].preview.as_ref().unwrap();
    assert!(!broken.ok);
    assert!(broken.body.contains("no such thing"), "{}", broken.body);
}

#[tokio::test]
async fn a_tool_without_a_preview_shows_none_and_takes_no_digest() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, "", |_| {}).await;
    let (_stream, request) = app.open_paused("n", "note plain").await;
    assert!(request.approval().unwrap().tasks[0].preview.is_none());
    let raw = serde_json::to_value(request.approval().unwrap()).unwrap();
    assert!(raw["tasks"][0].get("preview").is_none());
    let id = confirmation_id(&request);
    assert_eq!(
        confirm_seen(&app, "n", &id, "abc").await,
        (409, "preview_stale".to_owned())
    );
    let mut stream = EventStream::new(app.reattach("n", 0).await);
    assert_eq!(
        stream
            .until(ChunkType::ConfirmationRequest)
            .await
            .chunk_type,
        ChunkType::ConfirmationRequest
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_page_shows_the_preview_and_its_confirm_names_the_digest_it_showed() {
    let receiver = crate::webhooks::Receiver::start().await;
    let dir = Workdir::new();
    std::fs::write(dir.path("target.txt"), "<b>old</b>").unwrap();
    let app = crate::links::app_with(&dir, &receiver, &put(&dir, "")).await;
    let (mut stream, id) = crate::approvers::paused(&app, "agent-key-000001", "lp", "put x").await;
    let links = crate::links::links_of(&receiver, &app, &id).await;
    let url = crate::links::link(&links, "lead-1");
    let page = app
        .client
        .get(url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let seen = digest("put", "put x", "<b>old</b>");
    assert!(
        page.contains("<pre class=\"preview\">&lt;b&gt;old&lt;/b&gt;</pre>"),
        "{page}"
    );
    assert!(
        page.contains(&format!("name=\"digest.1\" value=\"{seen}\"")),
        "{page}"
    );

    // A form whose digest is not the preview's: refused, nothing taken.
    let (status, refused) = crate::links::post(
        &app,
        url,
        &[("action", "confirm"), ("digest.1", &"0".repeat(64))],
    )
    .await;
    assert!(
        refused.contains("is not its preview now"),
        "{status} {refused}"
    );
    let (status, page) =
        crate::links::post(&app, url, &[("action", "confirm"), ("digest.1", &seen)]).await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    assert!(target(&dir).contains("put x"));
}

#[cfg(feature = "openai")]
#[tokio::test]
async fn an_http_tool_s_preview_is_its_preview_request_with_the_tool_s_headers() {
    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
    let server = HttpServer::new(|| {
        App::new().route(
            "/plan",
            web::post().to(|req: HttpRequest, body: web::Json<Value>| async move {
                let token = req
                    .headers()
                    .get("x-token")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("");
                HttpResponse::Ok().body(format!("would deploy {} ({token})", body["step"]))
            }),
        )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let base = format!("http://{}", server.addrs()[0]);
    tokio::spawn(server.run());
    let dir = Workdir::new();
    let tools = format!(
        "[[tool]]\nname = \"ship\"\ndescription = \"Ships\"\nrisk = \"high\"\nhttp = \"{base}/ship\"\n\
         preview_http = \"{base}/plan\"\nheaders = {{ x-token = \"${{PATH}}\" }}\n\
         parameters = {{ type = \"object\" }}\n"
    );
    let app = app_with_tools(&dir, &tools, |_| {}).await;
    let (_stream, request) = app.open_paused("h", "ship it").await;
    let preview = task_preview(&request);
    assert_eq!(preview["ok"], true);
    let path = std::env::var("PATH").unwrap();
    assert_eq!(
        preview["body"],
        format!("would deploy \"ship it\" ({path})")
    );
}

#[tokio::test]
async fn a_pause_runs_at_most_four_previews_at_once_and_holds_at_most_256_kib_of_them() {
    let dir = Workdir::new();
    let log = dir.path("previews.log");
    let tools = format!(
        r#"
[[tool]]
name = "wide"
description = "A preview that takes a while and logs when it runs"
risk = "low"
command = ["true"]
preview = ["sh", "-c", "echo start >> {log}; sleep 0.3; echo end >> {log}; head -c 65536 /dev/zero | tr '\\0' 'y'"]
parameters = {{ type = "object" }}
"#,
        log = log.display()
    );
    let app = app_with_tools(&dir, &tools, |_| {}).await;
    let steps: Vec<String> = (1..=8).map(|i| format!("wide {i}")).collect();
    let (_stream, request) = app.open_paused("w", &steps.join("; ")).await;

    // In the order they started and ended: never more than four at once.
    let events = std::fs::read_to_string(&log).unwrap();
    let (mut running, mut most) = (0i32, 0i32);
    for event in events.lines() {
        running += if event == "start" { 1 } else { -1 };
        most = most.max(running);
    }
    assert_eq!(events.lines().filter(|e| *e == "start").count(), 8);
    assert!(most <= 4, "{most} previews ran at once");
    // 64 KiB each, 256 KiB for the pause: the tasks after the fourth are cut.
    let tasks = &request.approval().unwrap().tasks;
    let shown: Vec<usize> = tasks
        .iter()
        .map(|t| t.preview.as_ref().unwrap().body.len())
        .collect();
    assert_eq!(shown.iter().sum::<usize>(), 256 * 1024, "{shown:?}");
    assert!(tasks[4..]
        .iter()
        .all(|t| t.preview.as_ref().unwrap().truncated));
}
