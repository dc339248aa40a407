//! `parked` and `expiry`: paused runs parked in the store (#46).
//!
//! `parked` opens K detached paused runs (a plan of two tasks each), waits
//! until the server reports them all parked (`chatgate_parked_runs`), then
//! measures what they cost (RSS, the store's file), what the server does
//! while they wait (CPU over an idle spell), and what a decision on one of
//! them takes, one at a time: the reply's round trip (the wake included),
//! then, one decision in two, the run's chunks on a stream re-attached at
//! once (its first chunk after the pause, its final chunk: the resume as a
//! client sees it), and for the others the time until its end is stored
//! (its kept outcome answers `GET /api/v1/runs/<session>`, polled).
//!
//! `expiry` opens K paused runs on a server it starts itself, stops it,
//! waits until every pause is past its `--confirm-timeout`, starts it again
//! and measures how long the K pauses, all due at once, take to be woken
//! (`chatgate_parked_runs` back to 0), ended and stored (the outcome of
//! every 100th run, written with its end, read back), and, with
//! `--webhook-receiver`, until every `interaction.expired` webhook was
//! delivered to the bench's receiver.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::http::{Conn, Kind};
use crate::servers::{self, Spec};
use crate::stats::Samples;
use crate::{err, open_detached, per_run, reply_with, rss_kib, Pause};

/// A plan of two tasks (the measure).
const TWO_TASKS: Pause = Pause {
    message: "hold this; then ship it",
    ..Pause::PLAN
};

/// Where `parked` measures.
pub struct At<'a> {
    /// The server the runs are opened on.
    pub addr: &'a str,
    /// Another replica of its cluster, which takes the decisions.
    pub other: Option<&'a str>,
    pub server_pid: Option<u32>,
    /// The store's file, for its size.
    pub file: Option<&'a Path>,
}

/// `parked`: see the module's doc.
pub async fn parked(
    at: At<'_>,
    k: usize,
    concurrency: usize,
    decide: usize,
    idle: u64,
) -> io::Result<()> {
    let (addr, server_pid, file) = (at.addr, at.server_pid, at.file);
    let before = server_pid.and_then(rss_kib);
    let start = Instant::now();
    let opened = open_detached(addr, k, concurrency, "parked", TWO_TASKS).await?;
    let open = start.elapsed();
    println!(
        "opened {k} paused runs in {:.1} s: {:.0}/s",
        open.as_secs_f64(),
        k as f64 / open.as_secs_f64()
    );
    let mut metrics = Conn::connect(addr).await?;
    let limit = Duration::from_secs(60 + k as u64 / 1000);
    let waited = until(&mut metrics, limit, |text| {
        gauge(text, "chatgate_parked_runs") >= k as f64
    })
    .await?;
    println!(
        "all parked {:.1} s after the last open",
        waited.as_secs_f64()
    );
    // What the allocator gives back, it gives back within a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let during = server_pid.and_then(rss_kib);
    println!(
        "RSS before {} KiB, parked {} KiB => {}",
        before.map_or("?".into(), |v| v.to_string()),
        during.map_or("?".into(), |v| v.to_string()),
        per_run(before, during, k),
    );
    if let Some(file) = file {
        let bytes = file_bytes(file);
        println!(
            "store file {:.1} MiB (with its -wal) => {:.0} B/run",
            bytes as f64 / (1 << 20) as f64,
            bytes as f64 / k as f64
        );
    }
    if let Some(pid) = server_pid {
        let (ticks, start) = (cpu_ticks(pid), Instant::now());
        tokio::time::sleep(Duration::from_secs(idle)).await;
        let used = cpu_ticks(pid)
            .zip(ticks)
            .map(|(after, before)| after - before);
        let secs = start.elapsed().as_secs_f64();
        match used {
            Some(ticks) => println!(
                "idle {secs:.0} s with them parked: {:.2} s of CPU => {:.2}% of a core",
                ticks as f64 / TICKS_PER_SECOND,
                ticks as f64 / TICKS_PER_SECOND / secs * 100.0
            ),
            None => println!("idle: no CPU figures (no /proc/{pid}/stat)"),
        }
    }
    let deciding = at.other.unwrap_or(addr);
    if at.other.is_some() {
        println!("decisions on the other replica, {deciding}:");
    }
    decisions(deciding, &opened, decide).await
}

