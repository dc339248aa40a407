//! The replay buffer's tests: eviction, bounds, and what it keeps.

use super::*;
use crate::protocol::ChunkType;

fn chunk(text: &str) -> Chunk {
    Chunk::new(ChunkType::Status, text, "s", 0)
}

fn frames(frames: usize) -> ReplayLimits {
    ReplayLimits {
        frames,
        bytes: usize::MAX,
    }
}

#[tokio::test]
async fn an_attached_reader_that_falls_a_whole_buffer_behind_stops_the_run() {
    let stop = RunStop::default();
    let log = Replay::new(frames(4), stop.clone());
    let _reader = log.attach(0).unwrap();

    for i in 0..4 {
        log.push(chunk(&i.to_string()));
    }
    assert_eq!(stop.reason(), None, "a full buffer is still fine");
    log.push(chunk("one too many"));

    assert_eq!(stop.reason(), Some(CancelReason::SlowConsumer));
}

#[tokio::test]
async fn without_a_reader_old_chunks_are_evicted_and_nothing_stops() {
    let stop = RunStop::default();
    let log = Replay::new(frames(2), stop.clone());
    for i in 0..10 {
        log.push(chunk(&i.to_string()));
    }
    assert_eq!(stop.reason(), None);
}

#[tokio::test]
async fn the_log_keeps_at_most_its_bytes_and_a_reader_behind_them_stops_the_run() {
    let stop = RunStop::default();
    let limits = ReplayLimits {
        frames: 1000,
        bytes: 2000,
    };
    let log = Replay::new(limits, stop.clone());
    for _ in 0..10 {
        log.push(chunk(&"x".repeat(500)));
    }
    assert!(log.lock().bytes <= 2000 && log.lock().frames.len() < 10);
    assert_eq!(stop.reason(), None, "nobody attached: old frames just go");

    let _reader = log.attach(10).unwrap();
    for _ in 0..4 {
        log.push(chunk(&"x".repeat(500)));
    }
    assert_eq!(stop.reason(), Some(CancelReason::SlowConsumer));
}

/// A pause request chunk, as the engines send it.
fn request(id: &str) -> Chunk {
    let mut chunk = Chunk::new(ChunkType::ConfirmationRequest, "the plan", "s", 0);
    chunk.confirmation_data = serde_json::from_value(serde_json::json!({
        "kind": "approval", "confirmation_id": id, "confirmation_round": 1, "tasks": [],
        "options": ["confirm"], "timeout_seconds": 60, "expires_at": "2026-11-27T00:00:00Z",
        "risk_level": "low"
    }))
    .unwrap();
    assert!(chunk.confirmation_data.is_some());
    chunk
}

fn data(frame: &Bytes) -> Chunk {
    serde_json::from_slice(sse::data_of(frame).unwrap()).unwrap()
}

#[test]
fn a_pause_s_request_is_found_by_its_id_never_by_what_later_chunks_say() {
    let log = Replay::new(frames(3), RunStop::default());
    log.push(request("old"));
    let asked = log.push(request("p1"));
    // A chunk whose text names the pause and looks like a request.
    log.push(chunk(r#"p1 "confirmation_data":{ p1"#));

    let found = data(&log.last_frame("p1").unwrap());
    assert_eq!(
        (found.sequence, found.chunk_type),
        (asked, ChunkType::ConfirmationRequest)
    );
    assert!(
        log.last_frame("old").is_none(),
        "only the latest pause is looked up"
    );
    log.amend_request("p1", br#""escalated_to":"leads""#);
    assert_eq!(
        data(&log.last_frame("p1").unwrap()).metadata["escalated_to"],
        "leads"
    );

    // Evicted: gone, not another frame.
    log.push(chunk("a"));
    log.push(chunk("b"));
    assert!(log.last_frame("p1").is_none());
}

#[test]
fn a_restored_log_s_last_frame_is_its_stored_pause_s_request() {
    let stored = vec![
        String::from_utf8(sse::encode(&chunk("before")).to_vec()).unwrap(),
        String::from_utf8(sse::encode(&request("p2")).to_vec()).unwrap(),
    ];
    let log = Replay::restore(frames(8), RunStop::default(), stored, 3, false, Some("p2"));

    let found = data(&log.last_frame("p2").unwrap());
    assert_eq!(found.chunk_type, ChunkType::ConfirmationRequest);
    assert!(log.last_frame("p1").is_none());
}

#[test]
fn a_frame_encoded_ahead_is_sent_only_under_the_number_it_was_encoded_with() {
    let log = Replay::new(frames(8), RunStop::default());
    let (_, first) = log.snapshot();
    let numbered = |text: &str, sequence: u64| {
        let mut c = chunk(text);
        c.sequence = sequence;
        crate::sse::encode(&c)
    };
    // Encoded under the number it gets: kept as it is.
    let frame = numbered("asked", first);
    log.push_framed(chunk("asked"), Some((first, frame.clone())));
    // Encoded under another number: encoded anew under its own.
    log.push_framed(
        chunk("later"),
        Some((first + 7, numbered("later", first + 7))),
    );
    let (kept, next) = log.snapshot();
    assert_eq!(next, first + 2);
    assert_eq!(kept[0], String::from_utf8_lossy(&frame));
    assert_eq!(
        kept[1],
        String::from_utf8_lossy(&numbered("later", first + 1))
    );
}
