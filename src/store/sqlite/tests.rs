//! The SQLite store's tests: records, ends, locks, and the webhook outbox.

use super::*;
use crate::protocol::Action;
use crate::store::{OutboxStore, OutcomeStore};

const GRACE: Duration = Duration::from_secs(60);

fn record(run: &str) -> PausedRecord {
    PausedRecord {
        run: run.into(),
        namespace: Some("k0123".into()),
        session_id: "会话".into(),
        engine: "planner".into(),
        state: serde_json::json!({"steps": ["a"]}),
        message: "a".into(),
        confirmation_id: "c".into(),
        round: 1,
        options: Action::ALL.to_vec(),
        asked: Default::default(),
        expires_at_ms: 1,
        asked_at_ms: 0,
        frames: vec!["id: 1\ndata: {}\n\n".into()],
        next_seq: 2,
        decision: None,
        ended: None,
        in_memory: false,
        timer_due_ms: None,
        request_seq: None,
        progress: None,
        calls: Vec::new(),
    }
}

#[tokio::test]
async fn records_survive_reopening_and_decisions_are_kept_with_them() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let confirm = StoredDecision::new(Action::Confirm, "c", None, None);
    let key = SessionKey::new(Some(1), "会话");
    {
        let store = SqliteStore::open(&path, GRACE).unwrap();
        store.save(record("r1"), &[]).await.unwrap();
        store.save(record("r2"), &[]).await.unwrap();
        store
            .record_decision("r2", &key, &confirm, &[])
            .await
            .unwrap();
        store
            .remove("r1", &SessionKey::new(Some(1), "会话"))
            .await
            .unwrap();
    }
    let store = SqliteStore::open(&path, GRACE).unwrap();
    let loaded = store.load().await.unwrap();
    let second = SqliteStore::open(&path, GRACE).unwrap_err();
    assert!(second.contains("another chatgate process"), "{second}");

    assert_eq!(loaded.len(), 1);
    assert_eq!(loaded[0].run, "r2");
    assert_eq!(loaded[0].session_id, "会话");
    assert_eq!(StoredDecision::of(&loaded[0]), Some(confirm.clone()));
    assert_eq!(
        store.resolve("r2", &key, &confirm.nonce).await.unwrap(),
        Resolution::Recorded
    );
    assert_eq!(
        store.resolve("r2", &key, "another").await.unwrap(),
        Resolution::Void
    );
    assert!(store.get("r1").await.unwrap().is_none());
    // A decision for a record that is gone is not recorded, and says so.
    let gone = store
        .record_decision("r1", &key, &confirm, &[])
        .await
        .unwrap_err();
    assert_eq!(gone.fault, Fault::Lost);
}

#[tokio::test]
async fn an_ended_run_keeps_its_end_for_the_grace_then_goes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let key = SessionKey::new(Some(1), "会话");
    let end = RunEnd {
        frames: vec!["id: 1\ndata: {}\n\n".into(), "id: 2\ndata: {}\n\n".into()],
        next_seq: 3,
        pauses: vec![crate::store::PauseNote {
            confirmation_id: "c".into(),
            decided: Some(crate::store::DecidedBy {
                action: Action::Confirm,
                by: "key-1".into(),
                at_ms: 7,
                approved_by: Vec::new(),
                via: crate::protocol::Via::Link,
            }),
        }],
    };
    {
        let store = SqliteStore::open(&path, GRACE).unwrap();
        store.save(record("paused"), &[]).await.unwrap();
        store.save(record("ended"), &[]).await.unwrap();
        store.end("ended", &key, &end, &[], None).await.unwrap();
    }
    {
        let store = SqliteStore::open(&path, GRACE).unwrap();
        let loaded = store.load().await.unwrap();
        let runs: Vec<_> = loaded.iter().map(|r| r.run.as_str()).collect();
        // Ended ones first: a session's paused run is restored over them.
        assert_eq!(runs, ["ended", "paused"]);
        assert_eq!(loaded[0].ended.as_ref(), Some(&end));
        assert_eq!(loaded[1].ended, None);
        // The ended run's record keeps who it was, not what it paused on.
        let ended = &loaded[0];
        assert_eq!(
            (ended.session_id.as_str(), ended.namespace.as_deref()),
            ("会话", Some("k0123"))
        );
        assert!(
            ended.frames.is_empty() && ended.state.is_null(),
            "{ended:?}"
        );
        assert_eq!(loaded[1].frames, record("paused").frames);
        assert_eq!(loaded[1].state, record("paused").state);
    }
    {
        // Opened with a grace that is over by the time it loads.
        let store = SqliteStore::open(&path, Duration::from_millis(1)).unwrap();
        store.end("ended", &key, &end, &[], None).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        let loaded = store.load().await.unwrap();
        let runs: Vec<_> = loaded.iter().map(|r| r.run.as_str()).collect();
        assert_eq!(runs, ["paused"]);
    }
    // Without a grace an end goes at once.
    let store = SqliteStore::open(&path, Duration::ZERO).unwrap();
    store.end("paused", &key, &end, &[], None).await.unwrap();
    assert!(store.load().await.unwrap().is_empty());
    assert!(store.get("paused").await.unwrap().is_none());
}

