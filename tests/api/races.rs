//! Races: every one has exactly one winner, reported once, and a decision
//! that lost never executes anything.

use std::time::Duration;

use chatgate::protocol::ChunkType;
use futures_util::future::join_all;
use serde_json::json;

use crate::helpers::{confirmation_id, one_chunk, spawn_app_with, EventStream, TestApp};

fn executed(stream: &EventStream) -> bool {
    stream
        .types()
        .iter()
        .any(|t| matches!(t, ChunkType::Status | ChunkType::ToolOutput))
}

fn received(stream: &EventStream) -> usize {
    stream
        .types()
        .iter()
        .filter(|t| **t == ChunkType::ConfirmationReceived)
        .count()
}

#[tokio::test]
async fn fifty_concurrent_confirms_yield_one_decision_and_49_already_decided() {
    // Long steps keep each run alive while the losers' replies land.
    let app =
        spawn_app_with(|s| s.engines.step_delay = std::time::Duration::from_millis(30_000)).await;
    for round in 0..10 {
        let session = format!("race-{round}");
        let (mut stream, _) = app.open_paused(&session, "one step").await;

        let answers =
            join_all((0..50).map(|_| app.reply(&session, "CONFIRM_ACTION:confirm"))).await;

        let accepted = answers.iter().filter(|(status, _)| *status == 200).count();
        assert_eq!(accepted, 1, "round {round}");
        for (status, chunk) in answers.iter().filter(|(status, _)| *status != 200) {
            assert_eq!(status.as_u16(), 409, "round {round}: {chunk:?}");
            assert_eq!(chunk.metadata["error_type"], "already_decided");
        }
        let next = stream.next_chunk().await.unwrap();
        assert_eq!(next.chunk_type, ChunkType::ConfirmationReceived);
    }
}

#[tokio::test]
async fn fifty_mixed_replies_to_one_pause_have_one_winner() {
    let app =
        spawn_app_with(|s| s.engines.step_delay = std::time::Duration::from_millis(30_000)).await;
    for round in 0..10 {
        let session = format!("mixed-{round}");
        let (mut stream, request) = app.open_paused(&session, "one step").await;
        let id = confirmation_id(&request);
        let app = &app;

        let replies = (0..50).map(|i| {
            let message = [
                "CONFIRM_ACTION:confirm",
                "CONFIRM_ACTION:cancel",
                "CONFIRM_ACTION:modify:x",
            ][i % 3];
            let body = json!({ "message": message, "session_id": session, "confirmation_id": id });
            async move { one_chunk(app.post_json(&body).await).await }
        });
        let answers = join_all(replies).await;

        let winners: Vec<_> = answers
            .iter()
            .filter(|(status, _)| *status == 200)
            .collect();
        assert_eq!(winners.len(), 1, "round {round}");
        for (status, chunk) in answers.iter().filter(|(status, _)| *status != 200) {
            let error_type = chunk.metadata["error_type"].as_str().unwrap();
            assert!(
                matches!(
                    (status.as_u16(), error_type),
                    (409, "already_decided")
                        | (409, "stale_confirmation")
                        | (404, "no_pending_confirmation")
                ),
                "round {round}: {status} {error_type}"
            );
        }
        let next = stream.next_chunk().await.unwrap();
        assert_eq!(next.chunk_type, ChunkType::ConfirmationReceived);
        assert_eq!(next.metadata["action"], winners[0].1.metadata["action"]);
        assert_eq!(next.metadata["confirmation_round"], 1);
    }
}

/// Sends a reply after `delay`, with the pause's confirmation id.
async fn reply_after(app: &TestApp, session: &str, id: &str, delay: Duration) -> u16 {
    try_reply_after(app, session, id, delay)
        .await
        .expect("reply delivered")
}

/// Like [`reply_after`]; `None` when the request never got an answer
/// (a pooled connection the server was closing at shutdown).
async fn try_reply_after(app: &TestApp, session: &str, id: &str, delay: Duration) -> Option<u16> {
    tokio::time::sleep(delay).await;
    let body = json!({
        "message": "CONFIRM_ACTION:confirm",
        "session_id": session,
        "confirmation_id": id,
    });
    let response = app.client.post(app.url()).json(&body).send().await.ok()?;
    Some(one_chunk(response).await.0.as_u16())
}

