//! The client streams' tests: keep-alive, gaps, detach and its grace.

use super::*;
use crate::protocol::Chunk;
use crate::protocol::ChunkType;
use crate::run::replay::ReplayLimits;
use crate::run::stop::RunStop;
use futures_util::StreamExt;

fn chunk(text: &str) -> Chunk {
    Chunk::new(ChunkType::Status, text, "s", 0)
}

fn settings(grace: Duration) -> Arc<StreamSettings> {
    Arc::new(StreamSettings {
        keep_alive: Duration::from_secs(3600),
        detach_grace: grace,
        park_after: None,
        max_parked: 0,
        metrics: Arc::new(Metrics::new()),
        registry: ReplayRegistry::default(),
    })
}

fn frames(frames: usize) -> ReplayLimits {
    ReplayLimits {
        frames,
        bytes: usize::MAX,
    }
}

fn key() -> SessionKey {
    SessionKey::new(None, "s")
}

async fn next_chunk(sub: &mut Subscription) -> Chunk {
    let frame = sub.next().await.unwrap().unwrap();
    let text = std::str::from_utf8(&frame).unwrap();
    let json = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap();
    serde_json::from_str(json).unwrap()
}

#[tokio::test]
async fn a_typed_subscription_reads_the_chunks_pushed_after_it_asked_as_their_frames_say() {
    let log = Replay::new(frames(3), RunStop::default());
    log.push(chunk("before"));
    let mut sub = Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO))
        .unwrap()
        .typed();
    for text in ["a", "b"] {
        log.push(chunk(text));
    }
    // Pushed before it asked: only its frame.
    assert_eq!(next_chunk(&mut sub).await.chunk, "before");
    assert!(sub.chunk().is_none());
    for _ in 0..2 {
        let frame = next_chunk(&mut sub).await;
        assert_eq!(
            sub.chunk(),
            Some(Box::new(frame)),
            "the typed chunk is its frame's"
        );
        assert!(sub.chunk().is_none(), "given once");
    }
    // Unread, the kept chunks stay within the log's frame bound, and
    // those of frames gone with a gap are not given.
    for n in 0..10 {
        log.push(chunk(&n.to_string()));
    }
    let kept = log
        .lock()
        .subscriber
        .as_ref()
        .unwrap()
        .typed
        .as_ref()
        .unwrap()
        .len();
    assert!(kept <= 3, "{kept}");
    let after_gap = next_chunk(&mut sub).await;
    assert!(after_gap.metadata["gap"] == true && sub.chunk().is_none());
    let next = next_chunk(&mut sub).await;
    assert_eq!(sub.chunk(), Some(Box::new(next)));
    // Another subscriber's log keeps nothing typed.
    let plain = Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO));
    log.push(chunk("x"));
    assert!(log.lock().subscriber.as_ref().unwrap().typed.is_none());
    drop(plain);
}

#[tokio::test]
async fn the_log_numbers_chunks_and_a_late_reader_gets_them_all() {
    let log = Replay::new(frames(8), RunStop::default());
    for text in ["a", "b"] {
        log.push(chunk(text));
    }
    let mut sub = Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO)).unwrap();

    assert_eq!(next_chunk(&mut sub).await.sequence, 1);
    log.push(chunk("c").finished());
    assert_eq!(next_chunk(&mut sub).await.chunk, "b");
    let last = next_chunk(&mut sub).await;
    assert_eq!((last.sequence, last.finished), (3, true));
    assert!(
        sub.next().await.is_none(),
        "the stream ends after the final chunk"
    );
}

