//! One streamed call to the model server, read on the engine's runtime.
//!
//! [`ModelCall::start`] spawns a task (on the runtime the engine was built
//! on, not on the HTTP worker that serves the run's client) that sends the
//! request, checks the status, and parses the response's Server-Sent Events
//! into [`StreamChunk`]s, which it hands to the run through a small bounded
//! channel (so a model that streams faster than the run consumes waits).
//!
//! Bounds, all enforced here, before anything is buffered past them:
//! - a line of the event stream is at most [`MAX_LINE_BYTES`] (and an event's
//!   data as much); lines are split in one pass over the bytes (linear time);
//! - an error response's body is read up to [`MAX_ERROR_BODY_BYTES`];
//! - the whole call, head and stream, ends by its deadline (`--llm-max-time`),
//!   however often the server sends keep-alive comments; silence is bounded
//!   by reqwest's read timeout (`--llm-timeout`).
//!
//! Dropping the [`ModelCall`] (the run stopped) aborts the task, which closes
//! the connection to the model server.

use crate::session::run_log;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// Longest line of the model server's event stream, and most data of one event.
pub const MAX_LINE_BYTES: usize = 256 * 1024;
/// Most bytes of an error response's body read (for the log).
pub const MAX_ERROR_BODY_BYTES: usize = 4 * 1024;
/// Parsed events in flight between the reading task and the run.
const CHANNEL_DEPTH: usize = 16;
/// Times a 429 or 503 answer is retried within the call's deadline.
const MAX_RETRIES: u32 = 5;
/// The wait before the first retry when the server gives no `Retry-After`;
/// doubled each time.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// Why a model call failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CallError {
    #[error("cannot reach the model server")]
    Unreachable,
    #[error("the model server did not answer within {0:?} (--llm-timeout)")]
    NoAnswer(Duration),
    #[error("the model server answered {status}")]
    Status { status: u16 },
    #[error("the model's stream broke")]
    Broken,
    #[error("the model's stream ended before its answer was complete")]
    EndedEarly,
    #[error("the model server sent an unreadable event ({0})")]
    Unreadable(&'static str),
    #[error("the model server sent a line longer than {MAX_LINE_BYTES} bytes")]
    LineTooLong,
    #[error("the model server reported an error")]
    Reported,
    #[error("the model call took longer than {0:?} (--llm-max-time)")]
    Deadline(Duration),
    #[error("the model server is rate-limiting (HTTP {status}); retried within --llm-max-time and gave up")]
    RateLimited {
        status: u16,
        /// What the server last asked to wait, in seconds.
        retry_after: Option<u64>,
    },
}

impl CallError {
    /// Past a bound chatgate sets on what it accepts, rather than a failure
    /// of the model server.
    pub fn is_limit(&self) -> bool {
        matches!(self, CallError::LineTooLong)
    }
}

/// One `data:` event of a streamed chat completion.
#[derive(Debug, Deserialize)]
pub struct StreamChunk {
    #[serde(default)]
    pub choices: Vec<StreamChoice>,
    pub error: Option<Value>,
}

#[derive(Debug, Deserialize)]
pub struct StreamChoice {
    #[serde(default)]
    pub delta: Delta,
    pub finish_reason: Option<String>,
}

#[derive(Debug, Deserialize, Default)]
pub struct Delta {
    pub content: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ToolCallPart>,
    /// The legacy single function call.
    pub function_call: Option<FunctionPart>,
}

#[derive(Debug, Deserialize)]
pub struct ToolCallPart {
    pub index: Option<usize>,
    pub id: Option<String>,
    pub function: Option<FunctionPart>,
}

#[derive(Debug, Deserialize)]
pub struct FunctionPart {
    pub name: Option<String>,
    /// A piece of the arguments' JSON text, or (some servers) the whole
    /// arguments as an object.
    pub arguments: Option<Value>,
}

/// What the reading task hands to the run.
#[derive(Debug)]
pub enum Upstream {
    Chunk(StreamChunk),
    /// The stream ended as it should: `[DONE]`, or a `finish_reason` then the end.
    Done,
    Failed(CallError),
}

