//! Signed receipts (#43), over real sockets: a call that runs gets a
//! compact JWS naming exactly that call and who let it run, verifiable with
//! a JOSE library against `GET /.well-known/jwks.json`.

use std::path::{Path, PathBuf};

use chatgate::protocol::ChunkType;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{decode, decode_header, DecodingKey, Validation};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::approvers::{decide, paused};
use crate::helpers::TestApp;
use crate::tools::{app_with_tools, outputs, Workdir};

/// `stamp`: a command tool that appends the receipt it was given
/// (`CHATGATE_RECEIPT`) to `receipts.txt`.
fn stamp(dir: &Workdir, approvals: u8) -> String {
    tool(dir, "stamp", approvals)
}

fn tool(dir: &Workdir, name: &str, approvals: u8) -> String {
    format!(
        r#"
[[tool]]
name = "{name}"
description = "Stamps its receipt"
risk = "{risk}"
approvals = {approvals}
command = ["sh", "-c", "cat >/dev/null; printf '%s\n' \"$CHATGATE_RECEIPT\" >> '{file}'"]
parameters = {{ type = "object", properties = {{ step = {{ type = "string" }} }} }}
"#,
        risk = if approvals > 1 { "high" } else { "low" },
        file = dir.path("receipts.txt").display(),
    )
}

fn stamped(dir: &Workdir) -> Vec<String> {
    std::fs::read_to_string(dir.path("receipts.txt"))
        .unwrap_or_default()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The server's published keys.
async fn jwks(app: &TestApp) -> JwkSet {
    let response = app
        .client
        .get(format!("{}/.well-known/jwks.json", app.address))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/jwk-set+json"
    );
    response.json().await.unwrap()
}

/// `token` verified (EdDSA) against `keys` by `jsonwebtoken`: its claims.
fn verified(keys: &JwkSet, token: &str) -> Value {
    let header = decode_header(token).unwrap();
    assert_eq!(header.alg, jsonwebtoken::Algorithm::EdDSA);
    let kid = header.kid.expect("a kid");
    let jwk = keys.find(&kid).expect("the kid is published");
    let mut validation = Validation::new(jsonwebtoken::Algorithm::EdDSA);
    validation.required_spec_claims.clear();
    validation.validate_exp = false;
    decode::<Value>(token, &DecodingKey::from_jwk(jwk).unwrap(), &validation)
        .expect("the signature verifies")
        .claims
}

/// The digest a receipt names a call by, computed here by hand: SHA-256 of
/// `{"args":...,"tool":...}` with keys sorted and no spaces.
fn args_digest(tool: &str, step: &str) -> String {
    let text = format!(
        r#"{{"args":{{"step":{}}},"tool":{}}}"#,
        json!(step),
        json!(tool)
    );
    hex::encode(Sha256::digest(text.as_bytes()))
}

