//! The floor of `chatgate-bench tool --mcp-server ...`: a minimal MCP client
//! (JSON-RPC lines over the server's stdio, no SDK) that initializes the
//! server once and then times `tools/call` round trips, as chatgate's own
//! call of the same tool would go without the gate around it.

use std::io;
use std::process::Stdio;
use std::time::Instant;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::Command;

use crate::stats::Samples;

fn err(what: &str) -> io::Error {
    io::Error::other(what.to_owned())
}

/// Calls `tool` with `args` (a JSON object, as text) `n + warmup` times on
/// the server `argv` and returns the last `n` round trips.
pub async fn direct_calls(
    argv: &[String],
    tool: &str,
    args: &str,
    n: usize,
    warmup: usize,
) -> io::Result<Samples> {
    let mut child = Command::new(&argv[0])
        .args(&argv[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut input = child.stdin.take().ok_or_else(|| err("no stdin"))?;
    let mut output = BufReader::new(child.stdout.take().ok_or_else(|| err("no stdout"))?).lines();
    let initialize = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"chatgate-bench","version":"0"}}}"#;
    input.write_all(initialize.as_bytes()).await?;
    input.write_all(b"\n").await?;
    answer_to(&mut output, 0).await?;
    input
        .write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}\n")
        .await?;
    let mut samples = Samples::with_capacity(n);
    for i in 1..=n + warmup {
        let call = format!(
            r#"{{"jsonrpc":"2.0","id":{i},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
        );
        let start = Instant::now();
        input.write_all(call.as_bytes()).await?;
        input.write_all(b"\n").await?;
        let line = answer_to(&mut output, i).await?;
        if line.contains("\"isError\":true") {
            return Err(err(&format!("the call failed: {line}")));
        }
        if i > warmup {
            samples.push(start.elapsed());
        }
    }
    Ok(samples)
}

/// Reads lines until the response with `id` (notifications and logs skipped).
async fn answer_to(
    output: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    id: usize,
) -> io::Result<String> {
    let wanted = format!("\"id\":{id}");
    while let Some(line) = output.next_line().await? {
        if line.contains(&wanted) && (line.contains("\"result\"") || line.contains("\"error\"")) {
            return Ok(line);
        }
    }
    Err(err("the MCP server closed its output"))
}