#[tokio::test]
async fn a_reply_racing_the_timeout_has_one_outcome() {
    let app =
        spawn_app_with(|s| s.pauses.confirm_timeout = std::time::Duration::from_secs(1)).await;
    let races = (0..20).map(|i| {
        let app = &app;
        async move {
            let session = format!("t-{i}");
            let (mut stream, request) = app.open_paused(&session, "step").await;
            // Around the 1 s deadline: 900 ms .. 1090 ms.
            let delay = Duration::from_millis(900 + 10 * i);
            let status = reply_after(app, &session, &confirmation_id(&request), delay).await;
            let last = stream.finish().await;
            (status, last, stream)
        }
    });

    for (status, last, stream) in join_all(races).await {
        if status == 200 {
            assert_eq!(last.chunk_type, ChunkType::Completion);
            assert_eq!(received(&stream), 1);
        } else {
            assert!(status == 404 || status == 409, "{status}");
            assert_eq!(last.metadata["reason"], "timeout");
            assert_eq!(received(&stream), 0);
            assert!(!executed(&stream), "a reply that lost executes nothing");
        }
    }
}

#[tokio::test]
async fn a_reply_racing_a_supersede_has_one_outcome() {
    let app = spawn_app_with(|s| s.engines.step_delay = std::time::Duration::from_millis(50)).await;
    for i in 0..20 {
        let session = format!("s-{i}");
        let (mut old, request) = app.open_paused(&session, "old plan").await;
        let id = confirmation_id(&request);

        let (status, new) = tokio::join!(
            reply_after(&app, &session, &id, Duration::ZERO),
            app.chat(&session, "new plan")
        );
        let old_last = old.finish().await;

        if status == 200 {
            assert_eq!(old_last.chunk_type, ChunkType::Completion, "{i}");
            assert_eq!(new.status(), 409, "the decided run keeps the session");
        } else {
            assert_eq!(old_last.metadata["reason"], "superseded", "{i}");
            assert!(!executed(&old), "the lost reply executed nothing");
            assert_eq!(new.status(), 200);
            let mut new = EventStream::new(new);
            new.until(ChunkType::ConfirmationRequest).await;
            app.reply(&session, "CONFIRM_ACTION:cancel").await;
            new.finish().await;
        }
    }
    app.registry_drains().await;
}

#[tokio::test]
async fn a_reply_racing_shutdown_has_one_outcome() {
    let app = spawn_app_with(|s| s.engines.step_delay = std::time::Duration::from_millis(50)).await;
    let mut runs = Vec::new();
    for i in 0..10 {
        let session = format!("sd-{i}");
        let (stream, request) = app.open_paused(&session, "step one; step two").await;
        runs.push((session, confirmation_id(&request), stream));
    }

    let replies = runs
        .iter()
        .map(|(session, id, _)| try_reply_after(&app, session, id, Duration::ZERO));
    let (statuses, ()) = tokio::join!(join_all(replies), async { app.shutdown.cancel() });

    for ((_, _, mut stream), status) in runs.into_iter().zip(statuses) {
        let last = stream.finish().await;
        assert_eq!(
            last.metadata["reason"], "shutdown",
            "every run ends with shutdown"
        );
        match (status, received(&stream)) {
            // The reply won: its decision is on the stream, once.
            (Some(200), 1) => {}
            // Shutdown won (or the reply never arrived): nothing was executed.
            (Some(404 | 409 | 503) | None, 0) => assert!(!executed(&stream)),
            other => panic!("inconsistent outcome {other:?}: {:?}", stream.types()),
        }
    }
}

#[tokio::test]
async fn a_reply_racing_a_disconnect_has_one_outcome() {
    let app = spawn_app_with(|s| {
        s.server.keep_alive = std::time::Duration::from_millis(200);
        s.pauses.detach_grace = std::time::Duration::from_secs(0);
    })
    .await;
    for i in 0..10 {
        let session = format!("d-{i}");
        let (stream, request) = app.open_paused(&session, "step").await;
        let id = confirmation_id(&request);

        let (status, ()) = tokio::join!(reply_after(&app, &session, &id, Duration::ZERO), async {
            drop(stream)
        });

        assert!([200, 404, 409].contains(&status), "{status}");
    }
    app.registry_drains().await;
    let metrics = app
        .client
        .get(format!("{}/metrics", app.address))
        .send()
        .await
        .unwrap();
    let text = metrics.text().await.unwrap();
    let decided: u64 = text
        .lines()
        .filter(|l| {
            l.starts_with("chatgate_confirmation_decisions_total{") && l.contains("accepted")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(decided, 10, "exactly one decision per pause:\n{text}");
}