#[tokio::test]
async fn a_confirmed_command_gets_a_receipt_of_exactly_its_call_that_verifies() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, &stamp(&dir, 1), |_| {}).await;
    let (mut stream, request) = app.open_paused("r-1", "stamp the box; then rest").await;
    let id = request.approval().unwrap().confirmation_id.clone();
    let (status, _) = app.reply("r-1", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);

    let got = stamped(&dir);
    assert_eq!(got.len(), 1, "the tool ran once, with a receipt");
    let shown = outputs(&stream)[0].metadata["receipt"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(got[0], shown, "the agent sees the receipt the tool got");
    let claims = verified(&jwks(&app).await, &got[0]);
    assert_eq!(claims["iss"], "chatgate");
    assert_eq!(claims["confirmation_id"], id.as_str());
    assert_eq!(claims["session_id"], "r-1");
    assert_eq!(claims["round"], 1);
    assert_eq!(claims["task"]["index"], 1);
    assert_eq!(claims["task"]["tool"], "stamp");
    assert_eq!(
        claims["task"]["args_digest"],
        args_digest("stamp", "stamp the box")
    );
    assert_eq!(claims["task"]["preview_digest"], Value::Null);
    assert_eq!(claims["approved_by"], json!(["anonymous"]));
    assert_eq!(claims["via"], "chat");
    assert!(claims["decided_at"].as_str().unwrap().ends_with('Z'));
    assert_eq!(
        claims["idempotency_key"],
        outputs(&stream)[0].metadata["idempotency_key"],
        "the receipt names the call's idempotency key (#44)"
    );
    assert_eq!(claims["idempotency_key"].as_str().unwrap().len(), 43);
    // Verifiable only with the key it names: a changed payload is not.
    let parts: Vec<&str> = got[0].split('.').collect();
    let forged = format!(
        "{}.{}x.{}",
        parts[0],
        &parts[1][..parts[1].len() - 1],
        parts[2]
    );
    let header = decode_header(&forged).unwrap();
    let keys = jwks(&app).await;
    let jwk = keys.find(header.kid.as_deref().unwrap()).unwrap();
    let mut validation = Validation::new(jsonwebtoken::Algorithm::EdDSA);
    validation.required_spec_claims.clear();
    assert!(decode::<Value>(&forged, &DecodingKey::from_jwk(jwk).unwrap(), &validation).is_err());
}

#[tokio::test]
async fn a_quorum_s_receipt_names_both_approvers_a_rule_s_and_a_grant_s_say_so() {
    let dir = Workdir::new();
    let rule = r#"
[[rule]]
name = "marks of the day"
tool = "mark"
args = { "/step" = "mark today*" }
decision = "allow"
"#;
    let extra = stamp(&dir, 2) + &tool(&dir, "mark", 1) + rule;
    let app = crate::four_eyes::app(&dir, &extra).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "q", "stamp web").await;
    let confirm = json!({"message": "CONFIRM_ACTION:confirm"});
    assert_eq!(
        decide(&app, "lead-key-000001", "q", &id, confirm.clone())
            .await
            .0,
        200
    );
    assert_eq!(
        decide(&app, "lead-key-000002", "q", &id, confirm).await.0,
        200
    );
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let keys = jwks(&app).await;
    let claims = verified(&keys, &stamped(&dir)[0]);
    assert_eq!(claims["approved_by"], json!(["lead-1", "lead-2"]));
    assert_eq!(claims["via"], "chat");
    assert_eq!(claims["confirmation_id"], id.as_str());

    // An allow rule: no pause, no person; the rule is named.
    let mut stream = EventStreamOf::open(&app, "agent-key-000001", "rule", "mark today").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let claims = verified(&keys, &stamped(&dir)[1]);
    assert_eq!(claims["via"], "rule");
    assert_eq!(claims["approved_by"], json!(["marks of the day"]));
    assert_eq!(claims["confirmation_id"], Value::Null);
}