fn event(id: &str) -> OutboxEvent {
    OutboxEvent {
        id: id.into(),
        event_type: "interaction.decided".into(),
        target: "http://127.0.0.1:1/hook".into(),
        order: "key-1/会话".into(),
        body: format!("{{\"id\":\"{id}\"}}"),
    }
}

#[tokio::test]
async fn events_are_queued_with_their_write_or_not_at_all_and_outlive_the_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let key = SessionKey::new(Some(1), "会话");
    let confirm = StoredDecision::new(Action::Confirm, "c", None, None);
    {
        let store = SqliteStore::open(&path, GRACE).unwrap();
        store
            .save(record("r1"), &[event("requested")])
            .await
            .unwrap();
        store
            .record_decision("r1", &key, &confirm, &[event("decided")])
            .await
            .unwrap();
        // A decision for a record that is gone records nothing, and
        // queues nothing.
        let gone = store
            .record_decision("nope", &key, &confirm, &[event("phantom")])
            .await
            .unwrap_err();
        assert_eq!(gone.fault, Fault::Lost);
        // Taken for delivery, then the process dies: the lease dies too.
        let taken = store.due_events(crate::clock::now_ms(), 10).await.unwrap();
        assert_eq!(taken.len(), 1, "one at a time per session");
        assert!(store
            .due_events(crate::clock::now_ms(), 10)
            .await
            .unwrap()
            .is_empty());
    }
    let store = SqliteStore::open(&path, GRACE).unwrap();
    let due = store.due_events(crate::clock::now_ms(), 10).await.unwrap();
    assert_eq!(due.len(), 1);
    assert_eq!(due[0].event, event("requested"));
    store.settle_events(vec![(due[0].seq, None)]).await.unwrap();
    let next = store.due_events(crate::clock::now_ms(), 10).await.unwrap();
    assert_eq!(next[0].event.id, "decided");
    let stats = store.outbox_stats().await.unwrap();
    assert_eq!(stats.depth, 1);
}

#[test]
fn one_file_under_two_names_is_one_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.db");
    let _first = SqliteStore::open(&path, GRACE).unwrap();
    let symlink = dir.path().join("current.db");
    std::os::unix::fs::symlink(&path, &symlink).unwrap();
    let hard_link = dir.path().join("hard.db");
    std::fs::hard_link(&path, &hard_link).unwrap();

    for other in [symlink, hard_link] {
        let refused = SqliteStore::open(&other, GRACE).unwrap_err();
        assert!(refused.contains("another chatgate process"), "{refused}");
    }
}

#[test]
fn a_store_file_removed_under_the_process_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let store = SqliteStore::open(&path, GRACE).unwrap();
    assert_eq!(store.health(), Ok(()));

    std::fs::remove_file(&path).unwrap();

    let unready = store.health().unwrap_err();
    assert!(unready.contains("removed or replaced"), "{unready}");
}

#[test]
fn a_stored_decision_keeps_its_bytes_and_reads_records_of_either_kind() {
    use crate::protocol::{Action, Given};
    use crate::store::StoredDecision;
    // As every version wrote them: `decisions` always, `answers` when given.
    let answered = r#"{"action":"answer","confirmation_id":"c1","decisions":null,"answers":{"region":"us-east"},"reason":null,"nonce":"n1"}"#;
    let confirmed = r#"{"action":"confirm","confirmation_id":"c2","decisions":[{"index":1,"decision":"approve"}],"reason":null,"nonce":"n2"}"#;
    let cancelled = r#"{"action":"cancel","confirmation_id":"c3","decisions":null,"reason":"user","nonce":"n3"}"#;
    for text in [answered, confirmed, cancelled] {
        let decision: StoredDecision = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&decision).unwrap(), text);
    }
    let decision: StoredDecision = serde_json::from_str(answered).unwrap();
    assert_eq!(decision.action, Action::Answer);
    let answers = decision.given.as_ref().and_then(Given::answers).unwrap();
    assert_eq!(answers["region"], "us-east");
    let decision: StoredDecision = serde_json::from_str(confirmed).unwrap();
    assert!(decision.given.as_ref().and_then(Given::decisions).is_some());
    let decision: StoredDecision = serde_json::from_str(cancelled).unwrap();
    assert_eq!(decision.given, None);
}

