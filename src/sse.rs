//! Server-Sent-Events framing: the only place that writes `id:`/`data:` lines.
//!
//! Every response of the chat endpoint, success or error, goes through
//! [`event_stream`] (a live run) or [`single_chunk`] (a one-chunk answer), so
//! both carry the same headers and framing.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::http::{header, StatusCode};
use actix_web::{HttpResponse, HttpResponseBuilder};
use bytes::Bytes;
use futures_util::Stream;
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};
use tokio_util::sync::DropGuard;

use crate::metrics::Metrics;
use crate::protocol::Chunk;

/// The SSE comment written while a stream is idle.
pub const KEEP_ALIVE_COMMENT: &[u8] = b": keep-alive\n\n";

/// Frames one chunk as `id: <sequence>\ndata: <json>\n\n`. serde_json escapes
/// every control character inside strings, so the JSON is always one line and
/// no message text can forge an extra event.
pub fn encode(chunk: &Chunk) -> Bytes {
    let mut buf = Vec::with_capacity(256 + chunk.chunk.len());
    // Writing into a Vec cannot fail, and a Chunk (string keys, plain values)
    // always serializes.
    write!(buf, "id: {}\ndata: ", chunk.sequence).expect("write to Vec");
    serde_json::to_writer(&mut buf, chunk).expect("Chunk serializes");
    buf.extend_from_slice(b"\n\n");
    Bytes::from(buf)
}

fn builder(status: StatusCode) -> HttpResponseBuilder {
    let mut builder = HttpResponse::build(status);
    builder
        .insert_header((header::CONTENT_TYPE, "text/event-stream; charset=utf-8"))
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .insert_header(("X-Accel-Buffering", "no"));
    builder
}

/// A complete stream of exactly one chunk (errors and reply acknowledgements).
pub fn single_chunk(status: StatusCode, chunk: &Chunk) -> HttpResponse {
    builder(status).body(encode(chunk))
}

/// A live stream fed by a run. Chunks travel boxed: a tokio channel
/// allocates its slots 32 at a time, so a slot the size of a pointer keeps
/// an idle (paused) stream's channel small. The stream ends when the run drops its sender
/// (right after the final chunk). When actix drops the stream because the
/// client is gone, `on_drop` fires and tells the run.
pub fn event_stream(
    chunk_rx: mpsc::Receiver<Box<Chunk>>,
    keep_alive: Duration,
    on_drop: DropGuard,
    metrics: Arc<Metrics>,
) -> HttpResponse {
    metrics.open_streams.inc();
    builder(StatusCode::OK).streaming(ChunkStream {
        chunk_rx,
        keep_alive,
        idle: Box::pin(tokio::time::sleep(keep_alive)),
        _on_drop: on_drop,
        opened: Some(std::time::Instant::now()),
        metrics,
    })
}

/// Chunks from the run, with a keep-alive comment after `keep_alive` of silence.
/// Writing the comment is also how a vanished client is noticed: the write
/// fails and actix drops this stream.
struct ChunkStream {
    chunk_rx: mpsc::Receiver<Box<Chunk>>,
    keep_alive: Duration,
    idle: Pin<Box<Sleep>>,
    _on_drop: DropGuard,
    /// Set until the first chunk is written, for the time-to-first-chunk metric.
    opened: Option<std::time::Instant>,
    metrics: Arc<Metrics>,
}

impl Drop for ChunkStream {
    fn drop(&mut self) {
        self.metrics.open_streams.dec();
    }
}

impl Stream for ChunkStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        match this.chunk_rx.poll_recv(cx) {
            Poll::Ready(Some(chunk)) => {
                if let Some(opened) = this.opened.take() {
                    this.metrics.first_chunk_after(opened.elapsed());
                }
                this.idle.as_mut().reset(Instant::now() + this.keep_alive);
                Poll::Ready(Some(Ok(encode(&chunk))))
            }
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => match this.idle.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.idle.as_mut().reset(Instant::now() + this.keep_alive);
                    Poll::Ready(Some(Ok(Bytes::from_static(KEEP_ALIVE_COMMENT))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ChunkType;

    #[test]
    fn a_chunk_is_one_id_line_and_one_data_line() {
        let chunk = Chunk::new(ChunkType::Content, "a\n\ndata: {\"x\":1}\r\n", "s", 7);

        let framed = String::from_utf8(encode(&chunk).to_vec()).unwrap();

        assert!(framed.starts_with("id: 7\ndata: {"), "{framed}");
        assert!(framed.ends_with("}\n\n"));
        assert_eq!(framed.matches('\n').count(), 3, "{framed}");
        assert!(!framed.contains('\r'));
        let json = framed.trim_end().strip_prefix("id: 7\ndata: ").unwrap();
        let back: Chunk = serde_json::from_str(json).unwrap();
        assert_eq!(back, chunk);
    }
}