#[tokio::test]
async fn a_grant_s_receipt_names_who_granted_it() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, &stamp(&dir, 1), |_| {}).await;
    let (mut first, _) = app.open_paused("g", "stamp one").await;
    let granting = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:confirm",
            "session_id": "g",
            "grant": {"scope": "session", "tools": ["stamp"], "ttl": "10m", "max_calls": 1},
        }))
        .await;
    assert_eq!(granting.status(), 200);
    assert_eq!(first.finish().await.chunk_type, ChunkType::Completion);
    let mut second = app.open("g", "stamp two").await;
    assert_eq!(second.finish().await.chunk_type, ChunkType::Completion);

    let got = stamped(&dir);
    assert_eq!(got.len(), 2);
    let keys = jwks(&app).await;
    let first = verified(&keys, &got[0]);
    let second = verified(&keys, &got[1]);
    assert_eq!(first["via"], "chat");
    assert_eq!(second["via"], "grant");
    assert_eq!(second["approved_by"], json!(["anonymous"]));
    assert_eq!(
        second["task"]["args_digest"],
        args_digest("stamp", "stamp two")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quorum_taken_through_two_links_says_link() {
    let receiver = crate::webhooks::Receiver::start().await;
    let dir = Workdir::new();
    let app = crate::links::app_with(&dir, &receiver, &stamp(&dir, 2)).await;
    let (mut stream, id) = paused(&app, "agent-key-000001", "lr", "stamp web").await;
    let links = crate::links::links_of(&receiver, &app, &id).await;
    for label in ["lead-2", "lead-1"] {
        let url = crate::links::link(&links, label);
        let (status, page) = crate::links::post(&app, url, &[("action", "confirm")]).await;
        assert_eq!(status, 200, "{page}");
    }
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let claims = verified(&jwks(&app).await, &stamped(&dir)[0]);
    assert_eq!(claims["via"], "link");
    assert_eq!(claims["approved_by"], json!(["lead-2", "lead-1"]));
    assert_eq!(
        claims["iss"], "https://gate.example",
        "--public-url names the issuer"
    );
}

#[tokio::test]
async fn a_task_decided_on_its_own_runs_with_a_receipt_of_its_own_decision() {
    let dir = Workdir::new();
    let app = app_with_tools(&dir, &stamp(&dir, 1), |_| {}).await;
    let (mut stream, request) = app.open_paused("own", "stamp one; stamp two").await;
    let id = request.approval().unwrap().confirmation_id.clone();
    let decide_one = app
        .post_json(&json!({
            "message": "CONFIRM_ACTION:decide",
            "session_id": "own",
            "confirmation_id": id,
            "decisions": [{"index": 1, "decision": "approve"}],
        }))
        .await;
    assert_eq!(decide_one.status(), 200);
    // Task 1 runs while task 2 waits.
    let first = stream.until(ChunkType::ToolOutput).await;
    let (status, _) = app.reply("own", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let keys = jwks(&app).await;
    let got = stamped(&dir);
    assert_eq!(got.len(), 2);
    assert_eq!(first.metadata["receipt"], got[0].as_str());
    let one = verified(&keys, &got[0]);
    let two = verified(&keys, &got[1]);
    assert_eq!(
        (one["task"]["index"].clone(), two["task"]["index"].clone()),
        (json!(1), json!(2))
    );
    assert_eq!(one["confirmation_id"], id.as_str());
    assert_eq!(two["confirmation_id"], id.as_str());
    assert_eq!(
        one["task"]["args_digest"],
        args_digest("stamp", "stamp one")
    );
    assert_eq!(
        two["task"]["args_digest"],
        args_digest("stamp", "stamp two")
    );
    assert!(one["decided_at"].as_str().unwrap() <= two["decided_at"].as_str().unwrap());
}

/// A PKCS#8 PEM Ed25519 key, as `openssl genpkey -algorithm ed25519` writes.
fn key_file(dir: &Workdir, name: &str) -> PathBuf {
    use ed25519_dalek::pkcs8::EncodePrivateKey;
    let key = ed25519_dalek::SigningKey::generate(&mut rand_core::OsRng);
    let path = dir.path(name);
    std::fs::write(
        &path,
        key.to_pkcs8_pem(Default::default()).unwrap().as_bytes(),
    )
    .unwrap();
    path
}

#[tokio::test]
async fn servers_sharing_a_key_file_issue_receipts_one_jwks_verifies_and_an_old_key_stays_published(
) {
    let dir = Workdir::new();
    let (old, new) = (key_file(&dir, "old.pem"), key_file(&dir, "new.pem"));
    let tools = stamp(&dir, 1);
    let with = |keys: Vec<PathBuf>| {
        move |s: &mut chatgate::config::Settings| s.tooling.receipt_keys = keys
    };
    let before = app_with_tools(&dir, &tools, with(vec![old.clone()])).await;
    let one = app_with_tools(&dir, &tools, with(vec![new.clone(), old.clone()])).await;
    let two = app_with_tools(&dir, &tools, with(vec![new.clone()])).await;
    for (app, session) in [(&before, "k-0"), (&one, "k-1"), (&two, "k-2")] {
        let (mut stream, _) = app.open_paused(session, "stamp it").await;
        app.reply(session, "CONFIRM_ACTION:confirm").await;
        assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    }
    let got = stamped(&dir);
    let published = jwks(&one).await;
    assert_eq!(published.keys.len(), 2, "the signing key, then the old one");
    // Each server's receipt verifies with the one JWKS of the rotated server.
    for token in &got {
        verified(&published, token);
    }
    let kid = |token: &str| decode_header(token).unwrap().kid.unwrap();
    assert_eq!(kid(&got[1]), kid(&got[2]), "one key file, one kid");
    assert_ne!(kid(&got[0]), kid(&got[1]));
    assert_eq!(
        published.keys[0].common.key_id.as_deref(),
        Some(kid(&got[1]).as_str())
    );
}

#[test]
fn a_receipt_key_that_is_not_one_stops_the_start_naming_the_flag() {
    let dir = Workdir::new();
    let bad = dir.path("bad.pem");
    std::fs::write(
        &bad,
        "-----BEGIN PRIVATE KEY-----\nnope\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    for path in [bad.as_path(), Path::new("/no/such/key.pem")] {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_chatgate"))
            .args(["--bind", "127.0.0.1:0", "--receipt-key"])
            .arg(path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains("--receipt-key") && stderr.contains(&path.display().to_string()),
            "{stderr}"
        );
    }
}