#[tokio::test]
async fn an_end_keeps_its_outcome_in_the_same_write() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let key = SessionKey::new(Some(1), "会话");
    let outcome = crate::store::Outcome {
        session_id: "会话".into(),
        final_chunk: crate::protocol::Chunk::cancelled(
            "会话",
            crate::protocol::CancelReason::Timeout,
        ),
        ended_at_ms: 5,
        pauses: Vec::new(),
        ran: Vec::new(),
    };
    let kept = KeptOutcome {
        namespace: Some("k0123".into()),
        outcome: outcome.clone(),
        keep: GRACE,
    };
    {
        let store = SqliteStore::open(&path, GRACE).unwrap();
        store.save(record("ended"), &[]).await.unwrap();
        let end = RunEnd {
            frames: Vec::new(),
            next_seq: 1,
            pauses: Vec::new(),
        };
        store
            .end("ended", &key, &end, &[], Some(&kept))
            .await
            .unwrap();
    }
    // On disk once the end is: read back after reopening.
    let store = SqliteStore::open(&path, GRACE).unwrap();
    let read = store.outcome(Some("k0123"), "会话").await.unwrap();
    assert_eq!(read, Some(outcome));
    assert!(store.load().await.unwrap()[0].ended.is_some());
    // Another namespace's session of the same name has none.
    assert_eq!(store.outcome(None, "会话").await.unwrap(), None);
}

#[tokio::test]
async fn the_parked_pauses_that_came_due_are_read_soonest_first_a_pass_going_on_where_it_stopped() {
    use crate::store::{DueFrom, ParkStore};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    let at = |run: &str, session: &str, expires: u64, timer: Option<u64>| PausedRecord {
        session_id: session.into(),
        expires_at_ms: expires,
        timer_due_ms: timer,
        ..record(run)
    };
    {
        let store = SqliteStore::open(&path, GRACE).unwrap();
        for record in [
            at("late", "s1", 900, None),
            at("first", "s2", 100, None),
            // Due by its timer before its expiry, and by both: found once.
            at("timer", "s3", 500, Some(50)),
            at("not-yet", "s4", 5_000, Some(4_000)),
            at("third", "s5", 300, None),
        ] {
            store.save(record, &[]).await.unwrap();
        }
    }
    // Opened again: no process holds any of them, every one is parked.
    let store = SqliteStore::open(&path, GRACE).unwrap();
    let runs = |records: Vec<PausedRecord>| -> Vec<String> {
        records.into_iter().map(|record| record.run).collect()
    };
    let from_start = DueFrom::default();
    let due = store.parked_due(1_000, from_start, 10).await.unwrap();
    assert_eq!(due.more, None, "fewer than asked for: the pass is over");
    let due = due.records;
    assert_eq!(runs(due.clone()), ["timer", "first", "third", "late"]);
    // Whole records, as a wake reads them.
    assert_eq!(due[1].frames, record("first").frames);
    assert_eq!(due[1].session_id, "s2");
    // Two of each order at a time: a pass goes on where the look before
    // stopped in each, until neither has more.
    let first = store.parked_due(1_000, from_start, 2).await.unwrap();
    assert_eq!(runs(first.records), ["timer", "first", "third"]);
    let from = first.more.expect("the expiry order gave as many as asked");
    let second = store.parked_due(1_000, from, 2).await.unwrap();
    // "timer" again, by its expiry this time: a pass reads a pause due by
    // both at most once in each order (its second wake finds it ended, or
    // parked again and due by its expiry).
    assert_eq!(runs(second.records), ["timer", "late"]);
    let third = store
        .parked_due(1_000, second.more.unwrap(), 2)
        .await
        .unwrap();
    assert!(third.records.is_empty());
    assert_eq!(third.more, None);
    assert!(store
        .parked_due(10, from_start, 10)
        .await
        .unwrap()
        .records
        .is_empty());
    // A woken one is not found again.
    store.unpark("first").await.unwrap();
    assert_eq!(
        runs(
            store
                .parked_due(1_000, from_start, 10)
                .await
                .unwrap()
                .records
        ),
        ["timer", "third", "late"]
    );
}