/// Decides `n` of `opened` (spread over them) one at a time: every
/// decision's reply; then, one decision in two, a stream re-attached at
/// once (from the start of the run's log) read to its end, and for the
/// others the run's kept outcome polled until it is there.
async fn decisions(addr: &str, opened: &[(usize, [u8; 36])], n: usize) -> io::Result<()> {
    let n = n.min(opened.len());
    if n == 0 {
        return Ok(());
    }
    let mut reply = Conn::connect(addr).await?;
    let (mut poll, mut stream) = (Conn::connect(addr).await?, Conn::connect(addr).await?);
    let mut rtt = Samples::with_capacity(n);
    let (mut resumed, mut ended, mut stored) = (
        Samples::with_capacity(n / 2 + 1),
        Samples::with_capacity(n / 2 + 1),
        Samples::with_capacity(n / 2 + 1),
    );
    let mut buf = Vec::with_capacity(160);
    let step = opened.len() / n;
    for (d, &(i, id)) in opened.iter().step_by(step.max(1)).take(n).enumerate() {
        reply_with(&mut buf, TWO_TASKS.release, "parked", i, &id);
        let start = Instant::now();
        if reply.post_chat(&buf).await? != 200 {
            return Err(err("a decision on a parked pause was not answered 200"));
        }
        reply.read_to_end().await?;
        rtt.push(start.elapsed());
        if d % 2 == 0 {
            // Re-attached: the run's whole log, live until its end.
            let body = format!("{{\"session_id\":\"parked{i}\"}}");
            if stream.reattach(body.as_bytes(), 0).await? != 200 {
                return Err(err("a re-attach to a decided run was not answered 200"));
            }
            let mut asked = false;
            loop {
                let Some(event) = stream.next_event().await? else {
                    return Err(err("a re-attached stream ended without a final chunk"));
                };
                if event.comment {
                    continue;
                }
                if asked {
                    resumed.push(start.elapsed());
                    asked = false;
                }
                if event.kind == Kind::ConfirmationRequest {
                    asked = true;
                }
                if event.finished {
                    ended.push(start.elapsed());
                    stream.drain().await?;
                    break;
                }
            }
            continue;
        }
        let path = format!("/api/v1/runs/parked{i}");
        let deadline = start + Duration::from_secs(10);
        while poll.get(&path).await? != 200 {
            if Instant::now() > deadline {
                return Err(err("a decided run did not end within 10 s"));
            }
        }
        stored.push(start.elapsed());
    }
    println!(
        "decision on a parked pause, reply round trip: {}",
        rtt.summary()
    );
    println!(
        "  then re-attached: its first chunk after the pause: {}",
        resumed.summary()
    );
    println!(
        "  then re-attached: its run's final chunk: {}",
        ended.summary()
    );
    println!(
        "  or its kept outcome polled, until stored: {}",
        stored.summary()
    );
    Ok(())
}

