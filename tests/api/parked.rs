//! Parked pauses (#46), against the real binary with `--store sqlite:PATH`
//! and `--park-after 0s`: a paused run whose client left leaves memory
//! (`chatgate_paused_runs` 0, `chatgate_parked_runs` 1), and a reply, a
//! re-attach, its expiry, its timers, an approver's reply by pause id and
//! a restart each find it and go on as if it had never left.

use std::time::Duration;

use chatgate::protocol::{Chunk, ChunkType};
use serde_json::{json, Value};

use crate::common::Binary;
use crate::durable::{
    chunks, post, post_with, read_raw, reply, start, stream_url, terminate, wait_for_gauge, Dir,
};

const REQUEST: &str = "\"chunk_type\":\"confirmation_request\"";

/// A server on `dir`'s store that parks a detached pause at once (a
/// client that left is noticed at the next keep-alive's write).
fn parking(dir: &Dir, extra: &[&str]) -> Binary {
    let mut args = vec!["--park-after", "0s", "--keep-alive", "100ms"];
    args.extend_from_slice(extra);
    start(dir, &args)
}

/// Opens a run on `session`, reads it to its pause and leaves: the chunks
/// it read. Returns once the run is parked.
async fn pause_and_leave(server: &Binary, session: &str) -> Vec<Chunk> {
    let body = json!({"message": "one; two", "session_id": session});
    let opened = post(&stream_url(server), body, None).await;
    let seen = chunks(&read_raw(opened, Some(REQUEST)).await);
    assert_eq!(
        seen.last().unwrap().chunk_type,
        ChunkType::ConfirmationRequest
    );
    seen
}

/// Waits until `server` holds no paused run and `parked` are parked.
async fn parked(server: &Binary, parked: i64) {
    wait_for_gauge(&server.url, "chatgate_parked_runs", parked).await;
    wait_for_gauge(&server.url, "chatgate_paused_runs", 0).await;
}

