//! Soak: 10,000 open/pause/confirm cycles against the real binary, half
//! sequential and half from 16 concurrent clients. Afterwards nothing is
//! left in the registry, and the server's RSS is back within 10% of its
//! warm baseline. Bounded in count; loopback only.
//!
//! Not part of `cargo test` (its memory check depends on the machine): run
//! it with `cargo test --test soak -- --ignored`, as `.ci/run` does with
//! its own time budget (`--release` works as well; a debug build shows a
//! leak just the same, and CI has it built already).

use std::time::Duration;

use futures_util::future::join_all;
use futures_util::StreamExt;
use serde_json::{json, Value};

const CYCLES: usize = 10_000;
const CLIENTS: usize = 16;

mod common;

use common::{rss_kib, start_binary};

/// Reads SSE chunks until one satisfies `stop`; returns it.
async fn read_until(
    body: &mut (impl futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Unpin),
    buf: &mut Vec<u8>,
    stop: impl Fn(&Value) -> bool,
) -> Value {
    loop {
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let event: Vec<u8> = buf.drain(..end + 2).collect();
            let text = std::str::from_utf8(&event).unwrap();
            if let Some(json) = text.lines().find_map(|l| l.strip_prefix("data: ")) {
                let chunk: Value = serde_json::from_str(json).unwrap();
                if stop(&chunk) {
                    return chunk;
                }
            }
        }
        let bytes = tokio::time::timeout(Duration::from_secs(20), body.next())
            .await
            .expect("chunk within 20 s")
            .expect("stream open")
            .unwrap();
        buf.extend_from_slice(&bytes);
    }
}

async fn cycle(client: &reqwest::Client, url: &str, session: &str) {
    let stream_url = format!("{url}/api/v1/chat/stream");
    let response = client
        .post(&stream_url)
        .json(&json!({"message": "soak step", "session_id": session}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let mut body = response.bytes_stream();
    let mut buf = Vec::new();
    read_until(&mut body, &mut buf, |c| {
        c["chunk_type"] == "confirmation_request"
    })
    .await;
    let reply = client
        .post(&stream_url)
        .json(&json!({"message": "CONFIRM_ACTION:confirm", "session_id": session}))
        .send()
        .await
        .unwrap();
    assert_eq!(reply.status(), 200);
    reply.bytes().await.unwrap();
    let last = read_until(&mut body, &mut buf, |c| c["finished"] == true).await;
    assert_eq!(last["chunk_type"], "completion");
}

async fn sequential(client: &reqwest::Client, url: &str, prefix: &str, cycles: usize) {
    for i in 0..cycles {
        cycle(client, url, &format!("{prefix}-{i}")).await;
    }
}

async fn concurrent(client: &reqwest::Client, url: &str, prefix: &str, cycles: usize) {
    join_all((0..CLIENTS).map(|c| {
        let (client, url) = (client.clone(), url.to_owned());
        let prefix = format!("{prefix}-{c}");
        async move { sequential(&client, &url, &prefix, cycles / CLIENTS).await }
    }))
    .await;
}

async fn gauge(client: &reqwest::Client, url: &str, name: &str) -> i64 {
    let text = client
        .get(format!("{url}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("{name} in\n{text}"))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak, not a unit test: cargo test --test soak -- --ignored"]
async fn ten_thousand_cycles_leave_nothing_behind_and_memory_flat() {
    // Kept outcomes (--keep-outcome) are left behind on purpose, bounded in
    // count (docs/protocol.md); this soak is about what must not be, so it
    // keeps none.
    let server = start_binary(&[
        "--step-delay",
        "0",
        "--workers",
        "2",
        "--keep-outcome",
        "0s",
    ]);
    let pid = server.child.id().to_string();
    let client = reqwest::Client::new();
    // Warm up the way the soak runs: sequential, then concurrent.
    sequential(&client, &server.url, "warm-seq", 500).await;
    concurrent(&client, &server.url, "warm-par", 1000).await;
    let warm = rss_kib(&pid);

    sequential(&client, &server.url, "seq", CYCLES / 2).await;
    concurrent(&client, &server.url, "par", CYCLES / 2).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = rss_kib(&pid);

    for name in [
        "chatgate_active_runs",
        "chatgate_paused_runs",
        "chatgate_detached_runs",
        "chatgate_open_streams",
    ] {
        assert_eq!(gauge(&client, &server.url, name).await, 0, "{name}");
    }
    assert!(
        after as f64 <= warm as f64 * 1.10,
        "RSS {after} KiB after the soak, warm baseline {warm} KiB (more than 10% growth)"
    );
    println!("soak: warm RSS {warm} KiB, after {CYCLES} cycles {after} KiB");
}
