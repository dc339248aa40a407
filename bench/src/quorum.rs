//! `quorum`: what a four-eyes pause costs. Alternately, on the same
//! connections, a call one yes decides (the requester confirms) and a call
//! two approvers decide (lead-1's approval, acknowledged `approval_recorded`,
//! then lead-2's, which resumes the run): start→completion of each, the
//! first approval's round trip, and what the second approver adds to the
//! flow against one confirm round trip. Start the server with
//! `--tools bench/quorum.toml --api-keys-file bench/quorum-keys.txt`.

use std::io;
use std::time::Instant;

use crate::http::{Conn, Kind};
use crate::stats::Samples;
use crate::{decide, err, pause_of, reply_json, session_json};

/// The keys of `bench/quorum-keys.txt`.
const AGENT: &str = "bench-agent-key-0001";
const LEAD_1: &str = "bench-lead-key-00001";
const LEAD_2: &str = "bench-lead-key-00002";

pub async fn quorum(addr: &str, n: usize) -> io::Result<()> {
    let mut stream = Conn::connect(addr).await?.bearer(AGENT);
    let mut own = Conn::connect(addr).await?.bearer(AGENT);
    let mut lead_1 = Conn::connect(addr).await?.bearer(LEAD_1);
    let mut lead_2 = Conn::connect(addr).await?.bearer(LEAD_2);
    let mut buf = Vec::with_capacity(256);
    let (mut one, mut two) = (Samples::with_capacity(n), Samples::with_capacity(n));
    let (mut confirm_rtt, mut first_approval) =
        (Samples::with_capacity(n), Samples::with_capacity(n));
    for i in 0..n + 50 {
        // One yes: the requester's own.
        session_json(&mut buf, "one", i, "trivial call");
        let start = Instant::now();
        if stream.post_chat(&buf).await? != 200 {
            return Err(err("start not 200"));
        }
        let (id, _) = pause_of(&mut stream, Kind::ConfirmationRequest, start).await?;
        reply_json(&mut buf, "one", i, &id);
        let (rtt, _) = decide(&mut stream, &mut own, &buf).await?;
        finish(&mut stream).await?;
        let one_flow = start.elapsed();

        // Two approvals: lead-1's is recorded, lead-2's resumes the run.
        session_json(&mut buf, "two", i, "deploy call");
        let start = Instant::now();
        if stream.post_chat(&buf).await? != 200 {
            return Err(err("start not 200"));
        }
        let (id, _) = pause_of(&mut stream, Kind::ConfirmationRequest, start).await?;
        reply_json(&mut buf, "two", i, &id);
        let sent = Instant::now();
        if lead_1.post_chat(&buf).await? != 200 {
            return Err(err(
                "lead-1's approval not 200 (start with bench/quorum-keys.txt)",
            ));
        }
        let (_, ack) = lead_1.read_to_end().await?;
        if ack.kind != Kind::Other {
            return Err(err("lead-1's approval decided the pause (approvals = 2?)"));
        }
        let first = sent.elapsed();
        // The run's stream says "1 of 2 approvals (lead-1)".
        next_chunk(&mut stream).await?;
        decide(&mut stream, &mut lead_2, &buf).await?;
        finish(&mut stream).await?;
        if i >= 50 {
            one.push(one_flow);
            two.push(start.elapsed());
            confirm_rtt.push(rtt);
            first_approval.push(first);
        }
    }
    let (one, two) = (one.summary(), two.summary());
    let (rtt, first) = (confirm_rtt.summary(), first_approval.summary());
    println!("quorum      one yes, start→completion       {one}");
    println!("            two approvals, start→completion {two}");
    println!("            a confirm's round trip          {rtt}");
    println!("            the first approval's round trip {first}");
    let extra = two.p50.saturating_sub(one.p50);
    println!(
        "            the second approver adds {} µs (p50) to the flow: {:.2}x of one \
         confirm round trip",
        extra,
        extra as f64 / rtt.p50.max(1) as f64
    );
    Ok(())
}

/// Reads the run's stream to its final chunk, a completion.
pub(crate) async fn finish(stream: &mut Conn) -> io::Result<()> {
    let (_, last) = stream.read_to_end().await?;
    if last.kind != Kind::Completion {
        return Err(err("the run did not complete"));
    }
    Ok(())
}

/// The next chunk of the run's stream (keep-alives skipped).
pub(crate) async fn next_chunk(stream: &mut Conn) -> io::Result<()> {
    loop {
        let event = stream
            .next_event()
            .await?
            .ok_or_else(|| err("ended while paused"))?;
        if !event.comment {
            return Ok(());
        }
    }
}