/// Re-attaches to `session` after `last_seen` and reads to the end.
async fn rest_of(server: &Binary, session: &str, last_seen: u64) -> Vec<Chunk> {
    let back = post(
        &stream_url(server),
        json!({"session_id": session}),
        Some(last_seen),
    )
    .await;
    assert_eq!(back.status(), 200);
    chunks(&read_raw(back, None).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_pause_leaves_memory_and_a_reply_wakes_it_and_decides_it() {
    let dir = Dir::new();
    let server = parking(&dir, &[]);
    let seen = pause_and_leave(&server, "p").await;
    parked(&server, 1).await;

    let (status, ack) = reply(&stream_url(&server), "p", "CONFIRM_ACTION:confirm").await;

    assert_eq!(status, 200, "{ack:?}");
    let request = seen.last().unwrap();
    assert_eq!(
        ack.metadata["confirmation_id"],
        request.metadata["confirmation_id"]
    );
    let after = rest_of(&server, "p", request.sequence).await;
    assert_eq!(
        after[0].sequence,
        request.sequence + 1,
        "the numbering goes on"
    );
    assert_eq!(after[0].chunk_type, ChunkType::ConfirmationReceived);
    assert_eq!(after.last().unwrap().chunk_type, ChunkType::Completion);
    assert!(after.iter().all(|c| c.metadata.get("gap").is_none()));
    wait_for_gauge(&server.url, "chatgate_parked_runs", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_re_attach_to_a_parked_run_is_sent_the_same_chunks_under_the_same_ids() {
    let dir = Dir::new();
    let server = parking(&dir, &[]);
    let seen = pause_and_leave(&server, "r").await;
    parked(&server, 1).await;

    // From the start: every chunk again, as it was sent, with no gap.
    let back = post(&stream_url(&server), json!({"session_id": "r"}), Some(0)).await;
    assert_eq!(back.status(), 200);
    let again = chunks(&read_raw(back, Some(REQUEST)).await);
    assert_eq!(again, seen);
    // It left again with that client, and parks again; from the middle.
    parked(&server, 1).await;
    assert!(seen.len() >= 2, "{seen:?}");
    let middle = seen[seen.len() - 2].sequence;
    let back = post(
        &stream_url(&server),
        json!({"session_id": "r"}),
        Some(middle),
    )
    .await;
    let tail = chunks(&read_raw(back, Some(REQUEST)).await);
    let expected: Vec<Chunk> = seen
        .iter()
        .filter(|c| c.sequence > middle)
        .cloned()
        .collect();
    assert_eq!(tail, expected);
    parked(&server, 1).await;

    // A re-attach that decides on its own stream reads the run to its end.
    let last = seen.last().unwrap().sequence;
    let back = post(&stream_url(&server), json!({"session_id": "r"}), Some(last)).await;
    let rest = tokio::spawn(read_raw(back, None));
    // It is held while attached: nothing parks it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_for_gauge(&server.url, "chatgate_paused_runs", 1).await;
    let (status, _) = reply(&stream_url(&server), "r", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 200);
    let after = chunks(&rest.await.unwrap());
    assert_eq!(after[0].sequence, last + 1);
    assert_eq!(after.last().unwrap().chunk_type, ChunkType::Completion);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_pause_expires_on_time_and_its_end_is_recorded() {
    let dir = Dir::new();
    let audit = dir.path("audit.jsonl").display().to_string();
    let server = parking(&dir, &["--confirm-timeout", "2s", "--audit-log", &audit]);
    let seen = pause_and_leave(&server, "e").await;
    parked(&server, 1).await;

    // Nobody asks about it: the sweep finds its expiry and ends it.
    wait_for_gauge(&server.url, "chatgate_parked_runs", 0).await;
    let ended = read_audit(&dir, "ended").await;

    assert_eq!(ended["outcome"], "cancelled");
    assert_eq!(ended["reason"], "timeout");
    let after = rest_of(&server, "e", seen.last().unwrap().sequence).await;
    let last = after.last().unwrap();
    assert_eq!(last.chunk_type, ChunkType::Cancelled);
    assert_eq!(last.metadata["reason"], "timeout");
    // Its outcome was kept with its end (one write of the store's).
    let outcome: Value = reqwest::get(format!("{}/api/v1/runs/e", server.url))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(outcome["outcome"], "cancelled", "{outcome}");
    assert_eq!(outcome["final_chunk"]["sequence"], last.sequence);
    let (status, _) = reply(&stream_url(&server), "e", "CONFIRM_ACTION:confirm").await;
    assert_eq!(status, 404, "nothing is pending any more");
}

/// The audit record of `event` once it is written.
async fn read_audit(dir: &Dir, event: &str) -> Value {
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    loop {
        let text = std::fs::read_to_string(dir.path("audit.jsonl")).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|line| serde_json::from_str::<Value>(line).ok())
            .find(|record| record["event"] == event);
        if let Some(record) = found {
            return record;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {event} record: {text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_pauses_stay_parked_across_a_restart_and_a_reply_still_decides() {
    let dir = Dir::new();
    let mut first = parking(&dir, &[]);
    let seen = pause_and_leave(&first, "k").await;
    parked(&first, 1).await;
    terminate(&mut first);

    let second = parking(&dir, &[]);
    parked(&second, 1).await;
    let (status, _) = reply(&stream_url(&second), "k", "CONFIRM_ACTION:confirm").await;

    assert_eq!(status, 200);
    let after = rest_of(&second, "k", seen.last().unwrap().sequence).await;
    assert_eq!(after.last().unwrap().chunk_type, ChunkType::Completion);
    wait_for_gauge(&second.url, "chatgate_parked_runs", 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replies_at_once_wake_a_parked_pause_once_and_one_decides() {
    let dir = Dir::new();
    let server = parking(&dir, &[]);
    let seen = pause_and_leave(&server, "t").await;
    parked(&server, 1).await;

    // Both name the pause: the one that loses is told it was decided
    // (409) whether the run is still there or has already ended (without
    // an id, a reply that comes after the end is told nothing is pending).
    let id = seen.last().unwrap().metadata["confirmation_id"].clone();
    let url = stream_url(&server);
    let reply = |message: &'static str| {
        let body = json!({"message": message, "session_id": "t", "confirmation_id": id});
        let url = url.clone();
        async move {
            let response = post(&url, body, None).await;
            let status = response.status().as_u16();
            (status, chunks(&read_raw(response, None).await).remove(0))
        }
    };
    let (a, b) = tokio::join!(
        reply("CONFIRM_ACTION:confirm"),
        reply("CONFIRM_ACTION:cancel")
    );

    let mut statuses = [a.0, b.0];
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 409], "{a:?} {b:?}");
    let after = rest_of(&server, "t", seen.last().unwrap().sequence).await;
    let finals: Vec<&Chunk> = after.iter().filter(|c| c.finished).collect();
    assert_eq!(finals.len(), 1, "one end: {after:?}");
    // After the end too, a reply naming the pause is told it was decided.
    let (late, told) = reply("CONFIRM_ACTION:cancel").await;
    assert_eq!(late, 409, "{told:?}");
    assert_eq!(told.metadata["error_type"], "already_decided", "{told:?}");
}

/// The ids of the pauses the inbox lists to `key`.
async fn listed(server: &Binary, key: Option<&str>) -> Vec<Value> {
    let mut request = reqwest::Client::new().get(format!("{}/api/v1/interactions", server.url));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    let body: Value = request.send().await.unwrap().json().await.unwrap();
    body["interactions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["confirmation_id"].clone())
        .collect()
}

const KEYS: &str = "\
agent-key-000001 label=ci-bot
approver lead-key-000001 label=lead-1 groups=leads
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inbox_lists_a_parked_pause_and_an_approver_decides_it_by_its_id() {
    let dir = Dir::new();
    std::fs::write(dir.path("keys.txt"), KEYS).unwrap();
    let keys = dir.path("keys.txt").display().to_string();
    let server = parking(&dir, &["--api-keys-file", &keys]);
    let url = stream_url(&server);
    let body = json!({"message": "one; two", "session_id": "i"});
    let opened = post_with(&url, Some("agent-key-000001"), body, None).await;
    let seen = chunks(&read_raw(opened, Some(REQUEST)).await);
    let id = seen.last().unwrap().metadata["confirmation_id"].clone();
    parked(&server, 1).await;

    let ids = listed(&server, Some("lead-key-000001")).await;
    assert_eq!(ids, std::slice::from_ref(&id));

    let decision = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "i",
        "confirmation_id": id});
    let decided = post_with(&url, Some("lead-key-000001"), decision, None).await;
    let status = decided.status().as_u16();
    let ack = chunks(&read_raw(decided, None).await);
    assert_eq!(status, 200, "{ack:?}");
    assert_eq!(ack[0].chunk_type, ChunkType::ConfirmationReceived);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_message_on_a_parked_session_supersedes_its_pause() {
    let dir = Dir::new();
    let audit = dir.path("audit.jsonl").display().to_string();
    let server = parking(&dir, &["--audit-log", &audit]);
    let old = pause_and_leave(&server, "s").await;
    parked(&server, 1).await;

    let new = pause_and_leave(&server, "s").await;

    let ended = read_audit(&dir, "ended").await;
    assert_eq!(ended["reason"], "superseded", "{ended}");
    let (old_id, new_id) = (
        &old.last().unwrap().metadata["confirmation_id"],
        &new.last().unwrap().metadata["confirmation_id"],
    );
    assert_ne!(old_id, new_id);
    let ids = listed(&server, None).await;
    assert_eq!(
        ids,
        std::slice::from_ref(new_id),
        "only the new run's pause waits"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_pause_s_reminder_and_escalation_fire_once_each_from_the_store_s_schedule() {
    use crate::escalation::{count, TIMED};
    let receiver = crate::webhooks::Receiver::start().await;
    let dir = Dir::new();
    std::fs::write(dir.path("keys.txt"), crate::approvers::KEYS).unwrap();
    std::fs::write(dir.path("tools.toml"), TIMED).unwrap();
    let (keys, tools) = (dir.path("keys.txt"), dir.path("tools.toml"));
    let (keys, tools) = (keys.display().to_string(), tools.display().to_string());
    let args = [
        "--api-keys-file",
        keys.as_str(),
        "--tools",
        tools.as_str(),
        "--webhook",
        receiver.url.as_str(),
        "--webhook-secret",
        crate::webhooks::SECRET,
    ];
    let server = parking(&dir, &args);
    let url = stream_url(&server);
    let body = json!({"message": "restart api", "session_id": "tm"});
    let opened = post_with(&url, Some("agent-key-000001"), body, None).await;
    let seen = chunks(&read_raw(opened, Some(REQUEST)).await);
    let id = seen.last().unwrap().metadata["confirmation_id"].clone();
    parked(&server, 1).await;

    // Nobody touches the session: the reminder (1s), then the escalation
    // (4s) are found in the store's schedule, each fired by a wake.
    let deadline = tokio::time::Instant::now() + crate::helpers::WAIT;
    while count(&receiver.seen(), "interaction.escalated") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never escalated");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Parked again once its timers fired.
    parked(&server, 1).await;
    let decision = json!({"message": "CONFIRM_ACTION:confirm", "session_id": "tm",
        "confirmation_id": id});
    let decided = post_with(&url, Some("lead-key-000001"), decision, None).await;
    let status = decided.status().as_u16();
    let ack = chunks(&read_raw(decided, None).await);

    assert_eq!(
        status, 200,
        "the leads decide after the escalation: {ack:?}"
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let seen = receiver.seen();
    let types: Vec<&str> = seen.iter().map(|d| d.event.as_str()).collect();
    assert_eq!(count(&seen, "interaction.reminder"), 1, "{types:?}");
    assert_eq!(count(&seen, "interaction.escalated"), 1, "{types:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn beyond_max_parked_a_paused_run_stays_held_and_is_decided_as_ever() {
    let dir = Dir::new();
    let server = parking(&dir, &["--max-parked", "1"]);
    pause_and_leave(&server, "m1").await;
    parked(&server, 1).await;

    pause_and_leave(&server, "m2").await;

    // The second one is held: one parked, one in memory.
    wait_for_gauge(&server.url, "chatgate_paused_runs", 1).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    wait_for_gauge(&server.url, "chatgate_parked_runs", 1).await;
    wait_for_gauge(&server.url, "chatgate_paused_runs", 1).await;
    for session in ["m1", "m2"] {
        let (status, ack) = reply(&stream_url(&server), session, "CONFIRM_ACTION:confirm").await;
        assert_eq!(status, 200, "{session}: {ack:?}");
    }
    wait_for_gauge(&server.url, "chatgate_parked_runs", 0).await;
}

/// More pauses due at once than one look at the store takes of each order
/// (512): a pass goes on where each look stopped, reading the next batch
/// while it wakes the last, and ends every one of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_pauses_due_at_once_than_a_look_takes_are_all_ended() {
    use futures_util::StreamExt;
    const RUNS: usize = 1_100;
    let dir = Dir::new();
    let timeout = ["--confirm-timeout", "3s"];
    let mut first = parking(&dir, &timeout);
    let url = stream_url(&first);
    futures_util::stream::iter(0..RUNS)
        .for_each_concurrent(32, |i| {
            let url = url.clone();
            async move {
                let body = json!({"message": "one; two", "session_id": format!("due-{i}")});
                read_raw(post(&url, body, None).await, Some(REQUEST)).await;
            }
        })
        .await;
    let opened = tokio::time::Instant::now();
    // Stopped while they wait (the ones already due end on the way out or
    // at the next start), started again once every one is due.
    terminate(&mut first);
    tokio::time::sleep_until(opened + Duration::from_millis(3_500)).await;
    let second = parking(&dir, &timeout);

    wait_for_gauge(&second.url, "chatgate_parked_runs", 0).await;
    let client = reqwest::Client::new();
    for i in 0..RUNS {
        let outcome: Value = client
            .get(format!("{}/api/v1/runs/due-{i}", second.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(outcome["outcome"], "cancelled", "due-{i}: {outcome}");
        assert_eq!(
            outcome["final_chunk"]["metadata"]["reason"], "timeout",
            "due-{i}: {outcome}"
        );
    }
}
