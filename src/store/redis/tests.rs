//! The Lua scripts against a real redis-server, started here on a free
//! port of 127.0.0.1 (ignored by a plain `cargo test`: `.ci/run` runs them
//! with `--ignored` once it has installed redis-server).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use secrecy::SecretString;

use super::{run_key, RedisStore, ReplicaSettings};
use crate::session::Namespaces;

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn redis() -> (Server, RedisStore, redis::aio::MultiplexedConnection) {
    redis_keeping(true).await
}

/// A redis-server, and a store that keeps records compressed or not
/// (`--redis-records`).
async fn redis_keeping(
    compressed: bool,
) -> (Server, RedisStore, redis::aio::MultiplexedConnection) {
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server on PATH");
    let server = Server(child);
    let url = format!("redis://127.0.0.1:{port}/0");
    let client = redis::Client::open(url.as_str()).unwrap();
    let started = Instant::now();
    let connection = loop {
        match client.get_multiplexed_async_connection().await {
            Ok(connection) => break connection,
            Err(err) if started.elapsed() > Duration::from_secs(10) => panic!("{err}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
        }
    };
    let store = RedisStore::open(
        &url,
        ReplicaSettings {
            replica_id: "x".into(),
            advertise_url: "http://127.0.0.1:1".into(),
            secret: SecretString::from("a-cluster-secret-for-the-test"),
            grace: Duration::from_secs(5),
            linger: Duration::from_secs(5),
            namespaces: Namespaces::of_keys([]),
            compress_records: compressed,
        },
    )
    .unwrap();
    (server, store, connection)
}

/// Runs the END script as replica `x/1` under epoch 1 for run `r1`, whose
/// session another replica took over (instance `y/1`, epoch 2): its answer
/// and how many events the outbox then holds.
async fn end_after_a_takeover(with_record: bool) -> (i64, u64) {
    let (_server, store, mut redis) = redis().await;
    let session = "chatgate:session:-:s1";
    let _: () = redis::cmd("HSET")
        .arg(session)
        .arg(&["instance", "y/1", "run", "r1", "epoch", "2"])
        .query_async(&mut redis)
        .await
        .unwrap();
    if with_record {
        let _: () = redis::cmd("HSET")
            .arg(run_key("r1"))
            .arg(&["record", "{}", "session", session])
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    let event = serde_json::json!({
        "id": "e1", "event_type": "run.ended", "target": "t", "order": "o", "body": "{}",
    })
    .to_string();
    let args = ["r1", "x/1", "5000", "1", "{}", "{}", "123", event.as_str()];
    let answer: i64 = store
        .invoke(&store.scripts.end, &[&run_key("r1"), session], &args)
        .await
        .unwrap();
    let queued: u64 = redis::cmd("ZCARD")
        .arg("chatgate:outbox:all")
        .query_async(&mut redis)
        .await
        .unwrap();
    (answer, queued)
}

#[tokio::test]
#[ignore = "needs redis-server on PATH"]
async fn an_end_after_a_takeover_with_no_record_announces_the_end_itself() {
    // The taker found no record to restore (the run was at work): it
    // forgets the session and announces nothing, so the end is queued here.
    assert_eq!(end_after_a_takeover(false).await, (0, 1));
}

#[tokio::test]
#[ignore = "needs redis-server on PATH"]
async fn an_end_after_a_takeover_of_a_kept_record_leaves_the_end_to_the_taker() {
    // The taker restores the record and ends the run itself: one end.
    assert_eq!(end_after_a_takeover(true).await, (0, 0));
}

#[tokio::test]
#[ignore = "needs redis-server on PATH"]
async fn a_stale_timer_entry_leaves_the_index_and_a_waiting_one_is_due() {
    let (_server, store, mut redis) = redis().await;
    // r1's pause was decided (no longer `pending`), r2's record is gone,
    // r3 still waits; r4 waits too but is not due yet.
    let session = |id: &str| format!("chatgate:session:-:{id}");
    for (run, pending) in [("r1", false), ("r3", true), ("r4", true)] {
        let mut fields = vec!["session".to_owned(), session(&format!("s-{run}"))];
        if pending {
            fields.extend(["pending".to_owned(), "1".to_owned()]);
        }
        let _: () = redis::cmd("HSET")
            .arg(run_key(run))
            .arg(&fields)
            .query_async(&mut redis)
            .await
            .unwrap();
    }
    for (run, due) in [("r1", 100), ("r2", 100), ("r3", 100), ("r4", 900)] {
        let _: () = redis::cmd("ZADD")
            .arg("chatgate:timers:-")
            .arg(due)
            .arg(run)
            .query_async(&mut redis)
            .await
            .unwrap();
    }

    let due = store.due_timers(None, 500, 10).await.unwrap();

    assert_eq!(due, ["s-r3"]);
    let left: Vec<String> = redis::cmd("ZRANGE")
        .arg("chatgate:timers:-")
        .arg(0)
        .arg(-1)
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(left, ["r3", "r4"], "the stale entries left the index");
}

/// A paused record of a plan of two tasks, as a run writes it (the
/// dictionary's, with ids and tasks of its own).
fn a_paused_record(run: &str, session: &str) -> crate::store::PausedRecord {
    let text = String::from_utf8(include_bytes!("../record.dict").to_vec())
        .unwrap()
        .replace("create a report", "back up the database");
    let mut record: crate::store::PausedRecord = serde_json::from_str(&text).unwrap();
    record.run = run.into();
    record.session_id = session.into();
    record.expires_at_ms = crate::clock::now_ms() + 60_000;
    record
}

/// Saves a paused record of run `r1` on session `s1` as its owner (epoch
/// 3) would: the record, and the bytes Redis keeps of it.
async fn save_one<T: redis::FromRedisValue>(
    store: &RedisStore,
    redis: &mut redis::aio::MultiplexedConnection,
) -> (crate::store::PausedRecord, T) {
    use crate::store::Store;
    let _: () = redis::cmd("HSET")
        .arg("chatgate:session:-:s1")
        .arg(&["instance", store.instance(), "run", "r1", "epoch", "3"])
        .query_async(redis)
        .await
        .unwrap();
    store.hold("r1", "3");
    let record = a_paused_record("r1", "s1");
    store.save(record.clone(), &[]).await.unwrap();
    let kept: T = redis::cmd("HGET")
        .arg(run_key("r1"))
        .arg("record")
        .query_async(redis)
        .await
        .unwrap();
    (record, kept)
}

#[tokio::test]
#[ignore = "needs redis-server on PATH"]
async fn a_paused_record_is_kept_compressed_and_one_of_an_earlier_version_reads_as_text() {
    let (_server, store, mut redis) = redis().await;

    let (record, kept): (_, Vec<u8>) = save_one(&store, &mut redis).await;
    let json = serde_json::to_string(&record).unwrap();
    let read = store.get("r1").await.unwrap();
    // An earlier version's record: its JSON as text.
    let _: () = redis::cmd("HSET")
        .arg(run_key("r1"))
        .arg(&["record", json.as_str()])
        .query_async(&mut redis)
        .await
        .unwrap();
    let read_as_text = store.get("r1").await.unwrap();
    // Bytes no version wrote: skipped, not a panic.
    let _: () = redis::cmd("HSET")
        .arg(run_key("r1"))
        .arg(&["record", "\u{2}garbage"])
        .query_async(&mut redis)
        .await
        .unwrap();
    let unreadable = store.get("r1").await.unwrap();

    assert_eq!(kept.first(), Some(&1), "compressed: its format byte");
    assert!(
        kept.len() * 5 < json.len(),
        "{} bytes kept for {} of JSON",
        kept.len(),
        json.len()
    );
    assert_eq!(read, Some(record.clone()), "read back as it was");
    assert_eq!(read_as_text, Some(record));
    assert_eq!(unreadable, None);
}

#[tokio::test]
#[ignore = "needs redis-server on PATH"]
async fn with_redis_records_json_a_record_is_kept_as_earlier_versions_read_it() {
    let (_server, store, mut redis) = redis_keeping(false).await;

    let (record, kept): (_, String) = save_one(&store, &mut redis).await;

    assert_eq!(kept, serde_json::to_string(&record).unwrap());
    assert_eq!(store.get("r1").await.unwrap(), Some(record));
}

#[tokio::test]
#[ignore = "needs redis-server on PATH"]
async fn an_aside_pause_is_listed_and_located_by_its_owner_only_and_goes_with_the_run() {
    use crate::session::SessionKey;
    use crate::store::{ExecutionStore, PausedRecord};
    let (_server, store, mut redis) = redis().await;
    let session = "chatgate:session:-:s1";
    let _: () = redis::cmd("HSET")
        .arg(session)
        .arg(&["instance", store.instance(), "run", "r1", "epoch", "3"])
        .query_async(&mut redis)
        .await
        .unwrap();
    let _: () = redis::cmd("HSET")
        .arg(run_key("r1"))
        .arg(&["record", "{}", "session", session, "decision", "{}"])
        .query_async(&mut redis)
        .await
        .unwrap();
    let record = PausedRecord {
        run: "r1".into(),
        namespace: None,
        session_id: "s1".into(),
        engine: "planner".into(),
        state: serde_json::Value::Null,
        message: "mark it".into(),
        confirmation_id: "c-aside".into(),
        round: 1,
        options: crate::protocol::Action::RECONCILE.to_vec(),
        asked: Default::default(),
        expires_at_ms: crate::clock::now_ms() + 60_000,
        asked_at_ms: crate::clock::now_ms(),
        frames: vec!["id: 1\ndata: {}\n\n".into()],
        next_seq: 2,
        decision: None,
        ended: None,
        in_memory: true,
        timer_due_ms: None,
        request_seq: None,
        progress: None,
        calls: Vec::new(),
    };
    let key = SessionKey::new(None, "s1");

    // Not under the session's epoch: refused, nothing listed.
    let refused = store.list_aside("r1", &key, Some(&record)).await;
    store.hold("r1", "3");
    let listed = store.list_aside("r1", &key, Some(&record)).await;
    let pending = store.pending_page(None, None, 10).await.unwrap();
    let located = store.locate_pause("c-aside").await.unwrap();

    assert!(refused.is_err(), "a stale epoch lists nothing");
    assert!(listed.is_ok(), "{listed:?}");
    assert_eq!(
        pending.len(),
        1,
        "the aside pause alone: the run's record is decided"
    );
    assert_eq!(pending[0].confirmation_id, "c-aside");
    assert_eq!(pending[0].run, "r1.aside");
    assert_eq!(located, Some((None, "s1".to_owned())), "its run's session");

    // Dropped by its owner; listed again, then gone with the run's end.
    store.list_aside("r1", &key, None).await.unwrap();
    assert!(store.pending_page(None, None, 10).await.unwrap().is_empty());
    store.list_aside("r1", &key, Some(&record)).await.unwrap();
    let args = ["r1", store.instance(), "0", "3", "{}", "{}"];
    let ended: i64 = store
        .invoke(&store.scripts.end, &[&run_key("r1"), session], &args)
        .await
        .unwrap();
    let left: u64 = redis::cmd("EXISTS")
        .arg(run_key("r1.aside"))
        .query_async(&mut redis)
        .await
        .unwrap();
    let members: u64 = redis::cmd("ZCARD")
        .arg("chatgate:pending:-")
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(ended, 1);
    assert_eq!((left, members), (0, 0), "nothing of it is left");
}