/// A run started with an API key.
struct EventStreamOf;

impl EventStreamOf {
    async fn open(
        app: &TestApp,
        key: &str,
        session: &str,
        message: &str,
    ) -> crate::helpers::EventStream {
        crate::helpers::EventStream::new(
            crate::approvers::post(app, key, json!({"message": message, "session_id": session}))
                .await,
        )
    }
}

#[cfg(feature = "openai")]
#[tokio::test]
async fn an_http_tool_gets_its_receipt_in_a_header() {
    use actix_web::{web, App, HttpRequest, HttpResponse, HttpServer};
    let server = HttpServer::new(|| {
        App::new().route(
            "/hook",
            web::post().to(|req: HttpRequest| async move {
                let receipt = req
                    .headers()
                    .get("chatgate-receipt")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("")
                    .to_owned();
                HttpResponse::Ok().json(json!({ "receipt": receipt }))
            }),
        )
    })
    .workers(1)
    .bind("127.0.0.1:0")
    .unwrap();
    let url = format!("http://{}/hook", server.addrs()[0]);
    tokio::spawn(server.run());
    let dir = Workdir::new();
    let extra = format!(
        "[[tool]]\nname = \"hook\"\ndescription = \"Calls the hook\"\nrisk = \"high\"\n\
         http = \"{url}\"\nparameters = {{ type = \"object\" }}\n"
    );
    let app = app_with_tools(&dir, &extra, |_| {}).await;
    let (mut stream, _) = app.open_paused("hook", "hook it").await;
    app.reply("hook", "CONFIRM_ACTION:confirm").await;
    assert_eq!(stream.finish().await.chunk_type, ChunkType::Completion);
    let output = outputs(&stream)[0];
    let got: Value = serde_json::from_str(output.metadata["result"].as_str().unwrap()).unwrap();
    let receipt = got["receipt"].as_str().unwrap();
    assert_eq!(receipt, output.metadata["receipt"].as_str().unwrap());
    let claims = verified(&jwks(&app).await, receipt);
    assert_eq!(claims["task"]["tool"], "hook");
    assert_eq!(
        claims["task"]["args_digest"],
        args_digest("hook", "hook it")
    );
}