/// Who a model call's log lines are about: the run, and the model server
/// by its origin (`model server http://host:port`, never the whole URL).
pub struct Who {
    pub tag: crate::session::RunTag,
    pub server: String,
}

/// A model call in progress.
pub struct ModelCall {
    events: mpsc::Receiver<Upstream>,
    task: AbortHandle,
}

impl ModelCall {
    /// Sends `request` from a task on `runtime`; the call must end by
    /// `max_time` from now. `who` is whom its log lines are about.
    pub fn start(
        runtime: &tokio::runtime::Handle,
        request: reqwest::RequestBuilder,
        who: Who,
        read_timeout: Duration,
        max_time: Duration,
    ) -> ModelCall {
        let (events_tx, events) = mpsc::channel(CHANNEL_DEPTH);
        let deadline = Instant::now() + max_time;
        let task = runtime.spawn(async move {
            let call = read_call(request, &who, read_timeout, deadline, &events_tx);
            let ended = match tokio::time::timeout_at(deadline, call).await {
                Ok(Ok(())) => Upstream::Done,
                Ok(Err(err)) => Upstream::Failed(err),
                Err(_) => {
                    run_log!(
                        Warn,
                        who.tag,
                        "{}: the call passed its deadline ({max_time:?})",
                        who.server
                    );
                    Upstream::Failed(CallError::Deadline(max_time))
                }
            };
            // The run may have gone; then nobody needs to know.
            let _ = events_tx.send(ended).await;
        });
        ModelCall {
            events,
            task: task.abort_handle(),
        }
    }

    /// The next event; after `Done` or `Failed` there is none.
    pub async fn next(&mut self) -> Upstream {
        self.events
            .recv()
            .await
            .unwrap_or(Upstream::Failed(CallError::Broken))
    }
}

impl Drop for ModelCall {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends `request`, retrying 429 and 503 answers with backoff (honouring
/// `Retry-After` in seconds, or `retry-after-ms`) while the deadline allows.
async fn send_with_retries(
    request: reqwest::RequestBuilder,
    who: &Who,
    read_timeout: Duration,
    deadline: Instant,
) -> Result<reqwest::Response, CallError> {
    let mut attempt = 0;
    loop {
        // A JSON body (ours, always) can be sent again.
        let sending = request.try_clone().ok_or(CallError::Unreachable)?;
        let mut response = sending.send().await.map_err(|err| {
            run_log!(
                Warn,
                who.tag,
                "{}: cannot be reached: {}",
                who.server,
                crate::redact::request_error(&err)
            );
            if err.is_timeout() {
                CallError::NoAnswer(read_timeout)
            } else {
                CallError::Unreachable
            }
        })?;
        let status = response.status().as_u16();
        if status != 429 && status != 503 {
            return Ok(response);
        }
        let asked = retry_after(response.headers());
        let wait = asked.unwrap_or(FIRST_BACKOFF * 2u32.pow(attempt.min(6)));
        let detail = read_error_body(&mut response).await;
        run_log!(
            Warn,
            who.tag,
            "{}: answered {status} (attempt {}): {detail:.200}",
            who.server,
            attempt + 1
        );
        if attempt >= MAX_RETRIES || Instant::now() + wait >= deadline {
            return Err(CallError::RateLimited {
                status,
                retry_after: asked.map(|d| d.as_secs_f64().ceil() as u64),
            });
        }
        tokio::time::sleep(wait).await;
        attempt += 1;
    }
}

/// `retry-after-ms`, or `Retry-After` in seconds (an HTTP date is not
/// read: the backoff applies then).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|n| n.is_finite() && *n >= 0.0 && *n < 86_400.0)
    };
    number("retry-after-ms")
        .map(|ms| Duration::from_secs_f64(ms / 1000.0))
        .or_else(|| number("retry-after").map(Duration::from_secs_f64))
}