/// `expiry`: see the module's doc.
pub async fn expiry(
    spec: &Spec,
    k: usize,
    concurrency: usize,
    timeout: u64,
    announced: bool,
) -> io::Result<()> {
    let mut args = spec.extra.clone();
    args.extend(
        [
            "--park-after=0s",
            "--keep-alive=50ms",
            &format!("--confirm-timeout={timeout}s"),
            &format!("--max-runs={}", 2 * k + 1000),
        ]
        .map(String::from),
    );
    let first = servers::start(spec.bin.as_deref(), &spec.store, 1, &args)?.remove(0);
    let start = Instant::now();
    open_detached(&first.addr, k, concurrency, "expiry", TWO_TASKS).await?;
    let due = Instant::now() + Duration::from_secs(timeout);
    println!(
        "opened {k} paused runs in {:.1} s",
        start.elapsed().as_secs_f64()
    );
    let mut metrics = Conn::connect(&first.addr).await?;
    until(&mut metrics, Duration::from_secs(300), |text| {
        gauge(text, "chatgate_parked_runs") >= k as f64
            && gauge(text, "chatgate_webhook_queue_depth") == 0.0
    })
    .await?;
    drop(metrics);
    drop(first);
    let now = Instant::now();
    if due > now {
        println!(
            "stopped; waiting {:.0} s until every pause is due",
            (due - now).as_secs_f64()
        );
        tokio::time::sleep(due - now + Duration::from_secs(1)).await;
    }
    let start = Instant::now();
    let second = servers::start(spec.bin.as_deref(), &spec.store, 1, &args)?.remove(0);
    println!(
        "restarted with {k} pauses due: ready in {:.2} s",
        start.elapsed().as_secs_f64()
    );
    let mut metrics = Conn::connect(&second.addr).await?;
    let limit = Duration::from_secs(300);
    let mut last = k as f64;
    until(&mut metrics, limit, |text| {
        let parked = gauge(text, "chatgate_parked_runs");
        if last - parked >= k as f64 / 10.0 {
            println!(
                "  {parked} still parked after {:.2} s",
                start.elapsed().as_secs_f64()
            );
            last = parked;
        }
        parked == 0.0
    })
    .await?;
    println!(
        "{k} pauses due at once: none parked {:.2} s after the restart began",
        start.elapsed().as_secs_f64(),
    );
    // Stored: each run's outcome is written with its end; 1 in 100 of
    // them, spread over the K, is read back.
    let mut poll = Conn::connect(&second.addr).await?;
    for i in (0..k).step_by(100) {
        let path = format!("/api/v1/runs/expiry{i}");
        while poll.get(&path).await? != 200 {
            if start.elapsed() > limit {
                return Err(err("an expired run's outcome was never stored"));
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
    println!(
        "  and stored (the outcome of every 100th read back) {:.2} s after",
        start.elapsed().as_secs_f64(),
    );
    if announced {
        until(&mut metrics, limit, |text| {
            let expired = ["\"interaction.expired\"", "\"delivered\""];
            counter(text, "chatgate_webhook_deliveries_total{", &expired) >= k as f64
        })
        .await?;
        println!(
            "every interaction.expired webhook delivered {:.2} s after the restart began",
            start.elapsed().as_secs_f64(),
        );
    }
    Ok(())
}

/// Clock ticks a second for /proc's CPU times (`getconf CLK_TCK`: 100 on
/// every Linux this bench runs on).
const TICKS_PER_SECOND: f64 = 100.0;

/// User and system CPU time of `pid`, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command's closing parenthesis: state is the first,
    // utime the 12th and stime the 13th.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// The SQLite file's size with its write-ahead log and shared memory.
fn file_bytes(file: &Path) -> u64 {
    ["", "-wal", "-shm"]
        .iter()
        .filter_map(|suffix| {
            let mut path = PathBuf::from(file).into_os_string();
            path.push(suffix);
            std::fs::metadata(path).ok().map(|meta| meta.len())
        })
        .sum()
}

/// Polls `/metrics` every 250 ms (a scrape is not free: it counts what
/// the server holds) until `done` holds of its text; returns how long that
/// took.
async fn until(
    conn: &mut Conn,
    limit: Duration,
    mut done: impl FnMut(&str) -> bool,
) -> io::Result<Duration> {
    let start = Instant::now();
    let mut body = Vec::new();
    loop {
        if conn.get_body("/metrics", &mut body).await? != 200 {
            return Err(err("/metrics not 200"));
        }
        if done(&String::from_utf8_lossy(&body)) {
            return Ok(start.elapsed());
        }
        if start.elapsed() > limit {
            return Err(err("the server did not get there in time"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The value of an unlabelled gauge (0 when absent).
fn gauge(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The sum of a labelled counter's series whose labels hold every one of
/// `values`.
fn counter(text: &str, prefix: &str, values: &[&str]) -> f64 {
    text.lines()
        .filter(|line| line.starts_with(prefix))
        .filter(|line| {
            let labels = &line[..line.find('}').unwrap_or(0)];
            values.iter().all(|value| labels.contains(value))
        })
        .filter_map(|line| line.rsplit(' ').next()?.trim().parse::<f64>().ok())
        .sum()
}
