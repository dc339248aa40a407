//! `tasks`: what deciding a plan task by task costs (#42). Alternately, on
//! the same connections, a three-task plan confirmed at once and one whose
//! tasks are decided one `decide` at a time (tasks 3 and 2 first,
//! acknowledged `decision_recorded`: nothing runs before task 1 is
//! decided; then task 1, deciding the pause, which resumes the run): start→completion of each, a `decide`'s round trip, and what the
//! two extra decides add against one confirm round trip.

use std::io;
use std::time::Instant;

use crate::http::{Conn, Kind};
use crate::quorum::{finish, next_chunk};
use crate::stats::Samples;
use crate::{decide, err, pause_of, reply_json, session_json};

const PLAN: &str = "one; two; three";

pub async fn tasks(addr: &str, n: usize) -> io::Result<()> {
    let mut stream = Conn::connect(addr).await?;
    let mut reply = Conn::connect(addr).await?;
    let mut buf = Vec::with_capacity(256);
    let (mut whole, mut by_task) = (Samples::with_capacity(n), Samples::with_capacity(n));
    let (mut confirm_rtt, mut decide_rtt) = (Samples::with_capacity(n), Samples::with_capacity(n));
    for i in 0..n + 50 {
        // One confirm decides the three tasks.
        session_json(&mut buf, "whole", i, PLAN);
        let start = Instant::now();
        if stream.post_chat(&buf).await? != 200 {
            return Err(err("start not 200"));
        }
        let (id, _) = pause_of(&mut stream, Kind::ConfirmationRequest, start).await?;
        reply_json(&mut buf, "whole", i, &id);
        let (rtt, _) = decide(&mut stream, &mut reply, &buf).await?;
        finish(&mut stream).await?;
        let whole_flow = start.elapsed();

        // Task by task: tasks 3 and 2 recorded (the planner runs a task
        // once every task before it is decided: nothing yet), task 1
        // decides the pause.
        session_json(&mut buf, "each", i, PLAN);
        let start = Instant::now();
        if stream.post_chat(&buf).await? != 200 {
            return Err(err("start not 200"));
        }
        let (id, _) = pause_of(&mut stream, Kind::ConfirmationRequest, start).await?;
        let mut first = None;
        for task in [3, 2] {
            decide_json(&mut buf, i, &id, task);
            let sent = Instant::now();
            if reply.post_chat(&buf).await? != 200 {
                return Err(err("a decide not 200"));
            }
            let (_, ack) = reply.read_to_end().await?;
            if ack.kind != Kind::Other {
                return Err(err("a decide of one task decided the pause"));
            }
            first.get_or_insert(sent.elapsed());
            // The run's stream shows it (`decision_recorded`).
            next_chunk(&mut stream).await?;
        }
        decide_json(&mut buf, i, &id, 1);
        decide(&mut stream, &mut reply, &buf).await?;
        finish(&mut stream).await?;
        if i >= 50 {
            whole.push(whole_flow);
            by_task.push(start.elapsed());
            confirm_rtt.push(rtt);
            decide_rtt.push(first.unwrap_or_default());
        }
    }
    let (whole, by_task) = (whole.summary(), by_task.summary());
    let (rtt, one) = (confirm_rtt.summary(), decide_rtt.summary());
    println!("tasks       one confirm, start→completion     {whole}");
    println!("            three decides, start→completion   {by_task}");
    println!("            a confirm's round trip            {rtt}");
    println!("            a decide's round trip (recorded)  {one}");
    let extra = by_task.p50.saturating_sub(whole.p50);
    println!(
        "            the two extra decides add {} µs (p50): {:.2}x of one confirm round trip",
        extra,
        extra as f64 / rtt.p50.max(1) as f64
    );
    Ok(())
}

/// `CONFIRM_ACTION:decide` approving task `task` of the pause `id`.
fn decide_json(buf: &mut Vec<u8>, n: usize, id: &[u8; 36], task: usize) {
    buf.clear();
    buf.extend_from_slice(b"{\"message\":\"CONFIRM_ACTION:decide\",\"session_id\":\"each");
    buf.extend_from_slice(n.to_string().as_bytes());
    buf.extend_from_slice(b"\",\"confirmation_id\":\"");
    buf.extend_from_slice(id);
    buf.extend_from_slice(b"\",\"decisions\":[{\"index\":");
    buf.extend_from_slice(task.to_string().as_bytes());
    buf.extend_from_slice(b",\"decision\":\"approve\"}]}");
}