async fn read_call(
    request: reqwest::RequestBuilder,
    who: &Who,
    read_timeout: Duration,
    deadline: Instant,
    events: &mpsc::Sender<Upstream>,
) -> Result<(), CallError> {
    let mut response = send_with_retries(request, who, read_timeout, deadline).await?;
    let status = response.status();
    if !status.is_success() {
        let detail = read_error_body(&mut response).await;
        run_log!(Warn, who.tag, "{}: answered {status}: {detail}", who.server);
        return Err(CallError::Status {
            status: status.as_u16(),
        });
    }
    let mut reader = EventReader::default();
    let mut finished = false;
    loop {
        let bytes = match response.chunk().await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => break,
            Err(err) => {
                let why = crate::redact::request_error(&err);
                run_log!(Warn, who.tag, "{}: the stream broke: {why}", who.server);
                return Err(if err.is_timeout() {
                    CallError::NoAnswer(read_timeout)
                } else {
                    CallError::Broken
                });
            }
        };
        for data in reader.feed(&bytes)? {
            if data.trim() == "[DONE]" {
                return Ok(());
            }
            let chunk = parse_event(&data, who)?;
            finished |= chunk.choices.iter().any(|c| c.finish_reason.is_some());
            if events.send(Upstream::Chunk(chunk)).await.is_err() {
                return Ok(()); // The run is gone.
            }
        }
    }
    for data in reader.finish()? {
        if data.trim() == "[DONE]" {
            return Ok(());
        }
        let chunk = parse_event(&data, who)?;
        finished |= chunk.choices.iter().any(|c| c.finish_reason.is_some());
        if events.send(Upstream::Chunk(chunk)).await.is_err() {
            return Ok(());
        }
    }
    if finished {
        Ok(())
    } else {
        run_log!(
            Warn,
            who.tag,
            "{}: the stream ended without [DONE] or a finish_reason",
            who.server
        );
        Err(CallError::EndedEarly)
    }
}

fn parse_event(data: &str, who: &Who) -> Result<StreamChunk, CallError> {
    let chunk: StreamChunk = serde_json::from_str(data).map_err(|err| {
        run_log!(Warn, who.tag, "{}: an unreadable event: {err}", who.server);
        CallError::Unreadable("not a chat-completion chunk")
    })?;
    if let Some(error) = &chunk.error {
        run_log!(
            Warn,
            who.tag,
            "{}: reported: {:.500}",
            who.server,
            error.to_string()
        );
        return Err(CallError::Reported);
    }
    Ok(chunk)
}

/// At most [`MAX_ERROR_BODY_BYTES`] of an error body, as text, for the log.
async fn read_error_body(response: &mut reqwest::Response) -> String {
    let mut body = Vec::new();
    while body.len() < MAX_ERROR_BODY_BYTES {
        match response.chunk().await {
            Ok(Some(bytes)) => body.extend_from_slice(&bytes),
            _ => break,
        }
    }
    body.truncate(MAX_ERROR_BODY_BYTES);
    String::from_utf8_lossy(&body).into_owned()
}

/// An SSE parser over bytes as they arrive: lines end at LF, CR or CRLF;
/// `data:` lines of an event are joined with LF; a blank line dispatches it;
/// comments and other fields are skipped. Each byte is looked at once (the
/// line end search starts where the last one stopped), and nothing longer
/// than [`MAX_LINE_BYTES`] is ever buffered.
#[derive(Default)]
pub struct EventReader {
    /// The current line, not yet ended.
    line: Vec<u8>,
    /// The current event's data.
    data: String,
    has_data: bool,
    /// The previous byte was a CR: a following LF belongs to it.
    after_cr: bool,
}