#[tokio::test]
async fn a_re_attach_replays_after_last_event_id_and_announces_a_gap() {
    let log = Replay::new(frames(2), RunStop::default());
    for text in ["1", "2", "3", "4"] {
        log.push(chunk(text));
    }

    let mut in_buffer =
        Subscription::attach(log.clone(), key(), 2, settings(Duration::from_secs(60))).unwrap();
    let first = next_chunk(&mut in_buffer).await;
    let mut with_hole =
        Subscription::attach(log.clone(), key(), 0, settings(Duration::from_secs(60))).unwrap();
    let after_gap = next_chunk(&mut with_hole).await;

    assert_eq!((first.sequence, first.metadata.get("gap")), (3, None));
    assert_eq!(after_gap.sequence, 3, "1 and 2 were evicted");
    assert_eq!(after_gap.metadata["gap"], true);
    assert!(
        in_buffer.next().await.is_none(),
        "taken over by the re-attach"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_leaves_early_detaches_the_run_until_the_grace_ends() {
    let stop = RunStop::default();
    let log = Replay::new(frames(8), stop.clone());
    let settings = settings(Duration::from_secs(60));
    settings.registry.publish(key(), log.clone());
    log.push(chunk("paused"));

    drop(Subscription::attach(log.clone(), key(), 0, settings.clone()).unwrap());
    assert!(log.is_detached());
    assert_eq!(settings.registry.detached(), 1);
    tokio::time::sleep(Duration::from_secs(59)).await;
    assert_eq!(stop.reason(), None, "still within the grace");
    tokio::time::sleep(Duration::from_secs(2)).await;

    assert_eq!(stop.reason(), Some(CancelReason::ClientGone));
    assert!(settings.registry.is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_re_attach_within_the_grace_keeps_the_run() {
    let stop = RunStop::default();
    let log = Replay::new(frames(8), stop.clone());
    let settings = settings(Duration::from_secs(60));
    settings.registry.publish(key(), log.clone());
    log.push(chunk("paused"));
    drop(Subscription::attach(log.clone(), key(), 0, settings.clone()).unwrap());

    let _back = Subscription::attach(log.clone(), key(), 1, settings.clone()).unwrap();
    tokio::time::sleep(Duration::from_secs(120)).await;

    assert_eq!(stop.reason(), None);
    assert_eq!(settings.registry.len(), 1);
}

#[tokio::test]
async fn delivering_the_final_chunk_forgets_the_log() {
    let log = Replay::new(frames(8), RunStop::default());
    let settings = settings(Duration::from_secs(60));
    settings.registry.publish(key(), log.clone());
    log.push(chunk("done").finished());

    let mut sub = Subscription::attach(log.clone(), key(), 0, settings.clone()).unwrap();
    next_chunk(&mut sub).await;
    assert!(sub.next().await.is_none());
    drop(sub);

    assert!(settings.registry.is_empty());
}

#[tokio::test(start_paused = true)]
async fn each_grace_belongs_to_the_detach_that_started_it() {
    let stop = RunStop::default();
    let log = Replay::new(frames(8), stop.clone());
    let settings = settings(Duration::from_secs(6));
    settings.registry.publish(key(), log.clone());
    log.push(chunk("paused"));

    // Detach at t=0, re-attach at 0.5, detach again at 2.7.
    drop(Subscription::attach(log.clone(), key(), 0, settings.clone()).unwrap());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let back = Subscription::attach(log.clone(), key(), 1, settings.clone()).unwrap();
    tokio::time::sleep(Duration::from_millis(2200)).await;
    drop(back);
    tokio::time::sleep(Duration::from_millis(4000)).await; // t=6.7: the first grace is over

    assert_eq!(stop.reason(), None, "only the second detach's grace counts");
    tokio::time::sleep(Duration::from_millis(2100)).await; // t=8.8: the second is over
    assert_eq!(stop.reason(), Some(CancelReason::ClientGone));
}

#[tokio::test]
async fn an_id_beyond_the_last_sent_is_refused_and_takes_nothing_over() {
    let log = Replay::new(frames(8), RunStop::default());
    log.push(chunk("1"));
    log.push(chunk("2"));
    let mut reader = Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO)).unwrap();

    let beyond = Subscription::attach(log.clone(), key(), 3, settings(Duration::ZERO));
    let overflow = Subscription::attach(log.clone(), key(), u64::MAX, settings(Duration::ZERO));

    assert_eq!(beyond.err(), Some(BeyondEnd { last_sent: 2 }));
    assert_eq!(overflow.err(), Some(BeyondEnd { last_sent: 2 }));
    assert_eq!(
        next_chunk(&mut reader).await.sequence,
        1,
        "still the reader's"
    );
    let at_end = Subscription::attach(log.clone(), key(), 2, settings(Duration::ZERO));
    assert!(at_end.is_ok(), "the last id sent is fine");
}

#[tokio::test]
async fn a_gap_is_announced_whatever_the_chunk_holds() {
    let mut nested = serde_json::json!("deep");
    for _ in 0..300 {
        nested = serde_json::json!([nested]);
    }
    let tricky = Chunk::new(ChunkType::Status, "text with \"metadata\":{ inside", "s", 0)
        .with_meta("args", nested);
    let log = Replay::new(frames(1), RunStop::default());
    log.push(chunk("evicted"));
    log.push(tricky);

    let mut sub = Subscription::attach(log.clone(), key(), 0, settings(Duration::ZERO)).unwrap();
    let frame = sub.next().await.unwrap().unwrap();
    let text = std::str::from_utf8(&frame).unwrap();

    assert!(text.starts_with("id: 2\n"), "{text}");
    assert!(
        text.contains("\"metadata\":{\"gap\":true,\"args\":[[["),
        "{text}"
    );
    let empty = sse::with_gap(&sse::encode(&chunk("plain")));
    assert!(std::str::from_utf8(&empty)
        .unwrap()
        .contains("\"metadata\":{\"gap\":true}"));
    let with_text = sse::with_gap(&sse::encode(&Chunk::new(
        ChunkType::Status,
        "\"metadata\":{",
        "s",
        1,
    )));
    let json = std::str::from_utf8(&with_text)
        .unwrap()
        .lines()
        .nth(1)
        .unwrap();
    let back: Chunk = serde_json::from_str(json.strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(back.chunk, "\"metadata\":{");
    assert_eq!(back.metadata["gap"], true);
}
