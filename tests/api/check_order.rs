//! docs/protocol.md's "Refused replies" table against the code (#41 item
//! 10): each case sends one reply that fails two checks at once, over a real
//! socket, and the check the table lists first must be the one that
//! answers; the table must list the two in that order.

use chatgate::protocol::ChunkType;
use serde_json::{json, Value};

use crate::helpers::{error_type, one_chunk, TestApp};
use crate::tools::{app_with_tools, Workdir};

/// `deploy` needs two approvals: the requester (anonymous, no keys) may not
/// approve it.
const QUORUM: &str = r#"
[[tool]]
name = "deploy"
description = "Deploy"
risk = "high"
approvals = 2
command = ["true"]
parameters = { type = "object", properties = { step = { type = "string" } } }
"#;

/// The rows of the order table: (its `order` number, its `error_type`).
fn documented_order() -> Vec<(u32, String)> {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/protocol.md")).unwrap();
    let start = doc
        .find("| order | check | status | `error_type` |")
        .expect("the order table");
    doc[start..]
        .lines()
        .skip(2)
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| {
            let number = line.split('|').nth(1)?.trim().parse().ok()?;
            let cell = line.split('|').nth(4)?;
            let open = cell.find('`')? + 1;
            let close = open + cell[open..].find('`')?;
            Some((number, cell[open..close].to_owned()))
        })
        .collect()
}

/// The table has a row `number` whose `error_type` is `what`.
fn has_row(order: &[(u32, String)], number: u32, what: &str) -> bool {
    order.iter().any(|(n, e)| *n == number && e == what)
}

async fn reply(app: &TestApp, body: Value) -> (u16, String) {
    let (status, chunk) = one_chunk(app.post_json(&body).await).await;
    assert_eq!(chunk.chunk_type, ChunkType::Error, "{}", chunk.chunk);
    (status.as_u16(), error_type(&chunk).to_owned())
}

#[tokio::test]
async fn the_documented_check_order_is_the_order_the_server_checks() {
    let order = documented_order();
    assert!(order.len() >= 10, "{order:?}");
    let dir = Workdir::new();
    let app = app_with_tools(&dir, QUORUM, |_| {}).await;
    // A note plan (one yes) and a deploy plan (two people) left paused.
    let (_note, note) = app.open_paused("order-note", "note one").await;
    let note_id = note.approval().unwrap().confirmation_id.clone();
    let (_deploy, _) = app.open_paused("order-deploy", "deploy web").await;

    // ((row, the check that answers), (row, the check it comes before), the reply)
    let cases = [
        (
            (3, "no_pending_confirmation"),
            (4, "invalid_confirm_action"),
            json!({"message": "CONFIRM_ACTION:launch", "session_id": "order-nobody"}),
        ),
        (
            (4, "invalid_confirm_action"),
            (5, "stale_confirmation"),
            json!({"message": "CONFIRM_ACTION:launch", "session_id": "order-note",
                   "confirmation_id": "not-the-pause"}),
        ),
        (
            (5, "stale_confirmation"),
            (6, "self_approval"),
            json!({"message": "CONFIRM_ACTION:confirm", "session_id": "order-deploy",
                   "confirmation_id": "not-the-pause"}),
        ),
        (
            (6, "self_approval"),
            (7, "invalid_answer"),
            json!({"message": "CONFIRM_ACTION:confirm", "session_id": "order-deploy",
                   "answers": {"q1": "x"}}),
        ),
        (
            (7, "invalid_answer"),
            (8, "invalid_decision"),
            json!({"message": "CONFIRM_ACTION:confirm", "session_id": "order-note",
                   "answers": {"q1": "x"}, "decisions": [{"index": 9, "decision": "approve"}]}),
        ),
        (
            (8, "invalid_decision"),
            (9, "invalid_grant"),
            json!({"message": "CONFIRM_ACTION:confirm", "session_id": "order-note",
                   "decisions": [{"index": 9, "decision": "approve"}],
                   "grant": {"scope": "nowhere"}}),
        ),
    ];
    for ((row, first), (later, then), body) in cases {
        assert!(
            has_row(&order, row, first) && has_row(&order, later, then) && row < later,
            "docs/protocol.md lists {first} (row {row}) before {then} (row {later}): {order:?}"
        );
        let (_, answered) = reply(&app, body.clone()).await;
        assert_eq!(
            answered, first,
            "{body}: the server checks {first} before {then}"
        );
    }
    // Nothing was decided by any of them: the note still waits.
    let (status, _) = one_chunk(
        app.post_json(
            &json!({"message": "CONFIRM_ACTION:confirm", "session_id": "order-note",
                              "confirmation_id": note_id}),
        )
        .await,
    )
    .await;
    assert_eq!(status, 200);
}