impl EventReader {
    /// Feeds bytes; returns the data of every event they complete.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<Vec<String>, CallError> {
        let mut events = Vec::new();
        if self.after_cr && bytes.first() == Some(&b'\n') {
            bytes = &bytes[1..];
        }
        self.after_cr = false;
        while let Some(end) = memchr::memchr2(b'\n', b'\r', bytes) {
            self.push_line_part(&bytes[..end])?;
            let line = std::mem::take(&mut self.line);
            if let Some(data) = self.end_line(&line)? {
                events.push(data);
            }
            let crlf = bytes[end] == b'\r' && bytes.get(end + 1) == Some(&b'\n');
            if bytes[end] == b'\r' && end + 1 == bytes.len() {
                self.after_cr = true;
            }
            bytes = &bytes[end + 1 + usize::from(crlf)..];
        }
        self.push_line_part(bytes)?;
        Ok(events)
    }

    /// The stream ended: a last line without its end counts, and an event
    /// without its blank line is dispatched (servers that close right after
    /// their last `data:` line are common).
    pub fn finish(mut self) -> Result<Vec<String>, CallError> {
        let mut events = Vec::new();
        let line = std::mem::take(&mut self.line);
        if !line.is_empty() {
            if let Some(data) = self.end_line(&line)? {
                events.push(data);
            }
        }
        if self.has_data {
            events.push(std::mem::take(&mut self.data));
        }
        Ok(events)
    }

    fn push_line_part(&mut self, part: &[u8]) -> Result<(), CallError> {
        if self.line.len() + part.len() > MAX_LINE_BYTES {
            return Err(CallError::LineTooLong);
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    /// Handles one complete line; returns an event's data on a blank line.
    fn end_line(&mut self, line: &[u8]) -> Result<Option<String>, CallError> {
        if line.is_empty() {
            if !self.has_data {
                return Ok(None);
            }
            self.has_data = false;
            return Ok(Some(std::mem::take(&mut self.data)));
        }
        let line = std::str::from_utf8(line).map_err(|_| CallError::Unreadable("not UTF-8"))?;
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line, ""),
        };
        if field == "data" {
            if self.data.len() + value.len() + 1 > MAX_LINE_BYTES {
                return Err(CallError::LineTooLong);
            }
            if self.has_data {
                self.data.push('\n');
            }
            self.data.push_str(value);
            self.has_data = true;
        }
        // Comments (an empty field name), `event`, `id`, `retry`: nothing to do.
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(pieces: &[&[u8]]) -> Result<Vec<String>, CallError> {
        let mut reader = EventReader::default();
        let mut out = Vec::new();
        for piece in pieces {
            out.extend(reader.feed(piece)?);
        }
        out.extend(reader.finish()?);
        Ok(out)
    }

    #[test]
    fn lines_end_at_lf_cr_or_crlf_even_split_across_pieces() {
        let got = events(&[
            b"data: a\r",
            b"\n\r\ndata:b\rdata: c\n",
            b"\n: ping\n\ndata: d",
        ]);
        assert_eq!(got.unwrap(), ["a", "b\nc", "d"]);
    }

    #[test]
    fn comments_and_other_fields_are_skipped() {
        let got = events(&[b": hi\nevent: x\nid: 3\nretry: 10\ndata: {}\n\n"]);
        assert_eq!(got.unwrap(), ["{}"]);
    }

    #[test]
    fn a_line_over_the_bound_fails_without_buffering_it() {
        let mut reader = EventReader::default();
        let piece = vec![b'a'; 64 * 1024];
        let mut result = Ok(Vec::new());
        for _ in 0..8 {
            result = reader.feed(&piece);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(result, Err(CallError::LineTooLong));
        assert!(reader.line.len() <= MAX_LINE_BYTES);
    }

    #[test]
    fn invalid_utf8_fails_at_its_line() {
        assert_eq!(
            events(&[b"data: \xff\xfe\n\n"]),
            Err(CallError::Unreadable("not UTF-8"))
        );
    }

    #[test]
    fn many_small_pieces_of_one_long_line_take_linear_time() {
        // 200,000 one-byte pieces: quadratic re-scanning would take seconds.
        let mut reader = EventReader::default();
        reader.feed(b"data: ").unwrap();
        for _ in 0..200_000 {
            assert!(reader.feed(b"x").unwrap().is_empty());
        }
        let done = reader.feed(b"\n\n").unwrap();
        assert_eq!(done[0].len(), 200_000);
    }
}
